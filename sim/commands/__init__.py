"""One module per CLI command; each exposes register(app)."""


HELD: list = []
"""Objects a command has finished with but leaves to the end of the process (`sim5d run`'s step
result: on Narayanan's 1T row a million records and the engine's state, 0.3 s of Python freeing
them one by one). The console script exits without freeing anything (sim.cli.console_main,
os._exit); `sim.cli.main`, called in-process by tests and scripts, empties the list when the
command returns."""
