"""trace.json.gz's slice args (sim.engine.slice_args: what each record is and did) and link-load
counters (sim.network.link_load: the flow network's links over the step).

The truths are independent of the code under test: FLOPs by the GEMM formula 2mnk (Narayanan
et al. 2021 sec. 5.1; SwiGLU's fc1 is two h x ffn matrices, Llama / Shazeer 2020), message sizes
by Megatron's s x b x h elements per TP call, groups from the ranks' coordinates, layers and
microbatches from the slices' names by a regular expression, link loads worked out by hand from
max-min sharing.
"""

from __future__ import annotations

import gzip
import json
import re

import pytest
import simpy

from sim.config import load_scenario
from sim.engine import kineto, outputs
from sim.engine.simulate import simulate
from sim.engine.slice_args import TORCH_DTYPES, slice_args
from sim.network import FlowNetwork
from sim.network.link_load import LoadLog, busiest_links
from sim.topology import load_topology
from sim.topology.graph import build_graph


@pytest.fixture(scope="module")
def llama():
    """Llama 3 8B, TP2 (sequence parallel) PP2 DP4, bf16, 1 x 8192 tokens per microbatch."""
    return simulate(load_scenario("llama3-8b-h100x16-1f1b"), link_load=True)


@pytest.fixture(scope="module")
def mixtral():
    """Mixtral 8x7B, PP4 EP8 DP16 (expert-DP 2), DualPipe, selective recompute, 1 x 4096 tokens."""
    return simulate(load_scenario("mixtral-8x7b-h100x64-dualpipe"), link_load=True)


def _first(res, rank: int, name: str):
    return next(r for r in res.records if r.rank == rank and r.name == name)


def _group_of(res, rank: int, *same: str) -> set:
    """The ranks whose coordinates equal `rank`'s in every dimension of `same`."""
    layout = res.layout
    me = layout.coord(rank)
    return {q for q in range(layout.world_size)
            if all(getattr(layout.coord(q), d) == getattr(me, d) for d in same)}


def test_kernel_flops_are_the_gemm_formula(llama):
    """One layer of Llama 3 8B on one of two TP ranks: T = 8192 tokens, h = 4096, ffn = 14336,
    32 heads (16 here) of 128, 8 KV heads (4 here)."""
    sc = llama.scenario
    m = sc.model
    T, h, ffn, tp, d = 8192, 4096, 14336, 2, 128
    assert (m.hidden_size, m.ffn_hidden_size, sc.parallelism.tp, sc.training.seq_length) == (h, ffn, tp, T)
    args = slice_args(llama)
    rank = min(llama.pp_rank_of)
    # SwiGLU MLP forward: fc1 (gate and up, h -> 2 ffn/tp) and fc2 (ffn/tp -> h), 2mnk each
    mlp = 2 * T * h * (2 * ffn // tp) + 2 * T * (ffn // tp) * h
    assert args(_first(llama, rank, "F L3 mlp mb0"))["flops"] == mlp == 6 * T * h * ffn // tp
    # attention forward: QKV (16 + 2 x 4 heads of 128), causal flash attention (half of 2 x 2
    # s^2 d per head: Q K^T and P V), output projection
    qkv = 2 * T * h * (16 + 2 * 4) * d
    core = 2 * (2 * 16 * T * T * d) // 2
    out = 2 * T * (16 * d) * h
    assert args(_first(llama, rank, "F L3 attn mb0"))["flops"] == qkv + core + out
    # the MLP's full backward, split as the async column-parallel backward runs it: fc2's and
    # then fc1's input gradient, fc1's and fc2's weight gradient; together twice the forward
    parts = {p: args(_first(llama, rank, f"B L3 mlp mb0 {p}"))["flops"]
             for p in ("dgrad", "column dgrad", "column wgrad", "wgrad")}
    assert parts == {"dgrad": 2 * T * h * (ffn // tp), "column dgrad": 2 * T * h * (2 * ffn // tp),
                     "column wgrad": 2 * T * h * (2 * ffn // tp), "wgrad": 2 * T * h * (ffn // tp)}
    assert sum(parts.values()) == 2 * mlp
    assert args(_first(llama, rank, "optimizer step"))["flops"] == 0         # memory-bound


def test_moe_and_recompute_flops(mixtral):
    """Mixtral 8x7B: the MoE block is the router (h -> 8 experts) and each token's top-2 experts'
    SwiGLU MLPs (on EP8 each rank holds one expert and computes 1/8 of the routed tokens' work,
    i.e. its own tokens' share); selective recompute re-runs the causal core attention."""
    T, h, ffn, E, topk, d, heads = 4096, 4096, 14336, 8, 2, 128, 32
    args = slice_args(mixtral)
    rank = min(mixtral.pp_rank_of)
    assert args(_first(mixtral, rank, "F L3 mlp mb0"))["flops"] == 2 * T * h * E + topk * 6 * T * h * ffn
    assert args(_first(mixtral, rank, "R L3 attn mb0"))["flops"] == 2 * (2 * heads * T * T * d) // 2


@pytest.mark.parametrize("name, overrides", [
    ("llama3-8b-h100x16-1f1b", []), ("llama3-8b-h100x16-1f1b", ["training.recompute=full"]),
    ("mixtral-8x7b-h200x16-dualpipev", []),
    ("mixtral-8x7b-h200x16-dualpipev", ["training.recompute_modules=[moe,layernorm]"]),
    ("deepseek-v3-h800x2048-dualpipe", [])])
def test_every_record_of_a_layers_action_has_its_microbatch(name, overrides):
    """Every kernel and call of a layer's forward, backward or recompute -- the TP all-gathers and
    reduce-scatters, the MoE dispatch and combine with their token counts and probabilities, the
    expert-TP collectives, the MTP module's -- names its microbatch, so that its args carry it (the
    forward's and the recompute's collectives and the dispatch gradients had none, unlike the
    backward's): the args' microbatch equals the number in the name, and the layer's."""
    res = simulate(load_scenario(name, overrides=overrides))
    args = slice_args(res)
    recs = [r for r in res.records_of(res.simulated_ranks[:2]) if r.stream != "mark"
            and re.match(r"[FBIWR] L\d+ ", r.name)]
    assert {r.stream for r in recs} > {"compute"}
    for r in recs:
        m = _MB.search(r.name)
        assert m, r.name
        a = args(r)
        assert a["microbatch"] == int(m.group(1)) and a["layer"] == int(_LAYER.search(r.name).group(1)), r.name


def test_communication_args_are_the_calls(llama):
    """TP all-gather: s x b x h bf16 elements per rank over the rank's TP group; the pipeline
    send: s x b x h / tp (sequence parallel) to the next stage's rank; the DP gradient
    reduce-scatter (ZeRO-1) of one layer's parameters on this TP rank over its DP group."""
    args = slice_args(llama)
    for rank in sorted(llama.pp_rank_of):
        tp_group = _group_of(llama, rank, "pp", "dp", "cp")
        rec = next(r for r in llama.records if r.rank == rank and " attn all-gather mb" in r.name)
        a = args(rec)
        assert (a["op"], a["bytes"], a["dtype"], a["group_size"]) == ("all_gather", 8192 * 4096 * 2, "BFloat16", 2)
        assert set(map(int, a["group"].split(","))) == tp_group and rank in tp_group
        info = args.comm(rec)
        assert (info.nelems, set(info.ranks)) == (8192 * 4096, tp_group)
    rank = min(llama.pp_rank_of)
    send = args(_first(llama, rank, "send act s1 mb0"))
    peer = llama.layout.rank(pp=1, **{d: getattr(llama.layout.coord(rank), d) for d in ("tp", "cp", "dp")})
    assert (send["op"], send["bytes"], send["group"], send["microbatch"]) == ("send_recv", 8192 * 4096, f"{rank},{peer}", 0)
    grad = args(_first(llama, rank, "grad reduce L3"))
    attn = 4096 * (4096 + 2 * 8 * 128) + 4096 * 4096             # QKV (GQA) and output projection
    mlp = 3 * 4096 * 14336
    assert grad["op"] == "reduce_scatter" and grad["bytes"] == 2 * ((attn + mlp) // 2 + 2 * 4096)  # + 2 norms
    assert set(map(int, grad["group"].split(","))) == _group_of(llama, rank, "pp", "tp", "cp")


def test_a_pipeline_receive_has_the_phase_of_its_send(llama, tmp_path):
    """A Kineto trace's receive kernel ("recv act s1 mb0", made from the engine's p2p log) carries
    the phase its send carries: forward for an activation, backward for a gradient, with its
    stage and microbatch (it had none)."""
    from sim.engine.slice_args import name_fields

    assert name_fields("recv act s1 mb\x00") == {"microbatch": "\x00", "phase": "forward", "stage": 1}
    assert name_fields("recv grad s0 mb\x00") == {"microbatch": "\x00", "phase": "backward", "stage": 0}
    assert name_fields("recv act s1 mb\x00") == name_fields("send act s1 mb\x00")
    kineto.write_traces(llama, tmp_path, {})
    recvs = []
    for path in tmp_path.glob("rank-*.json.gz"):
        with gzip.open(path) as f:
            recvs += [e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"
                      and e["args"].get("sim5d_name", "").startswith("recv ")]
    assert {e["args"]["sim5d_name"].split()[1] for e in recvs} == {"act", "grad"}
    for e in recvs:
        what, stage, mb = e["args"]["sim5d_name"].split()[1:]
        assert (e["args"]["phase"], e["args"]["stage"], e["args"]["microbatch"]) == (
            "forward" if what == "act" else "backward", int(stage[1:]), int(mb[2:])), e


def test_one_name_for_two_calls_is_told_apart_by_order(mixtral):
    """An MoE layer's gradient reduction is two calls named alike: the dense parameters' over the
    16 DP ranks, then the expert's (3 h x ffn) over the 2 expert-DP ranks."""
    args = slice_args(mixtral)
    rank = min(mixtral.pp_rank_of)
    recs = sorted((r for r in mixtral.records if r.rank == rank and r.name == "grad reduce L3"),
                  key=lambda r: r.start_ns)
    got = [(args(r)["group_size"], args(r)["bytes"]) for r in recs]
    assert got == [(16, 2 * (4096 * (4096 + 2 * 8 * 128) + 4096 * 4096 + 4096 * 8 + 2 * 4096)),
                   (2, 2 * 3 * 4096 * 14336)]
    assert [args.text(r) for r in recs] == [json.dumps(args(r), separators=(",", ":")) for r in recs]


def test_ranks_all_by_symmetry_give_each_rank_its_own_calls():
    """`ranks: all` simulated by symmetry maps the representatives' calls to each rank's groups:
    the args equal those of the rank-by-rank simulation's own programs, record by record."""
    sc = load_scenario("llama3-8b-h100x16-1f1b", overrides=["simulation.ranks=all"])
    sym, full = simulate(sc), simulate(sc, by_symmetry=False)
    assert sym.engine.orbits is not None and full.engine.orbits is None
    a, b = slice_args(sym), slice_args(full)
    recs = sorted(r for r in sym.records if r.stream != "mark" and r.rank in (0, 5, 9, 14))
    assert recs == sorted(r for r in full.records if r.stream != "mark" and r.rank in (0, 5, 9, 14))
    assert [a(r) for r in recs] == [b(r) for r in recs]
    tp = a(next(r for r in recs if r.rank == 5 and " attn all-gather mb" in r.name))
    assert set(map(int, tp["group"].split(","))) == _group_of(sym, 5, "pp", "dp", "cp") == {4, 5}


_LAYER = re.compile(r"(?:^|\s)L(\d+)(?=\s|$)")
_MB = re.compile(r"(?:^|\s)mb(\d+)(?=\s|$)")


@pytest.mark.parametrize("ranks", ["representative", "all"])
def test_program_walks_made_without_the_step_are_the_slice_args_own(mixtral, ranks):
    """program_walks (made by `sim5d run` while the engine runs, with only the scenario) are
    the walks SliceArgs makes of the simulated ranks' programs from the step's result, under
    `ranks: all` symmetry (the orbits' representatives) too; a SliceArgs given them answers
    the same args for every record."""
    from sim.engine.slice_args import program_walks

    sc = load_scenario("mixtral-8x7b-h100x64-dualpipe", overrides=[f"simulation.ranks={ranks}"])
    res = mixtral if ranks == "representative" else simulate(sc)
    walks = program_walks(sc)
    own = slice_args(res)
    orbits = res.engine.orbits
    assert (orbits is not None) == (ranks == "all")
    assert set(walks) == set(orbits.members if orbits else res.simulated_ranks) and len(walks) == sc.parallelism.pp
    assert walks == {g: own._walked(g) for g in walks}
    given = slice_args(res, walked=walks)
    recs = res.records_of(res.simulated_ranks[:2]) + res.records_of(res.simulated_ranks[-1:])
    assert [given.text(r) for r in recs] == [own.text(r) for r in recs]
    # program_tables: the same walks, and each representative's table equal to the one SliceArgs
    # makes itself; given them, the same texts and args (under symmetry, of other ranks too)
    from sim.engine.slice_args import program_tables

    walks2, tables = program_tables(sc)
    assert walks2 == walks and set(tables) == set(walks)
    assert tables == {g: own.table(g) for g in tables}
    seeded = slice_args(res, walked=walks2, tables=tables)
    assert all(seeded._tables[g] is tables[g] for g in tables)
    more = res.records_of([q for q in res.pp_rank_of if q not in walks][:2]) if orbits else []
    assert more or ranks == "representative"
    assert [seeded.text(r) for r in recs + more] == [own.text(r) for r in recs + more]
    assert [seeded(r) for r in recs[::50] + more[::50]] == [own(r) for r in recs[::50] + more[::50]]


@pytest.mark.parametrize("name", ["llama3-8b-h100x16-1f1b", "mixtral-8x7b-h100x64-dualpipe"])
def test_every_slice_in_trace_json_has_its_args(name, tmp_path):
    """`sim5d run`'s trace.json.gz: every complete event has args with the layer and microbatch
    its name has, its phase by its first letter; a kernel has its FLOPs (more than 0 for a
    layer's forward), a call its op, bytes, dtype and a group holding its rank."""
    from sim.commands.run import write_outputs

    res = simulate(load_scenario(name), link_load=True)
    write_outputs(res, tmp_path)
    with gzip.open(tmp_path / "trace.json.gz") as f:
        trace = json.load(f)
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(slices) > 5000
    args = slice_args(res)                          # (one FLOPs count per kernel name)
    assert all(len(f) == 1 for rank in res.pp_rank_of for f in args._own(rank)[0].values())
    phases = {"F": "forward", "B": "backward", "I": "input-grad", "W": "weight-grad", "R": "recompute"}
    for e in slices:
        a, n = e["args"], e["name"]
        layer, mb = _LAYER.search(n), _MB.search(n)
        assert a.get("layer") == (int(layer.group(1)) if layer else None), e
        assert a.get("microbatch") == (int(mb.group(1)) if mb else None), e
        if n[:2] in ("F ", "B ", "I ", "W ", "R "):
            assert a["phase"] == phases[n[0]], e
        if e["cat"] in ("compute", "recompute", "optimizer"):
            assert isinstance(a["flops"], int) and a["flops"] >= 0, e
            if re.match(r"F L\d+ (attn|mlp) mb\d+$", n):
                assert a["flops"] > 0, e
        else:
            group = [int(x) for x in a["group"].split(",")]
            assert a["op"] and a["bytes"] > 0 and a["dtype"] in TORCH_DTYPES, e
            assert e["pid"] in group and len(group) == a["group_size"], e


# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def a100x2():
    return build_graph(load_topology("dgx-a100-hdr"), 2)


def _loads(G, transfers, starts=None) -> tuple:
    """Run transfers (name, src, dst, bytes) on a FlowNetwork keeping its rates; (the busiest
    links' LinkSeries by name, the network)."""
    env = simpy.Environment()
    net = FlowNetwork(env, G)
    net.loads = LoadLog()

    def go(src, dst, nbytes, delay):
        if delay:
            yield env.timeout(delay)
        yield net.transfer(src, dst, nbytes)

    for name, src, dst, nbytes in transfers:
        env.process(go(src, dst, nbytes, (starts or {}).get(name, 0)))
    env.run()
    edges = G.graph["edge_list"]
    series = busiest_links(net.loads, net.capacity, [f"{u} -> {v}" for u, v in edges], env.now, top=50)
    return {s.name: s for s in series}, net


def test_link_load_is_the_max_min_rates_by_hand(a100x2):
    """230 GB/s NVLinks (gpu -> NVSwitch, NVSwitch -> gpu). A (S bytes, gpu0 -> gpu1) and B (S/2,
    gpu0 -> gpu2) share gpu0's link: 115 GB/s each until B ends at 1 ms, then A alone at 230
    until 1.5 ms; C (gpu3 -> gpu4) runs alone at 230 for 1 ms."""
    S = 230_000_000
    links, _ = _loads(a100x2, [("A", "n0.gpu0", "n0.gpu1", S), ("B", "n0.gpu0", "n0.gpu2", S // 2),
                               ("C", "n0.gpu3", "n0.gpu4", S)])
    assert links["n0.gpu0 -> n0.nvsw"].points == [(0, 230.0), (1_500_000, 0.0)]
    assert links["n0.nvsw -> n0.gpu1"].points == [(0, 115.0), (1_000_000, 230.0), (1_500_000, 0.0)]
    assert links["n0.nvsw -> n0.gpu2"].points == [(0, 115.0), (1_000_000, 0.0)]
    assert links["n0.gpu3 -> n0.nvsw"].points == [(0, 230.0), (1_000_000, 0.0)]
    assert links["n0.gpu0 -> n0.nvsw"].bytes == pytest.approx(1.5 * S)
    assert links["n0.nvsw -> n0.gpu2"].bytes == pytest.approx(0.5 * S)


def test_link_load_of_a_flow_that_ran_alone_then_shared(a100x2):
    """A starts alone at 230 GB/s; B joins at 0.5 ms on gpu0's link: 115 each until A ends at
    1.5 ms (its second half at half rate), then B alone at 230 until 2 ms."""
    S = 230_000_000
    links, _ = _loads(a100x2, [("A", "n0.gpu0", "n0.gpu1", S), ("B", "n0.gpu0", "n0.gpu2", S)],
                      starts={"B": 500_000})
    assert links["n0.gpu0 -> n0.nvsw"].points == [(0, 230.0), (2_000_000, 0.0)]
    assert links["n0.nvsw -> n0.gpu1"].points == [(0, 230.0), (500_000, 115.0), (1_500_000, 0.0)]
    assert links["n0.nvsw -> n0.gpu2"].points == [(500_000, 115.0), (1_500_000, 230.0), (2_000_000, 0.0)]


def test_busiest_link_series_stay_within_capacity(llama):
    """A bundled scenario's busiest links: 8, busiest first, each value in [0, capacity] and
    their integral over the step the bytes the link carried (summed apart from the points)."""
    series = llama.link_load.busiest(8)
    assert len(series) == 8 and [s.bytes for s in series] == sorted((s.bytes for s in series), reverse=True)
    for s in series:
        assert all(0.0 <= v <= s.capacity_gbps * (1 + 1e-12) for _, v in s.points), s.name
        assert max(v for _, v in s.points) > 0 and s.points[-1][1] == 0.0
        integral = sum(v * (t1 - t0) for (t0, v), (t1, _) in zip(s.points, s.points[1:]))
        assert integral == pytest.approx(s.bytes, rel=1e-9)


def _reference_series(entries: list, log: LoadLog, n: int, end_ns: int, top: int) -> dict:
    """The busiest links' (bytes, points) by the definition, from every solve's shared set kept
    whole (`entries`: (time, paths, rates, lens) as the network logged them): each entry's link
    loads summed flow by flow in plain Python, each link's bytes the loads x the entries'
    durations in order plus what ran alone, each link's load at every entry time plus the
    flows alone on it. The alone batches' part is link_load's own (not what this checks)."""
    import numpy as np

    from sim.network import link_load

    summed = []
    for t, paths, rates, lens in entries:
        loads: dict = {}
        if paths is not None:
            if lens is not None:            # the edge ids end to end
                ends = np.cumsum(lens).tolist()
                paths = [paths[a:b].tolist() for a, b in zip([0] + ends[:-1], ends)]
            for path, rate in zip(paths, rates):
                for e in path:
                    loads[e] = loads.get(e, 0.0) + float(rate)
        summed.append((t, loads))
    total = [0.0] * n
    for (t, loads), (t_next, _) in zip(summed, summed[1:] + [(end_ns, None)]):
        for e, load in loads.items():
            total[e] = total[e] + load * (t_next - t)
    total = np.array(total)
    link_load._alone_totals(log, total, end_ns)
    order = [int(e) for e in np.lexsort((np.arange(n), -total)) if total[e] > 0][:top]
    alone = link_load._alone_on(log, set(order), end_ns)
    out = {}
    for e in order:
        events: dict = {}
        for t, loads in summed:
            events.setdefault(t, [None, 0.0, 0])[0] = loads.get(e, 0.0)
        for rate, start, end in alone[e]:
            for t, sign in ((start, 1), (end, -1)):
                ev = events.setdefault(t, [None, 0.0, 0])
                ev[1] += sign * rate
                ev[2] += sign
        points, base, extra, running = [], 0.0, 0.0, 0
        for t in sorted(events):
            s, d, c = events[t]
            base = base if s is None else s
            running += c
            extra = extra + d if running else 0.0
            if not points or points[-1][1] != base + extra:
                points.append((t, base + extra))
        out[e] = (float(total[e]), points)
    return out


MIX64, MIX16 = "mixtral-8x7b-h100x64-dualpipe", "mixtral-8x7b-h200x16-dualpipev"


@pytest.mark.parametrize("name, settings", [(MIX64, {}), (MIX64, {"RAW_LINK_ENTRIES": 500, "SMALL_SHARED_FLOWS": 0}),
                                            (MIX64, {"DENSE_SUM_RATIO": 0, "DENSE_SUM_LINKS": 0,
                                                     "RAW_LINK_ENTRIES": 0}),
                                            (MIX64, {"_maxmin": None}), (MIX16, {"RAW_LINK_ENTRIES": 0})])
def test_link_loads_equal_every_solve_kept_whole(name, settings, monkeypatch):
    """The log sums each solve's shared set as it settles and keeps only the links' changes; the
    50 busiest links' bytes and points are still exactly (the same floats) what every solve's
    flows kept whole give by the definition (`_reference_series`): on the Mixtral DualPipe step
    (all-to-alls of hundreds of flows, the set emptied between) whether the entries wait to the
    end or are summed every few hundred link entries, summed on a dict or with numpy, densely
    (by the compiled kernel or numpy) or per entry's links, and on the DualPipeV step (thousands
    of solves of a few flows, summed on a dict); and the log holds its changes, not its entries
    (the raw entries waiting never more than the limit and one entry)."""
    import numpy as np

    from sim.network import link_load

    for key, value in settings.items():
        monkeypatch.setattr(link_load, key, value)
    entries, waiting = [], []
    add = LoadLog.add_shared

    def keep(self, now, paths, rates, lens, n):
        entries.append((now, None if paths is None else (paths if lens is not None else tuple(paths)),
                        None if rates is None else (rates if lens is not None else list(rates)), lens))
        add(self, now, paths, rates, lens, n)
        waiting.append(self._waiting)

    monkeypatch.setattr(LoadLog, "add_shared", keep)
    res = simulate(load_scenario(name), link_load=True)
    ll = res.link_load
    series = ll.busiest(50)
    want = _reference_series(entries, ll.log, len(ll.capacity), ll.end_ns, 50)
    assert len(series) == len(want) >= 40 and list(want) == [s.edge for s in series]
    for s in series:
        assert (s.bytes, s.points) == want[s.edge], s.name
    arrays = sum(isinstance(p, np.ndarray) for _, p, _, _ in entries)
    lists = sum(isinstance(p, tuple) and 0 < len(p) <= link_load.SMALL_SHARED_FLOWS for _, p, _, _ in entries)
    assert len(ll.log.times) == len(entries) > 3000 and (arrays > 1500 if name == MIX64 else lists > 3000)
    biggest = max(p.size if isinstance(p, np.ndarray) else 8 * len(p) for _, p, _, _ in entries if p is not None)
    assert max(waiting) <= link_load.RAW_LINK_ENTRIES + biggest
    link_entries = sum(p.size if isinstance(p, np.ndarray) else sum(map(len, p)) for _, p, _, _ in entries
                       if p is not None)
    # fewer changes than entries where solves re-rate hundreds of flows (118,168 of 391,952); a
    # few sends' links mostly change at each solve (52,692 of 80,324 on MIX16)
    assert len(ll.log._ch_links) < link_entries * (0.5 if name == MIX64 else 1)


@pytest.mark.parametrize("name, ranks", [("mixtral-8x7b-h100x64-dualpipe", "representative"),
                                         ("llama3-8b-h100x16-1f1b", "all")])
def test_keeping_link_loads_changes_no_result(name, ranks):
    """The rates are only read: with and without link_load the same records and summary (under
    ranks: all by symmetry too, where every rank's calls share the network)."""
    sc = load_scenario(name, overrides=[f"simulation.ranks={ranks}"])
    a, b = simulate(sc), simulate(sc, link_load=True)
    assert a.link_load is None and b.link_load.log._raw and b.link_load.log.alone
    sa, sb = a.summary(), b.summary()
    sa.pop("sim_wall_s"), sb.pop("sim_wall_s")
    assert sa == sb and a.records == b.records and a.p2p == b.p2p


def test_analytical_network_has_no_link_loads():
    res = simulate(load_scenario("gpt-1.7b-a100x8-gpipe", overrides=["simulation.network=analytical"]),
                   link_load=True)
    assert res.link_load.busiest(8) == [] and "analytical" in res.link_load.note


def test_trace_json_has_the_busiest_links_counters(llama, tmp_path):
    """trace.json.gz's network process: a counter track per busy link, each value in [0, the
    capacity its name gives], the note of what they cover in otherData."""
    from sim.commands.run import write_outputs

    write_outputs(llama, tmp_path)
    with gzip.open(tmp_path / "trace.json.gz") as f:
        trace = json.load(f)
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C" and e["pid"] == outputs.NETWORK_PID]
    assert len({e["name"] for e in counters}) == 8
    for e in counters:
        cap = float(re.search(r"\(of ([\d.]+) GB/s\)$", e["name"]).group(1))
        assert 0.0 <= e["args"]["GB/s"] <= cap
    assert {e["args"]["GB/s"] for e in counters} - {0.0}
    assert trace["otherData"]["link_load"] == llama.link_load.note


def test_analytical_trace_says_it_has_no_link_loads(tmp_path):
    from sim.commands.run import write_outputs

    res = simulate(load_scenario("gpt-1.7b-a100x8-gpipe", overrides=["simulation.network=analytical"]),
                   link_load=True)
    write_outputs(res, tmp_path)
    with gzip.open(tmp_path / "trace.json.gz") as f:
        trace = json.load(f)
    net = [e for e in trace["traceEvents"] if e.get("pid") == outputs.NETWORK_PID]
    assert not [e for e in net if e["ph"] == "C"]
    name = next(e["args"]["name"] for e in net if e["name"] == "process_name")
    assert "no link loads" in name and "analytical" in trace["otherData"]["link_load"]
