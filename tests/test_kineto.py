"""`sim5d run`'s Kineto traces (traces/rank-N.json.gz, interfaces.md section 3): one per traced
rank, as PyTorch's profiler writes a real step -- kernels exactly the engine's records under
stable names (layer, microbatch and phase in args), a host thread with the op and the
cudaLaunchKernel of each kernel, ac2g flows, the stream waits the engine's dependencies are, and
NCCL receive kernels where a stage waits for its input -- and, where HolisticTraceAnalysis is
installed, HTA's breakdown, overlap, critical path, ATen-op, launch and straggler analyses
against sim5d's own numbers, computed here from the engine's records."""

from __future__ import annotations

import bisect
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
MIXTRAL = REPO / "scenarios" / "mixtral-8x7b-h100x64-dualpipe.yaml"  # EP all-to-alls, DualPipe both ways


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(the run folder written as `sim5d run` writes it, the engine's result)."""
    out = tmp_path_factory.mktemp("kineto") / "run"
    return out, api.simulate(str(SCENARIO), out=out).run


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    out = tmp_path_factory.mktemp("kineto-mixtral") / "run"
    return out, api.simulate(str(MIXTRAL), out=out).run


def _load(path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def _events(path) -> tuple:
    """(a trace's events, where the step's 0 is in it: sim5d.step_start_ns, a whole millisecond
    after the host's first launch, as Perfetto refuses negative times)."""
    trace = _load(path)
    off = trace["sim5d"]["step_start_ns"]
    assert off >= 0 and off % 1_000_000 == 0
    return trace["traceEvents"], off


def _ns(us: float) -> int:
    """A trace time back in ns, exactly (the file holds ns / 1000 as its shortest float)."""
    ns = Decimal(repr(us)) * 1000
    assert ns == ns.to_integral_value(), us
    return int(ns)


def _kernels_of(res, rank) -> list:
    return [r for r in res.records if r.rank == rank and r.stream != "mark" and r.end_ns > r.start_ns]


def _receive_waits(res, rank) -> list:
    """[(start, end)] of the receives `rank` waited for, from the engine's p2p log: posted when
    its compute stream reached the receive (its last kernel's end before the data was consumed;
    after an earlier receive of the same wait), ended when the data arrived (`consumed_ns`)."""
    ends = sorted(r.end_ns for r in _kernels_of(res, rank) if r.stream == "compute")
    out, last = [], 0
    for info in sorted((i for i in res.p2p.values() if i.get("dst") == rank), key=lambda i: i["consumed_ns"]):
        t = info["consumed_ns"]
        posted = max([e for e in ends if e <= t] + [0, last])
        if t > posted:
            out.append((posted, t))
            last = t
    return out


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


@pytest.mark.parametrize("which", ["run", "mixtral"])
def test_kernels_are_the_records_under_stable_names(which, request):
    """Every non-empty record is one kernel at its exact ns times, with its name in
    args.sim5d_name; the kernel's own name is the record's without its numbers (a handful of
    names, not one per layer and microbatch) and args hold the layer, microbatch and phase the
    record's name gives; NCCL names for communication (HTA: ^nccl.*Kernel); the extra kernels are
    exactly the receives the engine's p2p log says the rank waited for; kernels on one stream
    never overlap."""
    out, res = request.getfixturevalue(which)
    phases = {"F": "forward", "B": "backward", "I": "input-grad", "W": "weight-grad", "R": "recompute"}
    for rank in res.pp_rank_of:
        ev, off = _events(out / "traces" / f"rank-{rank}.json.gz")
        kernels = [e for e in ev if e.get("cat") == "kernel"]
        got, recv, lanes = [], [], {}
        for e in kernels:
            a, start = e["args"], _ns(e["ts"]) - off
            end = start + _ns(e["dur"])
            lanes.setdefault(e["tid"], []).append((start, end))
            assert e["pid"] == a["device"] == res.layout.local_gpu_of(rank) and e["tid"] == a["stream"]
            name = a["sim5d_name"]
            if name.startswith("recv "):
                assert e["name"] == "ncclKernel_SendRecv"
                recv.append((start, end))
                continue
            got.append((name, start, end))
            words = name.split()
            if words[0] in phases:
                assert a["phase"] == phases[words[0]]
            for key, prefix in (("layer", "L"), ("microbatch", "mb")):
                nums = [int(w[len(prefix):]) for w in words if re.fullmatch(prefix + r"\d+", w)]
                assert a.get(key) == (nums[0] if nums else None), (name, key)
            if e["name"].startswith("nccl"):
                assert re.fullmatch(r"ncclKernel_(AllGather|ReduceScatter_Sum|AllReduce_Sum|SendRecv|Generic)", e["name"])
            else:
                assert e["name"] == " ".join(w for w in words if not re.fullmatch(r"(L|mb|s)?\d+", w))
        want = [(r.name, r.start_ns, r.end_ns) for r in _kernels_of(res, rank)]
        assert sorted(got) == sorted(want)
        assert sorted(recv) == _receive_waits(res, rank)
        names = {e["name"] for e in kernels}
        assert len(names) <= 25 < len({n for n, _, _ in got}), sorted(names)
        for ivs in lanes.values():
            ivs.sort()
            assert all(a[1] <= b[0] for a, b in zip(ivs, ivs[1:]))


def test_nccl_kernels_carry_kinetos_collective_args(run):
    """Each NCCL kernel has Kineto's collective args (PyTorch's record_param_comms): the
    collective's name, element counts in and out, group size and dtype, consistent with the
    call's bytes and group (sim.engine.slice_args); a receive's counts are its sender's send:
    one microbatch's activations, micro_batch x seq x hidden / tp elements with sequence
    parallelism (Korthikanti et al. 2022), from the scenario by hand; compute kernels carry
    their FLOPs instead."""
    out, res = run
    sc = res.scenario
    act = sc.training.micro_batch_size * sc.training.seq_length * sc.model.hidden_size // sc.parallelism.tp
    names = {"all_gather": "_allgather_base", "reduce_scatter": "_reduce_scatter_base", "all_reduce": "allreduce"}
    seen = set()
    for rank in res.pp_rank_of:
        for e in _load(out / "traces" / f"rank-{rank}.json.gz")["traceEvents"]:
            if e.get("cat") != "kernel":
                continue
            a = e["args"]
            if not e["name"].startswith("nccl"):
                assert a["flops"] >= 0 and "Collective name" not in a
                continue
            assert a["dtype"] == "BFloat16" and a["Group size"] >= 2
            if a["sim5d_name"].startswith(("recv", "send")):
                assert a["In msg nelems"] == a["Out msg nelems"] == act and a["Group size"] == 2
                assert a["Collective name"] == a["sim5d_name"].split()[0]
            else:
                n = a["bytes"] // 2
                want = {"all_gather": (n // a["group_size"], n), "reduce_scatter": (n, n // a["group_size"])}
                assert (a["In msg nelems"], a["Out msg nelems"]) == want.get(a["op"], (n, n))
                assert a["Group size"] == a["group_size"] == len(a["group"].split(","))
                assert a["Collective name"] == names[a["op"]]
            seen.add(a["Collective name"])
    assert seen == {"recv", "send", "_allgather_base", "_reduce_scatter_base"}


def test_the_host_launches_each_kernel_in_its_op_before_it_runs(run):
    """Each kernel has one cudaLaunchKernel (same correlation, an ac2g flow from it to the
    kernel), inside a cpu_op of the host thread, ending at or before the kernel's start; the
    host's ops follow one another without overlap, inside ProfilerStep#1, which ends at the
    step's end with the host waiting for the device; compute kernels are launched just as the
    GPU reaches them (sim5d's host model: a run's host issue starts with the run)."""
    out, res = run
    for rank in res.pp_rank_of:
        ev, off = _events(out / "traces" / f"rank-{rank}.json.gz")
        assert min(e["ts"] for e in ev if "ts" in e) >= 0 and off > 0      # launches before the first kernel
        kernels = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "kernel"}
        launches = {e["args"]["correlation"]: e for e in ev if e.get("name") == "cudaLaunchKernel"}
        assert launches.keys() == kernels.keys()
        flows = {(e["ph"], e["id"]): e for e in ev if e.get("cat") == "ac2g"}
        ops = sorted((e for e in ev if e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
        assert len(ops) == len(kernels)
        assert all(_ns(a["ts"]) + _ns(a["dur"]) <= _ns(b["ts"]) for a, b in zip(ops, ops[1:]))
        (step,) = [e for e in ev if e["name"].startswith("ProfilerStep")]
        assert step["name"] == "ProfilerStep#1" and step["ts"] == ops[0]["ts"] <= off / 1000
        assert _ns(step["ts"]) + _ns(step["dur"]) == res.makespan_ns + off
        (sync,) = [e for e in ev if e.get("name") == "cudaDeviceSynchronize"]
        assert _ns(sync["ts"]) + _ns(sync["dur"]) == res.makespan_ns + off
        op_starts = [_ns(o["ts"]) for o in ops]         # (disjoint and sorted: checked above)
        prompt = 0
        for corr, k in kernels.items():
            launch = launches[corr]
            l0, l1 = _ns(launch["ts"]), _ns(launch["ts"]) + _ns(launch["dur"])
            assert l1 <= _ns(k["ts"]) and launch["args"]["cbid"] == 211
            assert flows[("s", corr)]["ts"] == launch["ts"] and flows[("f", corr)]["ts"] == k["ts"]
            op = ops[bisect.bisect_right(op_starts, l0) - 1]        # the op that starts last at or before it
            assert _ns(op["ts"]) <= l0 and l1 <= _ns(op["ts"]) + _ns(op["dur"])
            assert op["args"]["External id"] == launch["args"]["External id"] == k["args"]["External id"]
            if k["tid"] == kineto.STREAMS["compute"] and not k["name"].startswith("nccl"):
                assert op["name"].startswith("aten::")
                prompt += l1 == _ns(k["ts"])
            else:
                assert op["name"].startswith("c10d::")
        n_compute = sum(1 for k in kernels.values() if k["tid"] == kineto.STREAMS["compute"]
                        and not k["name"].startswith("nccl"))
        assert prompt >= 0.99 * n_compute


def test_stream_waits_are_the_engines_dependencies(run, mixtral):
    """A compute kernel that starts after its stream went idle waited for something: the trace
    has a Stream Wait Event on its stream whose recorded event (wait_on_cuda_event_record_corr_id,
    a cudaEventRecord right after a launch) belongs to the kernel that ended exactly at its start
    -- a receive or a communication call, as the engine ran it; and every communication kernel
    waits for the compute stream's work before it (ProcessGroupNCCL's syncStream)."""
    for out, res in (run, mixtral):
        for rank in res.pp_rank_of:
            ev = _load(out / "traces" / f"rank-{rank}.json.gz")["traceEvents"]
            host = sorted((e for e in ev if e.get("cat") == "cuda_runtime"), key=lambda e: e["ts"])
            kernels = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "kernel"}
            # an event record's correlation -> the kernel launched last before it on each stream (the
            # recorded stream is the one its waiter names, wait_on_stream: HTA's find_previous_launch)
            launched_before: dict = {}
            last: dict = {}
            for e in host:
                if e["name"] == "cudaLaunchKernel":
                    k = kernels[e["args"]["correlation"]]
                    last[k["tid"]] = k
                elif e["name"] == "cudaEventRecord":
                    launched_before[e["args"]["correlation"]] = dict(last)
            waits = [e for e in ev if e.get("name") == "Stream Wait Event"]
            assert waits and all(e["cat"] == "cuda_sync" for e in waits)
            compute = sorted((k for k in kernels.values() if k["tid"] == kineto.STREAMS["compute"]),
                             key=lambda k: k["ts"])
            # the kernel each wait precedes: the next launch after the cudaStreamWaitEvent
            order = {e["args"]["correlation"]: i for i, e in enumerate(host)}
            after = {}
            for w in waits:
                i = order[w["args"]["correlation"]]
                nxt = next(h for h in host[i:] if h["name"] == "cudaLaunchKernel")
                before = launched_before[w["args"]["wait_on_cuda_event_record_corr_id"]]
                after[nxt["args"]["correlation"]] = before[w["args"]["wait_on_stream"]]
            gaps = 0
            for prev, k in zip(compute, compute[1:]):
                if _ns(k["ts"]) > _ns(prev["ts"]) + _ns(prev["dur"]):
                    gaps += 1
                    src = after[k["args"]["correlation"]]
                    assert _ns(src["ts"]) + _ns(src["dur"]) == _ns(k["ts"]), (k["args"]["sim5d_name"], src)
            for k in kernels.values():
                if k["tid"] != kineto.STREAMS["compute"] and any(
                        _ns(c["ts"]) + _ns(c["dur"]) <= _ns(k["ts"]) for c in compute):
                    src = after[k["args"]["correlation"]]
                    assert src["tid"] == kineto.STREAMS["compute"] and _ns(src["ts"]) + _ns(src["dur"]) <= _ns(k["ts"])
            assert gaps > 0


def test_receives_are_posted_after_the_kernel_before_and_told_apart_by_key_on_ties():
    """kineto._receives by hand: a receive runs from the end of the rank's kernel before its
    consumption (or from the previous receive's arrival, for two in one wait) to the
    consumption; receives consumed at one time come in the order of their keys' text (not the
    log's); one that would end as it is posted, or was never consumed, is left out."""
    from sim.engine.core import Record

    comp = [Record(0, "compute", "F L0 mb0", "compute", 0, 100), Record(0, "compute", "F L0 mb1", "compute", 300, 400)]
    p2p = {("grad", 1, 5, 0): {"consumed_ns": 300}, ("act", 1, 7, 0): {"consumed_ns": 300},
           ("act", 1, 6, 0): {"consumed_ns": 250}, ("act", 1, 9, 0): {"consumed_ns": 50},
           ("act", 1, 8, 0): {"src": 1}}
    got = [(r.name, r.start_ns, r.end_ns) for r in kineto._receives(comp, p2p, 0, Record)]
    # mb9 before any kernel ended: posted at 0; at 300 "('act', ..." sorts before "('grad', ...", and
    # the grad, posted when mb7 arrives, would end as it is posted
    assert got == [("recv act s1 mb9", 0, 50), ("recv act s1 mb6", 100, 250), ("recv act s1 mb7", 250, 300)]
    p2p[("grad", 1, 5, 0)]["consumed_ns"] = 320
    got = [(r.name, r.start_ns, r.end_ns) for r in kineto._receives(comp, p2p, 0, Record)]
    assert got[2:] == [("recv act s1 mb7", 250, 300), ("recv grad s1 mb5", 300, 320)]


def test_nccl_kernel_names():
    assert kineto.nccl_kernel("F L3 attn all-gather", "compute", 1) == "ncclKernel_AllGather"
    assert kineto.nccl_kernel("B L3 mlp mb0 grad reduce-scatter", "tp", 1) == "ncclKernel_ReduceScatter_Sum"
    assert kineto.nccl_kernel("F L3 attn all_reduce", "compute", 0) == "ncclKernel_AllReduce_Sum"
    assert kineto.nccl_kernel("grad reduce L3", "dp", 1) == "ncclKernel_ReduceScatter_Sum"
    assert kineto.nccl_kernel("grad reduce L3", "dp", 0) == "ncclKernel_AllReduce_Sum"
    for name, stream in (("send act s1 mb0", "pp"), ("F L2 dispatch", "compute"), ("F L2 kv ring step 1", "cp"),
                         ("recv act s1 mb0", "pp-recv")):
        assert kineto.nccl_kernel(name, stream, 1) == "ncclKernel_SendRecv"


def test_kernel_kinds_by_hand():
    assert kineto.kernel_kind("F L15 mlp mb7") == "F mlp"
    assert kineto.kernel_kind("B L3 attn mb0 column dgrad") == "B attn column dgrad"
    assert kineto.kernel_kind("send act s1 mb4") == "send act"
    assert kineto.kernel_kind("param all-gather chunk 2") == "param all-gather chunk"
    assert kineto.kernel_kind("F L2 kv ring step 1") == "F kv ring step"
    assert kineto.kernel_kind("F mtp0 head+loss mb3") == "F mtp0 head+loss"
    assert kineto.kernel_kind("optimizer step") == "optimizer step"
    assert kineto.aten_op("B mlp wgrad", "backward") == "aten::mm"
    assert kineto.aten_op("F embedding", "forward") == "aten::embedding"


def test_kernel_and_op_names_looked_up_by_name_without_microbatch_are_the_templates():
    """_Kinds.of remembers a record's names by its name without the microbatch number: for
    every record it equals the template lookup (_of, a fresh _Kinds per record), including
    names whose "mb" word is not a number, names that differ only in it, and streams and
    categories that make the same name a kernel or a collective."""
    from sim.engine.core import Record

    names = ["F L15 mlp mb7", "F L15 mlp mb8", "B L3 attn mb0 column dgrad", "B L3 attn mb12 column dgrad",
             "send act s1 mb4", "recv act s1 mb4", "F L2 kv ring step 1 mb3", "F mtp0 head+loss mb3",
             "optimizer step", "F L1 mbx mb3", "F L1 mb3x", "mb3 F L1", "F L1 mb", "grad reduce L3",
             "F L3 attn all-gather mb2", "W L4 mlp mb9", "R L5 attn mb1", "F embedding mb0"]
    cached = kineto._Kinds(1)
    for name in names:
        for stream, cat in (("compute", "compute"), ("compute", "comm:tp"), ("tp", "tp"), ("pp", "pp"),
                            ("pp-recv", "pp"), ("dp", "dp")):
            rec = Record(0, stream, name, cat, 0, 1)
            assert cached.of(rec) == kineto._Kinds(1)._of(rec), (name, stream, cat)
    assert len(cached.by_name) < len(names) * 6       # names differing in the number share an entry


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


@pytest.mark.parametrize("name", ["llama3-8b-h100x64-cp4-32k", "gpt3-175b-a100x64", "llama3-8b-h100x8-zbv"])
def test_traces_of_other_layouts_hold_every_record(name, tmp_path):
    """CP ring steps, a DP-only ZeRO-1 step and a zero-bubble V schedule: every record is a
    kernel under its own name, every launch precedes its kernel, and the text is JSON."""
    res = api.simulate(name, out=tmp_path).run
    for rank in res.pp_rank_of:
        ev, off = _events(tmp_path / "traces" / f"rank-{rank}.json.gz")
        kernels = [e for e in ev if e.get("cat") == "kernel" and not e["args"]["sim5d_name"].startswith("recv ")]
        assert sorted((e["args"]["sim5d_name"], _ns(e["ts"]) - off) for e in kernels) == \
            sorted((r.name, r.start_ns) for r in _kernels_of(res, rank))
        launch = {e["args"]["correlation"]: _ns(e["ts"]) + _ns(e["dur"]) for e in ev if e.get("name") == "cudaLaunchKernel"}
        assert all(launch[e["args"]["correlation"]] <= _ns(e["ts"]) for e in ev if e.get("cat") == "kernel")


# ---------------------------------------------------------------------------------------------
# HolisticTraceAnalysis 0.5.0 on the traces (the `hta` extra; CI installs it)

def _hta(out, monkeypatch, ns=True):
    pytest.importorskip("hta.trace_analysis")     # HolisticTraceAnalysis (0.5.0 also needs psutil)
    from hta.trace_analysis import TraceAnalysis

    if ns:
        monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    else:
        monkeypatch.delenv("HTA_DISABLE_NS_ROUNDING", raising=False)
    return TraceAnalysis(trace_dir=str(out / "traces"))


def _window(res, rank):
    """(first kernel start, last kernel end) of a rank in the trace: its records and the
    receives it waited for."""
    ivs = [(r.start_ns, r.end_ns) for r in _kernels_of(res, rank)] + _receive_waits(res, rank)
    return min(s for s, _ in ivs), max(e for _, e in ivs)


def _sim5d_expected(res) -> dict:
    """{rank: what HTA's get_temporal_breakdown and get_comm_comp_overlap should say}, from
    sim5d's breakdown and the engine's records. HTA's window is the trace's first kernel to its
    last (sim5d's the whole step); its compute time is sim5d's compute; its non-compute time the
    communication kernels with no computation under them: sim5d's exposed communication and the
    time the rank waited in a receive (a real profile shows the NCCL receive kernel there; sim5d
    counts it as bubble); its idle time the rest; its overlap the share of the communication
    time (the union of its kernels) that has computation under it."""
    want = {}
    for rank, b in res.breakdowns.items():
        recs = _kernels_of(res, rank)
        first, last = _window(res, rank)
        comp = _union((r.start_ns, r.end_ns) for r in recs if not (r.stream != "compute" or r.cat.startswith("comm:")))
        comm_ivs = [(r.start_ns, r.end_ns) for r in recs if r.stream != "compute" or r.cat.startswith("comm:")]
        comm = _length(_union(comm_ivs + _receive_waits(res, rank)))
        exposed = _length(_union(comm_ivs + _receive_waits(res, rank) + [tuple(c) for c in comp])) - _length(comp)
        want[rank] = {"compute_time(us)": b.compute_ns / 1000, "non_compute_time(us)": exposed / 1000,
                      "idle_time(us)": (last - first - b.compute_ns - exposed) / 1000,
                      "kernel_time(us)": (last - first) / 1000,
                      "comp_comm_overlap_pctg": 100 * (comm - exposed) / comm}
        assert exposed >= b.exposed_comm_ns
    return want


@pytest.mark.filterwarnings("ignore")        # HTA 0.5.0's pandas FutureWarnings
@pytest.mark.parametrize("rounding", [False, True], ids=["ns", "hta-rounds-to-us"])
def test_hta_breakdown_and_overlap_match_sim5d(run, monkeypatch, rounding):
    """HTA's numbers from the traces against sim5d's. With HTA_DISABLE_NS_ROUNDING=1 they agree
    to the nanosecond; with HTA's default inward rounding of fractional microseconds, within 1%
    of the rank's kernel time (and 1 point of overlap)."""
    out, res = run
    ta = _hta(out, monkeypatch, ns=not rounding)
    assert ta.get_profiler_steps() == [1]
    hta = ta.get_temporal_breakdown(visualize=False).set_index("rank").join(
        ta.get_comm_comp_overlap(visualize=False).set_index("rank"))
    want = _sim5d_expected(res)
    assert sorted(hta.index) == sorted(want)
    for rank, exp in sorted(want.items()):
        span = exp["kernel_time(us)"]
        for key, value in exp.items():
            got = float(hta.loc[rank, key])
            if key == "comp_comm_overlap_pctg":
                assert got == pytest.approx(value, abs=1.0 if rounding else 0.006)
            elif rounding:
                assert abs(got - value) <= 0.01 * span, key
            else:
                assert got == pytest.approx(value, rel=1e-9, abs=1e-3), key


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("which", ["run", "mixtral"])
def test_hta_critical_path_is_sim5ds(which, request, monkeypatch):
    """HTA's critical path of each rank's step (critical_path_analysis over ProfilerStep) runs
    and splits the step as sim5d does: its computation-bound time is sim5d's compute time to the
    nanosecond, its communication-bound time sim5d's exposed communication plus the bubble the
    rank spends waiting before its last kernel (in a receive or a collective), no kernel-to-
    kernel gaps, and the host only for the first launch (one op and one launch)."""
    out, res = request.getfixturevalue(which)
    ta = _hta(out, monkeypatch)
    for rank, b in sorted(res.breakdowns.items()):
        graph, ok = ta.critical_path_analysis(rank=rank, annotation="ProfilerStep", instance_id=None)
        assert ok
        by = graph.get_critical_path_breakdown().groupby("bound_by")["duration"].sum()
        first, last = _window(res, rank)
        assert first == 0
        waiting = b.exposed_comm_ns + b.bubble_ns - (res.makespan_ns - last)
        assert by["gpu_compute_bound"] == pytest.approx(b.compute_ns / 1000, abs=1e-3)
        assert by["gpu_communication_bound"] == pytest.approx(waiting / 1000, abs=1e-3)
        assert abs(by.get("gpu_kernel_kernel_overhead", 0.0)) < 1e-3
        host = by.get("cpu_bound", 0.0) + by.get("gpu_kernel_launch_overhead", 0.0)
        assert 0 < host <= (kineto.LAUNCH_NS + 2 * kineto.RUNTIME_NS) / 1000
        assert by.sum() == pytest.approx(last / 1000 + host, abs=1e-3)


@pytest.mark.filterwarnings("ignore")
def test_hta_aten_ops_and_launch_stats_match_sim5d(run, monkeypatch):
    """get_aten_op_kernels_and_delay: each ATen op's kernels are sim5d's kernels of that kind,
    as many as the engine ran, each launched RUNTIME_NS after its op starts (LAUNCH_NS + the
    wait's call after a stream wait); get_cuda_kernel_launch_stats: every kernel's launch
    delay is sim5d's -- none for compute (sim5d's host issues each as the GPU reaches it), and
    for a communication call the time it queued behind its stream's earlier calls -- within the
    host's packing of launches that fall together (a few microseconds)."""
    out, res = run
    ta = _hta(out, monkeypatch)
    rank = 0
    kinds: dict = {}
    for r in _kernels_of(res, rank):
        if r.stream == "compute" and not r.cat.startswith("comm:"):
            kind = kineto.kernel_kind(r.name)
            kinds[kind] = kinds.get(kind, 0) + 1
    table = ta.get_aten_op_kernels_and_delay(ranks=[rank])[rank]
    assert dict(zip(table["kernel_sequence"], table["occurrence_count"])) == kinds
    assert set(table["aten_op_name"]) == {"aten::linear", "aten::mm", "aten::embedding", "aten::_fused_adam_"}
    assert table["avg_runtime_delay"].eq(kineto.LAUNCH_NS / 1000).all()
    assert table["avg_aten_op_launch_delay"].between(0.5, 1.0).all()

    stats = ta.get_cuda_kernel_launch_stats(ranks=[rank], visualize=False)[rank].set_index("correlation")
    ev, off = _events(out / "traces" / f"rank-{rank}.json.gz")
    comp_ends = sorted(r.end_ns for r in _kernels_of(res, rank) if r.stream == "compute")
    checked = 0
    for e in ev:
        if e.get("cat") != "kernel":
            continue
        start = _ns(e["ts"]) - off
        if e["tid"] == kineto.STREAMS["compute"]:
            want = 0
        else:           # queued: from when the compute stream reached the call to the kernel's start
            want = start - max([c for c in comp_ends if c <= start] + [0])
        got = stats.loc[e["args"]["correlation"], "launch_delay"] * 1000
        assert want <= got + 1e-3 <= want + 20_000, (e["args"]["sim5d_name"], want, got)
        checked += 1
    assert checked == len(stats) > 1000


@pytest.mark.filterwarnings("ignore")
def test_hta_straggler_is_the_rank_sim5d_starts_last(run, mixtral, monkeypatch):
    """get_potential_stragglers: HTA's metric is the start of the last long communication
    kernel (over 1% of the step) of the (stream, kernel) whose duration varies most between
    ranks; the same metric from the engine's records names the same rank (1F1B: the first
    stage, whose last gradient reduction starts last; DualPipe: one of its two mirrored middle
    stages, which tie)."""
    for out, res in (run, mixtral):
        ta = _hta(out, monkeypatch)
        step = res.makespan_ns
        zero = res.scenario.parallelism.zero_stage
        last: dict = {}
        for rank in res.pp_rank_of:
            calls = [(r.stream, kineto.nccl_kernel(r.name, r.stream, zero), r.start_ns, r.end_ns)
                     for r in _kernels_of(res, rank) if r.stream != "compute" or r.cat.startswith("comm:")]
            calls += [("pp-recv", "ncclKernel_SendRecv", s, e) for s, e in _receive_waits(res, rank)]
            for stream, kernel, start, end in calls:
                if end - start >= 0.01 * step:
                    key = (stream, kernel)
                    if (rank, key) not in last or start > last[(rank, key)][0]:
                        last[(rank, key)] = (start, end - start)
        spread = {}
        for key in {k for _, k in last}:
            durs = [last[(rank, key)][1] for rank in res.pp_rank_of if (rank, key) in last]
            if len(durs) > 1:
                mean = sum(durs) / len(durs)
                spread[key] = (sum((d - mean) ** 2 for d in durs) / (len(durs) - 1)) ** 0.5
        key = max(spread, key=spread.get)
        starts = {rank: last[(rank, key)][0] for rank in res.pp_rank_of if (rank, key) in last}
        latest = {rank for rank, t in starts.items() if t == max(starts.values())}   # mirrored stages tie
        assert len(latest) < len(res.pp_rank_of)
        (got,) = ta.get_potential_stragglers(num_candidates=1)
        assert got in latest, (got, latest, key)


def test_a_ranks_all_members_trace_is_its_representatives(tmp_path):
    """Under `ranks: all` symmetry a member's records are copies of its stage representative's,
    so its Kineto trace has the same kernels at the same times, its receive waits included
    (the engine's p2p log names the representative as the receiver)."""
    code, _, err = run_cli("run", str(SCENARIO), "--set", "simulation.ranks=all", "--out", str(tmp_path),
                           "--trace-ranks", "8,13", "--json")
    assert code == 0, err

    def kernels(rank):
        ev = _load(tmp_path / "traces" / f"rank-{rank}.json.gz")["traceEvents"]
        return sorted((e["args"]["sim5d_name"], e["ts"], e["dur"]) for e in ev if e.get("cat") == "kernel")

    rep, member = kernels(8), kernels(13)          # ranks 8-15 are stage 1
    assert member == rep
    assert any(name.startswith("recv ") for name, _, _ in member)
