"""Megatron-Core's pipeline layouts: which decoder layers, and where the embedding and the loss,
sit on each virtual pipeline stage.

A layout is a list of virtual stages in Megatron-Core's order: stage i = a x pp + b is the a-th
model chunk (vpp stage) of pipeline rank b (megatron/core/transformer/transformer_config.py,
`pipeline_model_parallel_layout`; PipelineParallelLayerLayout). This is also sim5d's interleaved
order (virtual stage s = chunk c x pp + rank r, on rank s % pp). Each stage is a list of items:
`E` (embedding), `t` (one decoder layer), `L` (the output layer and loss).

Megatron-Core accepts the layout as a list of lists (`[["embedding", "decoder"], ["decoder",
"loss"]]`; short names E / t / L too) or as a string: stages split by `|`, `X*N` repeats an item
and `(...)*N` a group (stage separators included), commas are cosmetic; e.g. DeepSeek-V3's
`Et*3|(tt|)*29,m|L`. sim5d runs the multi-token prediction modules (`model.mtp_num_layers`) on
the stage with the loss, so an `m` item is refused: set mtp_num_layers and leave `m` out.

`account_for_embedding_in_pipeline_split` / `account_for_loss_in_pipeline_split` (Megatron-Core)
count the embedding / loss as one layer in the even split: with both, num_layers + 2 items are
split evenly over pp x vpp virtual stages, so the first stage holds E and one decoder layer fewer
and the last one decoder layer fewer and L. Llama 3 405B (126 layers, pp 16, vpp 2) is the
example: 128 / 32 = 4 items per virtual stage, 7 decoder layers on the first and the last
pipeline rank, 8 on the others (Llama 3 paper, sec. 3.3.2).
"""

from __future__ import annotations

import re

ITEMS = {"E": "E", "embedding": "E", "t": "t", "decoder": "t", "L": "L", "loss": "L"}
MAX_EXPANDED_CHARS = 1_000_000   # a layout string expands to at most this many characters


class LayoutError(ValueError):
    """A layout that cannot be parsed or placed; the message states the rule."""


def _repeat(what: str, times: str) -> str:
    """`what` repeated `times` (digits) times, refused before it is made where it would pass
    MAX_EXPANDED_CHARS (Et*99999999999999999 had ended in a MemoryError, 10^20 in an OverflowError)."""
    n = int(times)
    if len(what) * n > MAX_EXPANDED_CHARS:
        raise LayoutError(f"repeats {what!r} {n:,} times: expands to more than {MAX_EXPANDED_CHARS:,} characters")
    return what * n


def _expand(text: str) -> str:
    """Expand `(group)*N` (innermost first) and `X*N` repetitions of a layout string."""
    group = re.compile(r"\(([^()]*)\)\s*\*\s*(\d+)")
    while True:
        new = group.sub(lambda m: _repeat(m.group(1), m.group(2)), text)
        if len(new) > MAX_EXPANDED_CHARS:
            raise LayoutError(f"expands to more than {MAX_EXPANDED_CHARS:,} characters")
        if new == text:
            break
        text = new
    if "(" in text or ")" in text:
        raise LayoutError("has an unbalanced '(' or ')', or a group without '*N' after it")
    out = re.sub(r"([A-Za-z])\s*\*\s*(\d+)", lambda m: _repeat(m.group(1), m.group(2)), text)
    if len(out) > MAX_EXPANDED_CHARS:
        raise LayoutError(f"expands to more than {MAX_EXPANDED_CHARS:,} characters")
    return out


def parse(value) -> list[list[str]]:
    """A layout (Megatron string or list of lists) as a list of stages of items E / t / L."""
    if isinstance(value, str):
        text = _expand(value.replace(",", "").replace(" ", ""))
        if "*" in text:
            raise LayoutError("has a '*' that follows neither an item nor a '(group)'")
        stages = []
        for part in text.split("|"):
            stage = []
            for ch in part:
                if ch == "m":
                    raise LayoutError("places an MTP layer ('m'); sim5d runs the multi-token prediction "
                                      "modules (model.mtp_num_layers) on the stage with the loss: "
                                      "leave 'm' out")
                if ch not in ("E", "t", "L"):
                    raise LayoutError(f"has {ch!r}; items are E (embedding), t (decoder layer), L (loss)")
                stage.append(ch)
            stages.append(stage)
        return stages
    if isinstance(value, (list, tuple)):
        stages = []
        for i, st in enumerate(value):
            if not isinstance(st, (list, tuple)):
                raise LayoutError(f"stage {i} ({st!r}) must be a list of items")
            stage = []
            for item in st:
                if item in ("m", "mtp"):
                    raise LayoutError(f"stage {i} places an MTP layer; sim5d runs the multi-token "
                                      "prediction modules (model.mtp_num_layers) on the stage with "
                                      "the loss: leave it out")
                if not isinstance(item, str) or item not in ITEMS:
                    raise LayoutError(f"stage {i} has {item!r}; items are embedding / E, decoder / t, loss / L")
                stage.append(ITEMS[item])
            stages.append(stage)
        return stages
    raise LayoutError(f"must be a string such as 'Et*3|(t*4|)*30,t*3L' or a list of lists of items "
                      f"(got {type(value).__name__})")


def check(stages: list[list[str]], num_layers: int, pp: int) -> None:
    """Megatron-Core's rules: stages a multiple of pp, every decoder layer placed once, the
    embedding alone at the start of the first stage and the loss at the end of the last."""
    n = len(stages)
    if n == 0 or n % pp:
        raise LayoutError(f"has {n} stages, which must be a positive multiple of "
                          f"pipeline_model_parallel_size ({pp}): pp x vpp stages")
    placed = sum(st.count("t") for st in stages)
    if placed != num_layers:
        raise LayoutError(f"places {placed} decoder layers; the model has num_layers = {num_layers}")
    flat = [(i, j, x) for i, st in enumerate(stages) for j, x in enumerate(st)]
    emb = [(i, j) for i, j, x in flat if x == "E"]
    loss = [(i, j) for i, j, x in flat if x == "L"]
    if emb != [(0, 0)]:
        raise LayoutError(f"must start its first stage with the embedding E, once (found E at stage/item "
                          f"{emb or 'nowhere'})")
    if loss != [(n - 1, len(stages[-1]) - 1)]:
        raise LayoutError(f"must end its last stage with the loss L, once (found L at stage/item "
                          f"{loss or 'nowhere'})")


def even_split(num_layers: int, pp: int, vpp: int, *, embedding: bool, loss: bool) -> list[list[str]]:
    """The layout of Megatron-Core's even split with the embedding and/or loss counted as a
    layer (account_for_*_in_pipeline_split); raises LayoutError when it does not divide."""
    items = num_layers + int(embedding) + int(loss)
    n = pp * vpp
    if items % n:
        what = " + ".join(["num_layers"] + (["1 (embedding)"] if embedding else []) + (["1 (loss)"] if loss else []))
        raise LayoutError(f"{what} = {items} must be divisible by pipeline_model_parallel_size x "
                          f"virtual_pipeline_model_parallel_size = {pp} x {vpp} = {n}")
    per = items // n
    stages = [["t"] * per for _ in range(n)]
    if embedding:
        stages[0] = ["E"] + ["t"] * (per - 1)
    else:
        stages[0] = ["E"] + stages[0]
    if loss:
        stages[-1] = stages[-1][:-1] + ["L"]
    else:
        stages[-1] = stages[-1] + ["L"]
    return stages


def to_string(stages: list[list[str]]) -> str:
    """A compact Megatron layout string: runs of decoder layers as t*N, stages joined by '|'."""
    def one(st):
        out, k = [], 0
        for x in st + ["$"]:
            if x == "t":
                k += 1
                continue
            if k:
                out.append("t" if k == 1 else f"t*{k}")
                k = 0
            if x != "$":
                out.append(x)
        return ",".join(out)

    return "|".join(one(st) for st in stages)
