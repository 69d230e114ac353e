"""`sim5d validate`: the project's own comparison against measured training runs.

Data (copied into the package, sim/data/validation/): published_runs.yaml (Narayanan et al. 2021
Table 1; Qi et al. 2024 Zero Bubble Table 4; Korthikanti et al. 2022 Table 4 layer times),
vTrain's 1,549 measured A100 iterations (VIA-Research/vTrain, MIT licence: vtrain/LICENSE) and
h100_calibration.yaml (two H100 steps of NVIDIA/dgxc-benchmarking v25.02, the fit of the H100's
sustained_matmul_fraction: in sample, reported with each run's leave-one-out error) and
h100_published.yaml (ten other H100 steps of the same collection: FP8, Nemotron-4 340B, up to
2,048 GPUs; out of sample) and gb200_calibration.yaml (two GB200 NVL72 steps of
NVIDIA/dgxc-benchmarking v25.05.01, the fit of GB200's sustained_matmul_fraction, which the other
Blackwell profiles carry over: in sample, with leave-one-out errors) and bridge_moe.yaml (22 MoE
steps of Megatron-Bridge's performance summary on H100, GB200 and B200; out of sample).

Each set turns its rows into scenarios with the settings its source states (listed per set
below); nothing is tuned per case. Predicted vs measured, the error per case and the MAPE per
set are reported.
"""

from __future__ import annotations

import csv
import math
from itertools import chain
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import yaml

DATA = Path(__file__).resolve().parent / "data" / "validation"
SETS = ("korthikanti", "narayanan", "zero-bubble", "vtrain-single", "vtrain-multi", "h100-calibration",
        "h100-published", "gb200-calibration", "bridge-moe", "bridge-dense")
CALIBRATION_SETS = {"h100-calibration": "h100_calibration.yaml", "gb200-calibration": "gb200_calibration.yaml"}
"""Sets of measured steps a device constant is fitted to (sim.calibrate.step_fit): in sample."""
KORTHIKANTI_FIT_VARIANTS = ("baseline_no_recompute", "full_recompute", "selective_recompute")
"""Korthikanti et al.'s rows the A100's sustained_matmul_fraction is fitted to
(sim.calibrate.layer_fit); the sequence-parallel rows are held out."""


@dataclass(frozen=True)
class Case:
    set: str
    id: str
    scenario: dict
    measured_s: float
    what: str = "step_time_s"


def _published() -> dict:
    return yaml.safe_load((DATA / "published_runs.yaml").read_text())


def _megatron_vocab(vocab: int, tp: int, divisible_by: int = 128) -> int:
    """Megatron pads the vocabulary to a multiple of make-vocab-size-divisible-by x tp."""
    m = divisible_by * tp
    return int(math.ceil(vocab / m) * m)


def narayanan_cases() -> list[Case]:
    """Narayanan et al. 2021 Table 1 (Selene, DGX A100 + HDR): GPT presets, fp16, full
    recompute, Megatron's fused (not flash) softmax, interleaved 1F1B where the run script sets
    layers per virtual stage; iteration time derived from the published TFLOP/s with eq. 3.
    Gradient all-reduce as the script's --DDP-impl: `torch` (1.7B-18B: PyTorch DDP, bucketed and
    overlapped with the backward) or `local` (39B up: Megatron's own, after the backward)."""
    t = _published()["narayanan2021_table1"]
    cols = t["columns"]
    names = {1.7: "gpt-1.7b", 3.6: "gpt-3.6b", 7.5: "gpt-7.5b", 18.4: "gpt-18b", 39.1: "gpt-39b",
             76.1: "gpt-76b", 145.6: "gpt-145b", 310.1: "gpt-310b", 529.6: "gpt-530b", 1008.0: "gpt-1t"}
    out = []
    for row in t["rows"]:
        r = dict(zip(cols, row))
        par = {"tp": r["tp"], "pp": r["pp"], "dp": r["dp"]}
        if r["layers_per_virtual_stage"]:
            vpp = r["layers"] // (r["pp"] * r["layers_per_virtual_stage"])
            if vpp > 1:
                par.update(vpp=vpp, pipeline_schedule="interleaved-1f1b")
        out.append(Case("narayanan", names[r["params_b"]], {
            "name": f"narayanan-{names[r['params_b']]}",
            "model": names[r["params_b"]],
            "cluster": {"topology": "dgx-a100-hdr", "gpu": "a100-sxm-80gb"},
            "parallelism": par,
            "training": {"seq_length": 2048, "micro_batch_size": r["micro_batch"],
                         "global_batch_size": r["global_batch"], "recompute": "full", "precision": "fp16",
                         "attention_backend": "unfused", "overlap_grad_reduce": r["params_b"] < 39,
                         "tp_async_backward": False},
            "simulation": {"network": "analytical"}}, float(r["iteration_time_s_derived"])))
    return out


def zero_bubble_cases() -> list[Case]:
    """Qi et al. 2024 Tables 3-4: pure pipeline (pp = GPUs), first and last stage one layer
    fewer, GPT-2 vocabulary (50257, padded as Megatron), no recompute (not stated), fp16 on A100;
    measured samples per GPU per second -> step time = batch / (rate x GPUs). The interleaved
    column (one layer per chunk) is left out: with uneven end stages it is not a Megatron layout."""
    t = _published()["zero_bubble_table4"]
    cols = t["columns"]
    sched = {"zb_2p": "zb-h2", "zb_1p": "zb-h1", "one_f_one_b": "1f1b"}
    out = []
    for row in t["rows"]:
        r = dict(zip(cols, row))
        m = t["models"][r["model"]]
        pp, L = m["pp"], m["layers"]
        per = (L + 2) // pp
        batch = m["micro_batch"] * r["microbatches"]
        for col, name in sched.items():
            step = batch / (r[col] * pp)
            out.append(Case("zero-bubble", f"{r['model']}-m{r['microbatches']}-{name}", {
                "name": f"zb-{r['model']}-m{r['microbatches']}-{name}",
                "model": {"num_layers": L, "hidden_size": m["hidden"], "num_attention_heads": m["heads"],
                          "vocab_size": _megatron_vocab(50257, 1), "max_position_embeddings": m["seq_length"],
                          "hidden_dropout": 0.1, "attention_dropout": 0.1, "tie_embeddings": True},
                "cluster": {"topology": "dgx-a100-hdr", "gpu": "a100-sxm-80gb"},
                "parallelism": {"tp": 1, "pp": pp, "dp": 1, "pipeline_schedule": name,
                                "decoder_first_pipeline_num_layers": per - 1,
                                "decoder_last_pipeline_num_layers": per - 1},
                "training": {"seq_length": m["seq_length"], "micro_batch_size": m["micro_batch"],
                             "global_batch_size": batch, "recompute": "none", "precision": "fp16",
                             "attention_backend": "unfused"},
                "simulation": {"network": "analytical"}}, step))
    return out


def _vtrain_rows(name: str):
    with open(DATA / "vtrain" / name) as f:
        yield from csv.DictReader(f)


def vtrain_cases(which: str) -> list[Case]:
    """vTrain's measured iterations (Megatron-DeepSpeed on A100, 8 GPUs per node): GPT with FFN
    4h, MHA, GPT-2 vocabulary padded as Megatron, dropout 0.1, full activation checkpointing,
    1F1B, no gradient bucketing overlap, fp16, fused (not flash) softmax. The cluster is the one
    vTrain's validation configs state: 800 Gb/s of inter-node bandwidth per node, i.e. 4 HDR
    NICs (vtrain/topology.yaml; dgx-a100-hdr otherwise)."""
    fname = "ground_truth_single.csv" if which == "single" else "ground_truth_multi.csv"
    out = []
    for i, r in enumerate(_vtrain_rows(fname)):
        tp, dp, pp = int(r["tensor parallelism"]), int(r["data parallelism"]), int(r["pipeline parallelism"])
        seq = int(r["sequence length"])
        # the id names the row and its model and layout (vTrain's CSV has no names)
        cid = (f"{which}-{i} h{r['hidden size']} L{r['# layers']} s{seq} tp{tp} pp{pp} dp{dp} "
               f"mb{r['micro batch']} gb{r['global batch']}")
        out.append(Case(f"vtrain-{which}", cid, {
            "name": f"vtrain-{which}-{i}",
            "model": {"num_layers": int(r["# layers"]), "hidden_size": int(r["hidden size"]),
                      "num_attention_heads": int(r["attention heads"]),
                      "vocab_size": _megatron_vocab(50257, tp), "max_position_embeddings": seq,
                      "hidden_dropout": 0.1, "attention_dropout": 0.1, "tie_embeddings": True},
            "cluster": {"topology": str(DATA / "vtrain" / "topology.yaml"), "gpu": "a100-sxm-80gb"},
            "parallelism": {"tp": tp, "pp": pp, "dp": dp, "pipeline_schedule": "1f1b"},
            "training": {"seq_length": seq, "micro_batch_size": int(r["micro batch"]),
                         "global_batch_size": int(r["global batch"]), "recompute": "full",
                         "precision": "fp16", "attention_backend": "unfused", "overlap_grad_reduce": False},
            "simulation": {"network": "analytical"}}, float(r["iteration time (ms)"]) / 1e3))
    return out


def korthikanti_cases() -> list[Case]:
    """Korthikanti et al. 2022 Table 4: one GPT layer (h 6144, a 64, s 2048, b 4) at tp 8 on
    A100: forward and backward time of the layer including its TP collectives."""
    t = _published()["korthikanti2022_layer_times"]
    s = t["setup"]
    variants = {"baseline_no_recompute": ("none", False), "sequence_parallel": ("none", True),
                "full_recompute": ("full", False), "selective_recompute": ("selective", False),
                "selective_plus_sequence_parallel": ("selective", True)}
    out = []
    for case, fwd_ms, bwd_ms in t["rows"]:
        rec, sp = variants[case]
        sc = {"name": f"korthikanti-{case}",
              "model": {"num_layers": 1, "hidden_size": s["hidden"], "num_attention_heads": s["heads"],
                        "vocab_size": 51200, "hidden_dropout": 0.1, "attention_dropout": 0.1},
              "cluster": {"topology": "dgx-a100-hdr", "gpu": "a100-sxm-80gb"},
              "parallelism": {"tp": s["tp"], "pp": 1, "dp": 1, "sequence_parallel": sp},
              "training": {"seq_length": s["seq_length"], "micro_batch_size": s["micro_batch"],
                           "global_batch_size": s["micro_batch"], "recompute": rec, "precision": "fp16",
                           "attention_backend": "unfused"},
              "simulation": {"network": "analytical"}}
        out.append(Case("korthikanti", f"{case}-forward", sc, fwd_ms / 1e3, "layer_forward_s"))
        out.append(Case("korthikanti", f"{case}-backward", sc, bwd_ms / 1e3, "layer_backward_s"))
    return out


def _calibration_runs(set_name: str):
    from sim.calibrate.step_fit import load_runs

    return load_runs(DATA / CALIBRATION_SETS[set_name])


def calibration_cases(set_name: str) -> list[Case]:
    """The measured steps a device's sustained_matmul_fraction is fitted to, on the bundled
    profile of the runs' topology: h100_calibration.yaml (NVIDIA/dgxc-benchmarking v25.02, NeMo,
    h100-sxm-80gb) or gb200_calibration.yaml (v25.05.01, NeMo 2.0, gb200-186gb on gb200-nvl72);
    each file's `common:` holds the settings its header states. In sample."""
    return _step_cases(set_name, CALIBRATION_SETS[set_name])


def calibration_loo(set_name: str) -> dict:
    """{case id: leave-one-out error, %}: each run predicted by the fraction fitted to the others
    (sim.calibrate.step_fit, from the profile's value)."""
    from sim.calibrate.step_fit import loo_errors

    return loo_errors(_calibration_runs(set_name))


def h100_published_cases() -> list[Case]:
    """H100 steps of the same benchmark collection that nothing is fitted to (h100_published.yaml:
    the calibration recipes in FP8 and at 16x the GPUs, Nemotron-4 340B in BF16 and FP8), on
    the bundled h100-sxm-80gb profile: out of sample."""
    return _step_cases("h100-published", "h100_published.yaml")


def _step_cases(set_name: str, file: str) -> list[Case]:
    """The measured steps of a step-time set file (sim.calibrate.step_fit.load_runs), as cases."""
    from sim.calibrate.step_fit import load_runs

    return [Case(set_name, r.name, r.scenario, r.step_time_s) for r in load_runs(DATA / file)]


def bridge_moe_cases() -> list[Case]:
    """MoE steps of Megatron-Bridge's performance summary (bridge_moe.yaml: Qwen3-235B-A22B,
    DeepSeek-V3, Qwen3-30B-A3B, GPT-OSS-120B on H100, GB200 and B200, each with its recipe's
    layout and settings): out of sample."""
    return _step_cases("bridge-moe", "bridge_moe.yaml")


def bridge_dense_cases() -> list[Case]:
    """Dense steps of Megatron-Bridge's performance summary (bridge_dense.yaml: Llama 3 70B on 64
    and Llama 3.1 405B on 256 GB200 and GB300, FP8, MXFP8 and NVFP4, each with its recipe's
    layout): out of sample."""
    return _step_cases("bridge-dense", "bridge_dense.yaml")


LOO = {s: partial(calibration_loo, s) for s in CALIBRATION_SETS}
"""Sets whose cases were fitted to, with their leave-one-out errors."""


def cases(sets=SETS) -> list[Case]:
    out = []
    for s in sets:
        out += {"korthikanti": korthikanti_cases, "narayanan": narayanan_cases,
                "zero-bubble": zero_bubble_cases, "vtrain-single": lambda: vtrain_cases("single"),
                "vtrain-multi": lambda: vtrain_cases("multi"),
                **{c: partial(calibration_cases, c) for c in CALIBRATION_SETS},
                "h100-published": h100_published_cases, "bridge-moe": bridge_moe_cases,
                "bridge-dense": bridge_dense_cases}[s]()
    return out


def _layer_times(sc) -> dict:
    """Forward / backward time of decoder layer 0 with its exposed TP collectives (analytical)."""
    from sim.engine.costs import DeviceCostModel
    from sim.engine.core import CommSpec
    from sim.engine.netmodel import ClusterNetwork
    from sim.engine.program import _act_bytes

    c = DeviceCostModel(sc).layer(0)
    net = ClusterNetwork(sc)
    ranks = tuple(range(sc.parallelism.tp))
    size = _act_bytes(sc)
    blocks = (c.attn, c.mlp)
    overlap = sc.training.tp_async_backward   # program.py's _async_column_backward
    if sc.parallelism.sequence_parallel:
        ag = net.time_ns(CommSpec("all_gather", ranks, size, "tp"))
        rs = net.time_ns(CommSpec("reduce_scatter", ranks, size, "tp"))
        comm_f = 2 * (ag + rs)
        # per block: the output gradient's all-gather (blocking), the input re-gather and the
        # input gradient's reduce-scatter (under the column GEMM's dgrad / wgrad when async)
        comm_b = 2 * ag + (sum(max(0, ag - b["col_dgrad"]) + max(0, rs - b["col_wgrad"]) for b in blocks)
                           if overlap else 2 * (ag + rs))
    else:
        ar = net.time_ns(CommSpec("all_reduce", ranks, size, "tp"))
        comm_f = 2 * ar
        comm_b = sum(max(0, ar - b["col_wgrad"]) for b in blocks) if overlap else 2 * ar
    fwd = c.attn["fwd"] + c.mlp["fwd"] + comm_f
    bwd = sum(b["dgrad"] + b["wgrad"] + b["recompute"] for b in blocks) + comm_b
    if sc.training.recompute == "full":
        bwd += fwd
    return {"layer_forward_s": fwd / 1e9, "layer_backward_s": bwd / 1e9}


def predict(case: Case) -> float:
    from sim.config import build_scenario
    from sim.engine.simulate import simulate

    sc = build_scenario(case.scenario, default_name=case.id)
    if case.what == "step_time_s":
        return simulate(sc).makespan_ns / 1e9
    return _layer_times(sc)[case.what]


def fitted(case: Case) -> bool:
    """Whether a device constant was fitted to this case (the A100's sustained_matmul_fraction
    to Korthikanti's non-sequence-parallel rows, sim.calibrate.layer_fit; the H100's to the
    h100-calibration steps and GB200's to the gb200-calibration steps, sim.calibrate.step_fit):
    in-sample."""
    if case.set in CALIBRATION_SETS:
        return True
    return case.set == "korthikanti" and case.id.rsplit("-", 1)[0] in KORTHIKANTI_FIT_VARIANTS


def _work(case: Case) -> float:
    """A case's relative cost to simulate: instructions grow with microbatches x layers (a
    scenario that does not spell them out counts as large)."""
    if case.what != "step_time_s":
        return 0.0
    from sim.presets import get_preset

    d = case.scenario
    try:
        t, p, m = d["training"], d.get("parallelism", {}), d["model"]
        if isinstance(m, dict) and "preset" in m:
            m = m["preset"]
        layers = get_preset(m).num_layers if isinstance(m, str) else m["num_layers"]
        return t["global_batch_size"] / (t["micro_batch_size"] * p.get("dp", 1)) * layers
    except (KeyError, TypeError, ValueError, LookupError):
        return math.inf


def _predict_row(case: Case) -> dict:
    pred = predict(case)
    return {"set": case.set, "id": case.id, "what": case.what, "measured": case.measured_s,
            "predicted": pred, "error_pct": 100.0 * (pred - case.measured_s) / case.measured_s,
            "fitted": fitted(case)}


def _mape(rows) -> float | None:
    """Mean absolute error, %; None without rows (JSON null: a set whose every case was fitted
    has no held-out MAPE)."""
    return sum(abs(r["error_pct"]) for r in rows) / len(rows) if rows else None


def _mean_signed(rows) -> float | None:
    """Mean signed error, % (negative: sim5d predicts too short a time on average)."""
    return sum(r["error_pct"] for r in rows) / len(rows) if rows else None


def run(sets=SETS, *, workers: int = 1, progress=None, keep=None) -> dict:
    """Predict every case of `sets`; returns {"sets": {name: {"mape_pct", "mape_held_out_pct",
    "mean_signed_error_pct", "n", "n_fitted", "cases"}}} (held out: the cases no constant was fitted to). Sets of `LOO`
    also give each case's `loo_error_pct` and the set's `mape_loo_pct` (leave-one-out).
    `keep` (Case -> bool): only those cases, and each set's figures over them (sim.accuracy
    needs the cases its regimes pick, not the rest of their sets)."""
    todo = [c for c in cases(sets) if keep is None or keep(c)]
    rows = []
    loo: dict = {}
    if workers > 1 and len(todo) > 8:
        from concurrent.futures import ProcessPoolExecutor
        # the largest steps first, one per task, so that no worker is left with a 6 s case at
        # the end while the others idle (in list order, chunks of 8: 46 s on 2 workers)
        # (then the many small ones in chunks: a task costs ~1 ms of inter-process traffic)
        order = sorted(range(len(todo)), key=lambda i: -_work(todo[i]))
        big, small = order[:8 * workers], order[8 * workers:]
        rows = [None] * len(todo)
        with ProcessPoolExecutor(max_workers=workers) as ex:
            # the leave-one-out refits (several simulations each, 7 s) first, beside the cases
            futures = {s: ex.submit(LOO[s]) for s in sets if s in LOO}
            done = zip(big + small, chain(ex.map(_predict_row, [todo[i] for i in big], chunksize=1),
                                          ex.map(_predict_row, [todo[i] for i in small], chunksize=16)))
            for i, row in done:
                rows[i] = row
                if progress:
                    progress()
            loo = {s: f.result() for s, f in futures.items()}
    else:
        for c in todo:
            rows.append(_predict_row(c))
            if progress:
                progress()
    out = {}
    for s in sets:
        rs = [r for r in rows if r["set"] == s]
        held = [r for r in rs if not r["fitted"]]
        out[s] = {"cases": rs, "n": len(rs), "n_fitted": len(rs) - len(held),
                  "mape_pct": _mape(rs), "mape_held_out_pct": _mape(held),
                  "mean_signed_error_pct": _mean_signed(rs)}
        if s in LOO:
            errors = loo[s] if s in loo else LOO[s]()
            for r in rs:
                r["loo_error_pct"] = errors.get(r["id"])
            have = [abs(r["loo_error_pct"]) for r in rs if r["loo_error_pct"] is not None]
            out[s]["mape_loo_pct"] = sum(have) / len(have) if have else None
    return {"sets": out}
