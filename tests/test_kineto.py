"""`sim5d run`'s Kineto-style traces (traces/rank-N.json.gz, interfaces.md section 3): one per
simulated rank with distributedInfo and ProfilerStep#0, kernels exactly the engine's records, the
same bytes every run; and, where HolisticTraceAnalysis is installed, HTA's temporal breakdown and
communication/computation overlap equal to sim5d's own breakdown."""

from __future__ import annotations

import gzip
import json
import re
from decimal import Decimal

import pytest

from conftest import REPO, run_cli
from sim import api
from sim.engine import kineto
from engine_fakes import _length, _union

SCENARIO = REPO / "scenarios" / "llama3-8b-h100x16-1f1b.yaml"      # TP2 PP2 DP4: ranks 0 and 8 simulated


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(the run folder written as `sim5d run` writes it, the engine's result)."""
    out = tmp_path_factory.mktemp("kineto") / "run"
    return out, api.simulate(str(SCENARIO), out=out).run


def _load(path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def _us_to_ns(us: float) -> int:
    """A trace time back in ns, exactly (the file holds ns / 1000 as its shortest float)."""
    ns = Decimal(repr(us)) * 1000
    assert ns == ns.to_integral_value(), us
    return int(ns)


def test_one_trace_per_simulated_rank_with_its_distributed_info(run):
    out, res = run
    files = sorted(p.name for p in (out / "traces").iterdir())
    assert files == sorted(f"rank-{r}.json.gz" for r in res.pp_rank_of) == ["rank-0.json.gz", "rank-8.json.gz"]
    for rank in res.pp_rank_of:
        raw = gzip.decompress((out / "traces" / f"rank-{rank}.json.gz").read_bytes()).decode()
        trace = json.loads(raw)
        assert trace["distributedInfo"] == {"backend": "nccl", "rank": rank, "world_size": 16}
        # HTA 0.5.0 finds a file's rank with this regex (hta/common/trace_file.py)
        assert int(re.search(r'"rank":\s+(\d+)', raw).group(1)) == rank
        props = trace["deviceProperties"][0]
        assert props["id"] == res.layout.local_gpu_of(rank) and props["name"] == "h100-sxm-80gb"
        assert props["numSms"] == 132 and props["totalGlobalMem"] > 80e9


def test_kernels_are_the_records_inside_the_profiler_step(run):
    """Every non-empty record is one kernel, at its exact ns times, inside ProfilerStep#0
    ([0, step]), on a stream where kernels do not overlap, launched by one cudaLaunchKernel with
    its correlation id at or before its start; communication kernels carry NCCL names (HTA: names
    matching ^nccl.*Kernel are communication; Memcpy/Memset/Sync/dma ones are not computation)."""
    out, res = run
    for rank in res.pp_rank_of:
        ev = _load(out / "traces" / f"rank-{rank}.json.gz")["traceEvents"]
        (step,) = [e for e in ev if e["name"].startswith("ProfilerStep")]
        assert step["name"] == "ProfilerStep#0" and step["ts"] == 0
        assert _us_to_ns(step["dur"]) == res.makespan_ns
        kernels = [e for e in ev if e.get("cat") == "kernel"]
        launches = {e["args"]["correlation"]: e for e in ev if e["name"] == "cudaLaunchKernel"}
        assert len(launches) == len(kernels) == len({e["args"]["correlation"] for e in kernels})
        got, lanes = [], {}
        for e in kernels:
            start, dur = _us_to_ns(e["ts"]), _us_to_ns(e["dur"])
            assert 0 <= start and start + dur <= res.makespan_ns and dur > 0
            assert e["pid"] == e["args"]["device"] == res.layout.local_gpu_of(rank)
            assert e["tid"] == e["args"]["stream"] >= 0
            launch = launches[e["args"]["correlation"]]
            assert 0 <= launch["ts"] <= e["ts"] and launch["args"]["cbid"] == 211
            lanes.setdefault(e["tid"], []).append((start, start + dur))
            comm = "sim5d_name" in e["args"]
            name = e["args"]["sim5d_name"] if comm else e["name"]
            if comm:
                assert e["name"].startswith("ncclDevKernel_")
            else:
                assert not re.search(r"nccl|Memcpy|Memset|Sync|^dma", e["name"]), e["name"]
            got.append((name, start, start + dur))
        want = [(r.name, r.start_ns, r.end_ns) for r in res.records
                if r.rank == rank and r.stream != "mark" and r.end_ns > r.start_ns]
        assert sorted(got) == sorted(want)
        for ivs in lanes.values():
            ivs.sort()
            assert all(a[1] <= b[0] for a, b in zip(ivs, ivs[1:]))


def test_nccl_kernel_names():
    assert kineto.nccl_kernel("F L3 attn all-gather", "compute", 1) == "ncclDevKernel_AllGather"
    assert kineto.nccl_kernel("B L3 mlp mb0 grad reduce-scatter", "tp", 1) == "ncclDevKernel_ReduceScatter_Sum"
    assert kineto.nccl_kernel("F L3 attn all_reduce", "compute", 0) == "ncclDevKernel_AllReduce_Sum"
    assert kineto.nccl_kernel("grad reduce L3", "dp", 1) == "ncclDevKernel_ReduceScatter_Sum"
    assert kineto.nccl_kernel("grad reduce L3", "dp", 0) == "ncclDevKernel_AllReduce_Sum"
    for name, stream in (("send act s1 mb0", "pp"), ("F L2 dispatch", "compute"), ("F L2 kv ring step 1", "cp")):
        assert kineto.nccl_kernel(name, stream, 1) == "ncclDevKernel_SendRecv"


def test_same_bytes_every_run_and_an_earlier_runs_files_replaced(run, tmp_path):
    """`sim5d run` (a second simulation) gives byte-identical traces; a file of a rank the run
    does not simulate, left in the folder by an earlier run, is removed."""
    out, _ = run
    again = tmp_path / "again"
    (again / "traces").mkdir(parents=True)
    (again / "traces" / "rank-5.json.gz").write_bytes(b"stale")
    code, _, err = run_cli("run", str(SCENARIO), "--out", str(again), "--json")
    assert code == 0, err
    names = sorted(p.name for p in (out / "traces").iterdir())
    assert sorted(p.name for p in (again / "traces").iterdir()) == names
    for name in names:
        assert (again / "traces" / name).read_bytes() == (out / "traces" / name).read_bytes(), name


def _sim5d_expected(res) -> dict:
    """{rank: what HTA's get_temporal_breakdown and get_comm_comp_overlap should say}, from
    sim5d's breakdown. HTA's window is its first kernel's start to its last kernel's end (sim5d's
    the whole step); its compute time is sim5d's compute, its non-compute time (communication
    kernels with no computation) sim5d's exposed communication, its idle time sim5d's bubble less
    the part before the first and after the last kernel; its overlap is the share of the
    communication time (the union of its kernels) that has computation under it."""
    want = {}
    for rank, b in res.breakdowns.items():
        recs = [r for r in res.records if r.rank == rank and r.stream != "mark" and r.end_ns > r.start_ns]
        first, last = min(r.start_ns for r in recs), max(r.end_ns for r in recs)
        comm = _length(_union((r.start_ns, r.end_ns) for r in recs
                              if r.stream != "compute" or r.cat.startswith("comm:")))
        want[rank] = {"compute_time(us)": b.compute_ns / 1000, "non_compute_time(us)": b.exposed_comm_ns / 1000,
                      "idle_time(us)": (b.bubble_ns - first - (b.makespan_ns - last)) / 1000,
                      "kernel_time(us)": (last - first) / 1000,
                      "comp_comm_overlap_pctg": 100 * (comm - b.exposed_comm_ns) / comm}
    return want


@pytest.mark.filterwarnings("ignore:The inplace keyword")       # HTA 0.5.0 under pandas >= 3.1
@pytest.mark.parametrize("rounding", [False, True], ids=["ns", "hta-rounds-to-us"])
def test_hta_breakdown_and_overlap_match_sim5d(run, monkeypatch, rounding):
    """HTA's numbers from the traces against sim5d's. With HTA_DISABLE_NS_ROUNDING=1 they agree
    to the nanosecond; with HTA's default inward rounding of fractional microseconds, within 1%
    of the rank's kernel time (and 1 point of overlap)."""
    pytest.importorskip("hta.trace_analysis")     # HolisticTraceAnalysis (0.5.0 also needs psutil)
    from hta.trace_analysis import TraceAnalysis

    out, res = run
    if rounding:
        monkeypatch.delenv("HTA_DISABLE_NS_ROUNDING", raising=False)
    else:
        monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    ta = TraceAnalysis(trace_dir=str(out / "traces"))
    assert ta.get_profiler_steps() == [0]
    hta = ta.get_temporal_breakdown(visualize=False).set_index("rank").join(
        ta.get_comm_comp_overlap(visualize=False).set_index("rank"))
    want = _sim5d_expected(res)
    assert sorted(hta.index) == sorted(want)
    print(f"\n{'rank':>4} {'metric':24} {'sim5d':>14} {'HTA':>14}")
    for rank, exp in sorted(want.items()):
        span = exp["kernel_time(us)"]
        for key, value in exp.items():
            got = float(hta.loc[rank, key])
            print(f"{rank:>4} {key:24} {value:14.3f} {got:14.3f}")
            if key == "comp_comm_overlap_pctg":
                assert got == pytest.approx(value, abs=1.0 if rounding else 0.006)
            elif rounding:
                assert abs(got - value) <= 0.01 * span, key
            else:
                assert got == pytest.approx(value, rel=1e-9, abs=1e-3), key


@pytest.mark.parametrize("name", ["llama3-8b-h100x16-1f1b", "mixtral-8x7b-h100x64-dualpipe",
                                  "llama3-8b-h100x64-cp4-32k", "gpt3-175b-a100x64"])
def test_traces_written_as_text_are_json_dumps_of_the_trace(name):
    """write_traces writes each rank's trace as text (kineto.rank_trace_json); the truth is
    json.dumps of the trace as a dict (kineto.rank_trace): the same bytes, on steps with MoE
    all-to-alls, CP ring steps, a DP ZeRO-1 step and a 64-GPU GPT-3 step."""
    from sim.config import load_scenario
    from sim.engine.simulate import simulate

    res = simulate(load_scenario(name))
    props = {"name": "GPU \"x\" \u00e9", "totalGlobalMem": 1 << 36, "numSms": 132}  # escapes too
    by_rank: dict = {}
    for r in res.records:
        by_rank.setdefault(r.rank, []).append(r)
    assert by_rank
    for rank, recs in by_rank.items():
        kw = dict(world_size=res.layout.world_size, device=res.layout.local_gpu_of(rank),
                  label=f"rank {rank} \u00b5", makespan_ns=res.makespan_ns,
                  zero_stage=res.scenario.parallelism.zero_stage, device_props=props)
        text, want = kineto.rank_trace_json(recs, rank, **kw), json.dumps(kineto.rank_trace(recs, rank, **kw))
        if text != want:                 # (a short message: pytest's diff of 10 MB strings never ends)
            i = next((i for i, (a, b) in enumerate(zip(text, want)) if a != b), min(len(text), len(want)))
            pytest.fail(f"rank {rank}: differs at {i}: {text[i - 80:i + 80]!r} vs {want[i - 80:i + 80]!r}")
        assert len(json.loads(text)["traceEvents"]) > 100
