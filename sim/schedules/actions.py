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

String forms: an action is PyTorch's ``_Action`` string ``<stage><kind><mb>``, e.g. ``3F7``
(torch.distributed.pipelining.schedules: F FORWARD, I BACKWARD_INPUT, W BACKWARD_WEIGHT,
B FULL_BACKWARD). An overlapped pair has two forms:

- torch's, used in schedule CSVs: ``(<F action>;<B action>)OVERLAP_F_B``, e.g.
  ``(0F7;7B3)OVERLAP_F_B`` (``_Action.__repr__`` of an action with ``sub_actions``, the form
  ``ScheduleDualPipeV`` builds and ``_Action.from_str`` reads back);
- sim5d's short form ``<F action>&<B action>``, e.g. ``0F7&7B3``: `str()` of an `Overlap`, used
  in ``sim5d schedule --json`` and on screen. Earlier sim5d CSV exports wrote pairs this way;
  torch cannot read it (``_Action.from_str`` keeps ``0F7`` and drops the rest), but
  `parse_action` still reads it as a legacy input, with the same meaning (the same pair).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

KINDS = ("F", "I", "W", "B")
"""Action kinds: forward, backward-input, backward-weight, full backward."""

KIND_NAMES = {"F": "forward", "I": "backward-input", "W": "backward-weight", "B": "backward"}

_ACTION_RE = re.compile(r"^\s*(\d+)\s*([FIWB])\s*(\d+)\s*$")

OVERLAP_F_B = "OVERLAP_F_B"
"""torch's computation type of an overlapped forward + backward (``_ComputationType.OVERLAP_F_B``)."""

# torch's container form: "(" sub-actions separated by ";" ")" computation type.
_TORCH_PAIR_RE = re.compile(r"^\s*\(([^()]*)\)\s*([A-Z_]*)\s*$")


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


def torch_str(item: Item) -> str:
    """`item` as torch.distributed.pipelining writes it in a schedule CSV: ``3F7``, or for an
    overlapped pair ``(0F7;7B3)OVERLAP_F_B`` (the forward first, as ScheduleDualPipeV)."""
    if isinstance(item, Overlap):
        return f"({item.forward};{item.backward}){OVERLAP_F_B}"
    return str(item)


def parse_action(text: str) -> Item:
    """Parse ``'3F7'``, torch's pair ``'(0F7;7B3)OVERLAP_F_B'`` or sim5d's short pair form
    ``'0F7&7B3'`` (the same pair). Raises ValueError naming the expected form."""
    m = _TORCH_PAIR_RE.match(str(text))
    if m:
        if m.group(2) != OVERLAP_F_B:
            raise ValueError(f"{text!r} is not an action: a parenthesised group of actions must "
                             f"be followed by {OVERLAP_F_B} (torch's overlapped forward+backward), "
                             f"got {m.group(2)!r}")
        subs = [s.strip() for s in m.group(1).split(";")]
        if len(subs) != 2 or not all(_ACTION_RE.match(s) for s in subs):
            raise ValueError(f"{text!r} is not an overlapped pair sim5d runs: expected exactly "
                             f"one forward and one full backward, (<stage>F<mb>;<stage>B<mb>)"
                             f"{OVERLAP_F_B}, e.g. (0F7;7B3){OVERLAP_F_B}")
        pieces = subs
    elif "(" in str(text) or ")" in str(text):
        raise ValueError(f"{text!r} is not an action; an overlapped pair is written "
                         f"(<F action>;<B action>){OVERLAP_F_B}, e.g. (0F7;7B3){OVERLAP_F_B}")
    else:
        pieces = str(text).split("&")
    if len(pieces) > 2:
        raise ValueError(f"{text!r} is not an action: at most two actions form an overlapped pair")
    parsed = []
    for piece in pieces:
        m = _ACTION_RE.match(piece)
        if not m:
            raise ValueError(f"{text!r} is not an action; expected <stage><F|I|W|B><microbatch> "
                             f"such as 3F7, or an overlapped pair such as (0F7;7B3){OVERLAP_F_B} "
                             "(or sim5d's short form 0F7&7B3)")
        parsed.append(Action(m.group(2), int(m.group(1)), int(m.group(3))))
    if len(parsed) == 1:
        return parsed[0]
    if parsed[0].kind != "F" or parsed[1].kind != "B":
        raise ValueError(f"{text!r} is not an overlapped pair sim5d runs: the pair is one forward "
                         f"then one full backward (F then B), e.g. (0F7;7B3){OVERLAP_F_B}")
    return Overlap(parsed[0], parsed[1])
