"""`python -m sim` is the same as the `sim5d` console script."""

from sim.cli import main

if __name__ == "__main__":
    main()
