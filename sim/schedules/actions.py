"""Schedule actions: what one pipeline rank computes, in PyTorch's string form.

An `Action` is one compute op of one (virtual) stage on one microbatch:

- ``F``: forward;
- ``B``: full backward (input and weight gradients together, as 1F1B runs it);
- ``I``: backward for the input only ("B" in the zero-bubble paper, ``BACKWARD_INPUT`` in
  torch.distributed.pipelining), which is all the previous stage waits for;
- ``W``: backward for the weights only, which nothing downstream waits for.

`Overlap` is DualPipe's overlapped pair: the forward of one chunk and the full backward of
another run on one rank at the same time, so that the communication of one hides behind the
computation of the other (DeepSeek-V3 report, sec. 3.2.1, fig. 4).

String forms (PyTorch's ``_Action`` plus the project's pair notation): ``<stage><kind><mb>``,
e.g. ``3F7``; an overlapped pair is ``<F action>&<B action>``, e.g. ``0F7&7B3``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

KINDS = ("F", "I", "W", "B")
"""Action kinds: forward, backward-input, backward-weight, full backward."""

KIND_NAMES = {"F": "forward", "I": "backward-input", "W": "backward-weight", "B": "backward"}

_ACTION_RE = re.compile(r"^\s*(\d+)\s*([FIWB])\s*(\d+)\s*$")


@dataclass(frozen=True)
class Action:
    """One compute op: `kind` (F, I, W or B) of global virtual stage `stage` on `microbatch`."""

    kind: str
    stage: int
    microbatch: int

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"action kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.stage < 0 or self.microbatch < 0:
            raise ValueError(f"action stage ({self.stage}) and microbatch ({self.microbatch}) "
                             "must be non-negative")

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @property
    def parts(self) -> tuple["Action", ...]:
        """The primitive actions this item consists of (itself)."""
        return (self,)


@dataclass(frozen=True)
class Overlap:
    """DualPipe's overlapped pair: `forward` (an F) and `backward` (a B) on one rank at once."""

    forward: Action
    backward: Action

    def __post_init__(self) -> None:
        if self.forward.kind != "F" or self.backward.kind != "B":
            raise ValueError(f"an overlapped pair is an F and a full B, got {self.forward}&{self.backward}")

    def __str__(self) -> str:
        return f"{self.forward}&{self.backward}"

    @property
    def parts(self) -> tuple[Action, Action]:
        """The two primitive actions, forward first."""
        return (self.forward, self.backward)


Item = Union[Action, Overlap]
"""One entry of a rank's action list: a single action or an overlapped F&B pair."""


def parse_action(text: str) -> Item:
    """Parse ``'3F7'`` or ``'0F7&7B3'``. Raises ValueError naming the expected form."""
    pieces = str(text).split("&")
    if len(pieces) > 2:
        raise ValueError(f"{text!r} is not an action: at most two actions form an overlapped pair")
    parsed = []
    for piece in pieces:
        m = _ACTION_RE.match(piece)
        if not m:
            raise ValueError(f"{text!r} is not an action; expected <stage><F|I|W|B><microbatch> "
                             "such as 3F7, or an overlapped pair such as 0F7&7B3")
        parsed.append(Action(m.group(2), int(m.group(1)), int(m.group(3))))
    if len(parsed) == 1:
        return parsed[0]
    return Overlap(parsed[0], parsed[1])
