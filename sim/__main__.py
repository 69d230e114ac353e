"""`python -m sim` is the same as the `sim5d` console script."""

from sim.cli import console_main

if __name__ == "__main__":
    console_main()
