"""sim5d: a discrete-event simulator of one step of distributed LLM training (5D parallelism)."""

__version__ = "0.1.0"
