"""'Did you mean' suggestions for misspelt keys and names."""

from __future__ import annotations

import difflib


def did_you_mean(word: str, choices) -> str:
    """' (did you mean 'x'?)' for the closest choice, or '' when nothing is close."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
