"""The engine's fast paths (issue #15) give the results of the plain engine, exactly.

- Runs: consecutive kernels, marks and fixed-time collectives of a rank run as one timeout
  (sim.engine.core._Run); every record keeps its time.
- Isolated groups (sim.engine.netmodel): a group whose calls never overlap and whose links no
  other group crosses takes its calls' time alone on the graph, without the shared network.
- Batches: a collective's phase enters the flow network as one batch with one event.
- Streams: fixed-time calls need no process; runs hold fixed-time launches and their waits
  (calls still in flight when a run ends escape it); calls timed by a process queue FIFO.
- Max-min filling on Python floats for small problems, remembered per distinct problem.
- Records made only when asked for; the breakdown from each run's merged intervals.
- Layer templates in the program builder.
- The flow network's active flows in Python lists while few, numpy arrays while many.
- The cluster graph: servers copied from server 0, networkx's dicts filled directly.
- The cyclic garbage collector paused during a step (which must leave almost no cyclic garbage).
The independent truth for the whole engine is tests/data/engine_reference.json: step times,
breakdowns and a hash of every record, written by the engine before this work
(`python benchmarks/engine_reference.py --write ...` at commit 52895d1; the `ranks-all` cases by
the engine at 6d96fb3, which gives the earlier cases unchanged). The DualPipe and DualPipeV cases
were written again after a change of model, not of speed (an overlapped pair waits for both its
inputs before it starts and sends both outputs after it, as DeepSeek's reference does; see
sim.engine.program.overlap_pair): every other case kept its values. The MoE cases with several
experts per rank (deepseek-v3, mixtral dualpipev) were written again when the alltoall
dispatcher's token re-sort was added (a model change: sim.workload.ops moe_sort_chunks), and
the DeepSeek-V3 scenario once more when it became the model as the report trains it (61 layers
split 3 / 4 x 14 / 2 over DualPipe's stages and the multi-token prediction module; a scenario
change), and the Mixtral DualPipeV cases (tp 2) when the MoE block took Megatron-Core's alltoall
dispatcher collectives with etp = tp too (the expert-TP all-gather of the received tokens instead
of the dense block's all-gather around the dispatch; a model change), and the DeepSeek-V3
scenario when it took DeepSeek's dispatch (node-limited routing through Megatron-Core's flex
dispatcher with DeepEP, sim.network.moe_dispatch; a scenario change), and all the MoE cases
(deepseek-v3, both mixtral) when the MoE block took the router's top-k and the dispatcher's
preprocess kernels, its host syncs and one GEMM launch per four local experts (a model change:
sim.workload.ops moe_host_syncs, sim.compute issue_bound_time_s), and the Mixtral cases (alltoall
dispatcher) when it took that dispatcher's token-count all-gather over tp_ep and its
probabilities' all-to-all (a model change: sim.engine.parallel.ep ExpertParallel._a2a).
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.core import Comm, CommSpec, Compute, Engine, Launch, Mark, Send, Wait
from sim.network import FlowNetwork
from sim.topology import load_topology
from sim.topology.graph import build_graph

from conftest import REPO
from flow_traffic import draw_calls, run_calls

REFERENCE = json.loads((REPO / "tests" / "data" / "engine_reference.json").read_text())


def _bench():
    spec = importlib.util.spec_from_file_location("engine_reference", REPO / "benchmarks" / "engine_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# Cases that run in a few seconds each; the benchmark script checks the whole list.
FAST = ["llama3-8b-h100x16-1f1b/flow", "llama3-8b-h100x16-1f1b/analytical", "llama3-8b-h100x8-zbv/flow",
        "gpt-1.7b-a100x8-gpipe/flow", "gpt-7.5b-a100x32-zbh2/flow", "mixtral-8x7b-h200x16-dualpipev/flow",
        "llama3-8b-h100x64-cp4-32k/flow", "llama3-70b-h200x64-zbh1/analytical", "narayanan/gpt-18b",
        "zero-bubble/1.5b-zb-h1" if "zero-bubble/1.5b-zb-h1" in REFERENCE else "narayanan/gpt-3.6b",
        "llama3-8b-h100x16-1f1b/flow/ranks-all/training.tp_comm_overlap=True",
        "mixtral-8x7b-h200x16-dualpipev/flow/ranks-all"]


@pytest.mark.parametrize("name", FAST)
def test_engine_gives_the_reference_results(name):
    """Step time, per-rank breakdown and every record equal to the engine before the fast paths."""
    cases = dict(_bench().scenario_dicts())
    got = _bench().result_of(cases[name])
    assert got == REFERENCE[name]


def _net(num_nodes=2, mode="flow"):
    from sim.config import build_scenario
    from sim.engine.netmodel import ClusterNetwork
    from conftest import base_scenario

    data = base_scenario()
    data["cluster"] = {"topology": "dgx-h100-ndr", "num_nodes": num_nodes}
    data["parallelism"] = {"tp": 8, "pp": num_nodes}
    data["simulation"] = {"network": mode}
    return ClusterNetwork(build_scenario(data))


def test_isolated_groups_hand_worked():
    """Rank 0 of two DGX H100 nodes. TP (0..3) calls only block: isolated (NVLink, nobody else).
    DP (0, 8) is launched and waited before its next call: isolated (its NIC path is its own).
    (4, 5) has a send left in flight when a blocking call of the same pair starts: they may
    overlap, so not isolated. (6, 7) alone would be isolated, but (7, 6) is another group on the
    same two NVLinks, so neither is."""
    net = _net()
    tp, dp, pair, a, b = (0, 1, 2, 3), (0, 8), (4, 5), (6, 7), (7, 6)
    prog = [Comm(CommSpec("all_reduce", tp, 1 << 20, "tp"), "ar"),
            Launch("h", CommSpec("all_reduce", dp, 1 << 20, "dp"), "dp"), Compute(10, "k"), Wait("h"),
            Launch("h2", CommSpec("all_reduce", dp, 1 << 20, "dp"), "dp"), Wait("h2"),
            Send("m", CommSpec("send_recv", pair, 1 << 20, "pp"), "send"),
            Comm(CommSpec("all_reduce", pair, 1 << 20, "tp"), "ar2"),
            Comm(CommSpec("all_reduce", a, 1 << 20, "tp"), "ar3"),
            Comm(CommSpec("all_to_all", b, 1 << 20, "ep"), "a2a")]
    net.prepare({0: prog})
    assert net._isolated == {tp, dp}
    assert net.fixed_ns(CommSpec("all_reduce", tp, 1 << 20, "tp")) == net.alone_ns(CommSpec("all_reduce", tp, 1 << 20, "tp"))
    assert net.fixed_ns(CommSpec("all_reduce", a, 1 << 20, "tp")) is None
    # a group launched twice on two streams without a wait between may overlap itself
    net.prepare({0: [Launch("x", CommSpec("all_gather", tp, 1 << 20, "tp"), "x", "tp"),
                     Comm(CommSpec("all_gather", tp, 1 << 20, "tp"), "y"), Wait("x")]})
    assert net._isolated == frozenset()
    # two simulated ranks that each call a group not all of whose members are simulated
    net.prepare({0: [Comm(CommSpec("all_reduce", (0, 1, 2), 1 << 20, "tp"), "z")],
                 1: [Comm(CommSpec("all_reduce", (0, 1, 2), 1 << 20, "tp"), "z")]})
    assert net._isolated == frozenset()


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
@pytest.mark.parametrize("ranks", [(0, 1), (0, 1, 2, 3, 4, 5, 6, 7), (0, 8), (0, 8, 16, 24), (0, 1, 8, 9)])
def test_alone_time_is_the_alpha_beta_time_of_a_balanced_collective(op, ranks):
    """A call alone on the graph: its flows' max-min time equals the analytical (alpha-beta on
    the busiest link of each phase) time, for the balanced patterns NCCL uses."""
    net = _net(num_nodes=4)
    for size in (1 << 16, 12_345_679, 1 << 28):
        spec = CommSpec(op, ranks, size, "x")
        assert net.alone_ns(spec) == net.time_ns(spec)


def test_a_batch_is_its_flows_one_by_one():
    """FlowNetwork.transfer_batch: the same per-flow end times as the flows started one by one
    (150 random flows on two nodes, two batches and a late single flow)."""
    G = build_graph(load_topology("dgx-h100-ndr"), 2)
    gpus = G.graph["gpus"]
    rng = np.random.default_rng(3)
    from sim.topology.routing import router_for

    router = router_for(G)
    flows = [(gpus[s], gpus[(s + 1 + d) % 16], int(n)) for s, d, n in
             zip(rng.integers(0, 16, 150), rng.integers(0, 15, 150), rng.integers(1, 1 << 26, 150))]

    def run(batched):
        env = simpy.Environment()
        net = FlowNetwork(env, G, record=True)

        def go(part, delay):
            yield env.timeout(delay)
            paths = [router.path(s, d) for s, d, _ in part]
            names = [f"{s}->{d}#{i}" for i, (s, d, _) in enumerate(part)]
            if batched:
                edges = np.array([e for p in paths for e in p], dtype=np.int64)
                yield net.transfer_batch(edges, np.array([len(p) for p in paths]), [n for *_, n in part],
                                         np.full(len(part), np.inf), names)
            else:
                yield env.all_of([net.transfer_on(p, n, latency=False, name=nm)
                                  for p, (*_, n), nm in zip(paths, part, names)])

        env.process(go(flows[:100], 0))
        env.process(go(flows[100:149], 12_345))
        env.process(go(flows[149:], 99_999))
        env.run()
        return sorted((r.name, r.start_ns, r.end_ns) for r in net.log), env.now

    assert run(True) == run(False)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_flows_kept_in_lists_or_arrays_end_at_the_same_nanosecond(data):
    """FlowNetwork keeps few active flows in Python lists and many in numpy arrays
    (`small_flows`). Random traffic on two nodes (single transfers, some capped, and batches,
    arriving over time, so flows join and leave while others run) gives every flow the same end
    time and the network the same solves whether it always uses arrays (small_flows = 0), always
    lists, or switches back and forth (small_flows = 4)."""
    calls = draw_calls(data, 30)
    arrays = run_calls(calls, small_flows=0)
    assert arrays[4] == sum(c[5] for c in calls)
    assert run_calls(calls, small_flows=10 ** 9) == arrays
    assert run_calls(calls, small_flows=4) == arrays


def _subtract(a, b):
    """|a minus b| for sorted disjoint interval lists: the interval walk the breakdown used before."""
    total, j = 0, 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            bs, be = b[k]
            if bs > cur:
                total += bs - cur
            cur = max(cur, be)
            if cur >= e:
                break
            k += 1
        if cur < e:
            total += e - cur
    return total


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 60), st.integers(0, 25)), max_size=40))
def test_breakdown_is_the_interval_walk(spans):
    """The numpy breakdown (sorted starts, running maximum of ends) against merging interval
    lists one by one: compute = |K|, exposed = |C minus K|, for random kernels and collectives
    (empty, touching and nested ones included)."""
    from sim.engine.core import Record
    from engine_fakes import _length, _union
    from sim.engine.metrics import breakdown

    recs = [Record(0, "compute" if kernel else "dp", "x", "compute", s, s + d) for kernel, s, d in spans]
    recs.append(Record(0, "compute", "k", "compute", 0, 0))
    b = breakdown(recs, 100)[0]
    k = _union([(r.start_ns, r.end_ns) for r in recs if r.stream == "compute"])
    c = _union([(r.start_ns, r.end_ns) for r in recs if r.stream != "compute"])
    assert (b.compute_ns, b.exposed_comm_ns) == (_length(k), _subtract(c, k))
    assert b.bubble_ns == 100 - b.compute_ns - b.exposed_comm_ns


class _HalfFixed:
    """A network whose calls tagged "fixed" take `size` ns known in advance (`fixed_ns`) and the
    rest `size` ns decided while they run (a process), like isolated vs shared flow calls."""

    def fixed_ns(self, spec):
        return spec.size_bytes if spec.tag == "fixed" else None

    def transfer(self, env, spec):
        yield env.timeout(spec.size_bytes)


def test_a_stream_runs_fixed_and_network_timed_calls_in_launch_order():
    """Hand-worked FIFO on one stream: fixed-time calls need no process, but they still queue
    behind a network-timed call launched before them and vice versa."""
    def spec(tag, ns):
        return CommSpec("all_reduce", (0, 1), ns, tag)

    prog = [Launch("a", spec("slow", 10), "a"), Launch("b", spec("fixed", 5), "b"),
            Launch("c", spec("fixed", 3), "c"), Wait("c"),                       # t = 18
            Launch("d", spec("fixed", 4), "d"), Launch("e", spec("slow", 6), "e"),
            Launch("f", spec("fixed", 2), "f"), Compute(1, "k"), Wait("d"),       # t = 22
            Launch("g", spec("fixed", 7), "g"), Wait("f"), Wait("g"), Compute(2, "end")]
    eng = Engine({0: prog}, _HalfFixed())
    assert eng.run() == 39
    got = {r.name: (r.start_ns, r.end_ns) for r in eng.records}
    assert got == {"a": (0, 10), "b": (10, 15), "c": (15, 18), "d": (18, 22), "e": (22, 28),
                   "f": (28, 30), "k": (18, 19), "g": (30, 37), "end": (37, 39)}


class _ProcessOnly(_HalfFixed):
    """The same call times, all decided by a process (no `fixed_ns`): the plain engine."""

    fixed_ns = None

    def transfer(self, env, spec):
        yield env.timeout(spec.size_bytes)


def _fixed(ns, tag="fixed"):
    return CommSpec("all_reduce", (0, 1), ns, tag)


FOLD_CASES = {
    # a call under a shorter kernel, then under a longer one (hand-worked: 10, then 5)
    "async pair": ([Launch("a", _fixed(10), "a", "tp"), Compute(4, "k1"), Wait("a"),
                    Launch("b", _fixed(3), "b", "tp"), Compute(5, "k2"), Wait("b"), Compute(1, "k3")], 16),
    # a blocking call and a mark between the launch and its wait
    "with comm": ([Launch("a", _fixed(10), "a", "tp"), Compute(4, "k1"), Comm(_fixed(2), "c"),
                   Mark("m", "activations", 1.0), Wait("a"), Compute(1, "k2")], 11),
    # two calls in flight on one stream: the second queues behind the first
    "stream busy": ([Launch("a", _fixed(10), "a", "tp"), Launch("b", _fixed(3), "b", "tp"),
                     Compute(4, "k1"), Wait("a"), Wait("b"), Compute(1, "k2")], 14),
    # TP comm overlap (pair_tp_waits): each call under the next kernel, waited before the one
    # after; a: [0, 6] under k1 [0, 4], b: [6, 9] under k2 [6, 11], wait b at 11, k3 [11, 12]
    "overlap chain": ([Launch("a", _fixed(6), "a", "tp"), Compute(4, "k1"), Launch("b", _fixed(3), "b", "tp"),
                       Wait("a"), Compute(5, "k2"), Wait("b"), Compute(1, "k3")], 12),
    # a call waited after a send (the engine runs the send): not folded, and the next call on
    # its stream queues behind it at run time
    "after send": ([Launch("a", _fixed(10), "a", "tp"), Send("x", _fixed(2, "slow"), "send"),
                    Compute(4, "k1"), Wait("a"), Launch("b", _fixed(3), "b", "tp"), Compute(1, "k2"),
                    Wait("b")], 13),
    # a network-timed call ahead on the stream, then a fixed one (not folded)
    "slow ahead": ([Launch("a", _fixed(10, "slow"), "a", "tp"), Compute(2, "k0"), Wait("a"),
                    Launch("s", _fixed(6, "slow"), "s", "tp"), Launch("b", _fixed(3), "b", "tp"),
                    Compute(4, "k1"), Wait("b"), Compute(1, "k2")], 20),
    # a call on another stream launched and waited under the first one
    "two streams": ([Launch("a", _fixed(10), "a", "tp"), Launch("d", _fixed(1), "d", "dp"), Wait("d"),
               Compute(4, "k1"), Wait("a")], 10),
}


@pytest.mark.parametrize("name", list(FOLD_CASES))
def test_a_launch_folded_into_a_run_keeps_every_time(name):
    """A fixed-time launch and its wait inside a run give the records of the plain engine (every
    call timed by a process) and the hand-worked step time; the folded cases run as one run."""
    prog, want = FOLD_CASES[name]
    fast, plain = Engine({0: prog}, _HalfFixed()), Engine({0: prog}, _ProcessOnly())
    assert fast.run() == plain.run() == want
    assert sorted(fast.records) == sorted(plain.records)
    compiled, _ = fast._compile(0, prog)
    if name in ("async pair", "with comm", "stream busy", "overlap chain", "two streams"):
        assert len(compiled) == 1 and compiled[0].count == len(prog)
    else:
        assert len(compiled) > 1


def test_a_call_waited_for_twice_inside_and_after_its_run():
    """ZeRO-3 waits for a layer's gathered parameters in the forward and again in the backward:
    a call launched and waited inside a run is waited again after a send; no deadlock, the
    records of the plain engine."""
    prog = [Launch("g", _fixed(5), "gather", "dp"), Compute(3, "k1"), Wait("g"),
            Send("x", _fixed(2, "slow"), "send"), Compute(1, "k2"), Wait("g"), Compute(1, "k3")]
    fast, plain = Engine({0: prog}, _HalfFixed()), Engine({0: prog}, _ProcessOnly())
    assert fast.run() == plain.run() == 7
    assert sorted(fast.records) == sorted(plain.records)


@pytest.mark.parametrize("name", ["llama3-8b-h100x8-zbv/flow", "mixtral-8x7b-h200x16-dualpipev/flow",
                                  "llama3-8b-h100x64-cp4-32k/flow", "narayanan/gpt-18b"])
def test_breakdown_from_the_runs_equals_the_breakdown_of_every_record(name):
    """simulate's breakdown comes from the runs' merged intervals without making the records;
    it equals sim.engine.metrics.breakdown over the records made afterwards."""
    from sim.config import build_scenario
    from sim.engine.metrics import breakdown
    from sim.engine.simulate import simulate

    res = simulate(build_scenario(dict(_bench().scenario_dicts())[name]))
    assert res.engine._records is None                     # not made by simulate itself
    assert res.breakdowns == breakdown(res.records, res.makespan_ns)
    assert res.makespan_ns == max(r.end_ns for r in res.records)


def test_a_recurring_set_of_flows_is_solved_once(monkeypatch):
    """The same flows on the same links, again and again (a pipeline's sends every cycle): the
    max-min filling runs once, every transfer takes the same time as the first."""
    import sim.network.flow as flow

    G = build_graph(load_topology("dgx-h100-ndr"), 2)
    gpus = G.graph["gpus"]
    calls = []
    real = flow.max_min_rates
    monkeypatch.setattr(flow, "max_min_rates", lambda *a, **k: calls.append(1) or real(*a, **k))
    env = simpy.Environment()
    net = FlowNetwork(env, G)
    ends = []

    def cycle():
        for _ in range(5):
            t0 = env.now
            a = net.transfer(gpus[0], gpus[8], 64 << 20)
            b = net.transfer(gpus[1], gpus[8], 32 << 20)
            yield a & b
            ends.append(env.now - t0)

    env.process(cycle())
    env.run()
    assert len(set(ends)) == 1 and ends[0] > 0
    assert net.solves == 10 and len(calls) == 2      # both flows, then the one left: once each


@pytest.mark.parametrize("name", ["dgx-a100-hdr", "dgx-h100-ndr", "hgx-h200-ndr", "hgx-h800-ndr",
                                  "pcie-l40s", "cpu-local", "cpu-local-torch"])
def test_servers_copied_from_server_0_are_the_graph_built_server_by_server(name):
    """build_graph copies servers 1.. from server 0 (_Builder._copy_servers); the graph built
    server by server is the truth: the same nodes, edges and attributes, in the same order (node
    and neighbour order are what routing reads, edge ids what the flow network indexes)."""
    from sim.topology.graph import _Builder
    topo = load_topology(name)
    n = 1 if topo.fabric is None or topo.fabric.kind == "none" else min(topo.max_nodes or 5, 5)
    for nodes in sorted({1, min(2, n), n}):   # (the copy leaves the fabric to _build_fabric)
        fast, slow = _Builder(topo, nodes), _Builder(topo, nodes, replicate=False)
        fast.build()
        slow.build()
        assert list(fast.nodes.items()) == list(slow.nodes.items())
        assert [(u, v, list(d.items())) for u, v, d in fast.edge_attrs] == \
               [(u, v, list(d.items())) for u, v, d in slow.edge_attrs]
        assert [list(a.items()) for a in fast.nodes.values()] == [list(a.items()) for a in slow.nodes.values()]
        assert [list(a.items()) for a in fast.nodes.values()] != [] and nodes * topo.gpus_per_node == \
            sum(a["kind"] == "gpu" for a in fast.nodes.values())
        assert fast.G.graph == slow.G.graph
    # build_graph fills the DiGraph's dicts itself (graph._fill); networkx's own calls are the truth
    G = build_graph(topo, n)
    slow.G.add_nodes_from(slow.nodes.items())
    slow.G.add_edges_from(slow.edge_attrs)
    H = slow.G
    assert list(G.nodes(data=True)) == list(H.nodes(data=True))
    assert [list(d.items()) for _, d in G.nodes(data=True)] == [list(d.items()) for _, d in H.nodes(data=True)]
    assert [(u, list(G.succ[u]), list(G.pred[u])) for u in G] == [(u, list(H.succ[u]), list(H.pred[u])) for u in H]
    assert [(u, v, list(d.items())) for u, v, d in G.edges(data=True)] == \
           [(u, v, list(d.items())) for u, v, d in H.edges(data=True)]
    assert all(G.pred[v][u] is G.succ[u][v] for u, v in G.edges)     # one dict per edge, as networkx
    assert G.number_of_edges() == H.number_of_edges() == len(G.graph["edge_list"]) > 0
    assert G.graph["edge_list"] == [(u, v) for u, v, _ in slow.edge_attrs]
    # any other graph class gets networkx's public calls
    import networkx as nx

    from sim.topology.graph import _fill

    class Sub(nx.DiGraph):
        pass

    S = Sub()
    _fill(S, slow.nodes, slow.edge_attrs)
    assert list(S.nodes(data=True)) == list(H.nodes(data=True))
    assert list(S.edges(data=True)) == list(H.edges(data=True))


@pytest.mark.parametrize("name,network", [("gpt3-175b-a100x64", "flow"),
                                          ("mixtral-8x7b-h100x64-dualpipe", "flow"),
                                          ("llama3-8b-h100x8-zbv", "analytical")])
def test_a_step_leaves_almost_no_cyclic_garbage(name, network):
    """simulate() pauses the cyclic garbage collector (sim.engine.simulate.cyclic_gc_paused):
    right only while the engine frees what it makes by reference counting. A step's garbage
    that only the collector can free, once its result is dropped: a few objects (SimPy's
    Environment and its bound methods), not something per instruction, flow or rank."""
    import gc

    from sim.config import load_scenario
    from sim.engine.simulate import simulate

    sc = load_scenario(name, overrides=[f"simulation.network={network}"])
    gc.collect()
    assert gc.isenabled()
    res = simulate(sc)
    assert gc.isenabled()                              # as it was before the step
    assert res.events > 5_000 and res.engine.records   # a real step, its records made on demand
    del res
    gc.set_debug(gc.DEBUG_SAVEALL)                     # keep what the collector finds, to count it
    try:
        gc.collect()
        garbage = len(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert garbage < 200, garbage


def test_a_step_hands_its_objects_to_the_oldest_generation():
    """On leaving the pause, what the step allocated moves to the oldest generation (gc.freeze
    then gc.unfreeze) instead of waiting for a young collection that would scan all of it: the
    young generations are empty, nothing stays frozen, and a user's own frozen objects (a
    freeze count before the step) are left as they were."""
    import gc

    from sim.engine.simulate import cyclic_gc_paused

    gc.collect()
    with cyclic_gc_paused():
        kept = [[i] for i in range(50_000)]            # tracked containers that survive
    assert gc.isenabled() and gc.get_freeze_count() == 0
    old = {id(o) for o in gc.get_objects(generation=2)}
    assert all(id(x) in old for x in kept)             # no young collection scanned them
    del kept
    gc.freeze()                                        # a user who froze objects before
    try:
        frozen = gc.get_freeze_count()
        with cyclic_gc_paused():
            kept = [[i] for i in range(1_000)]
        assert gc.get_freeze_count() == frozen         # theirs stay frozen; ours were not moved
    finally:
        gc.unfreeze()
    assert kept


# (scenario, overrides, whether layers become blocks: not with TP comm overlap (its waits are
# placed after the layer's instructions); with interference or barriers (ranks: all) they are
# expanded in the engine)
BLOCK_CASES = [("llama3-8b-h100x16-1f1b", [], True), ("gpt-1.7b-a100x8-gpipe", ["simulation.network=analytical"], True),
               ("llama3-8b-h100x16-1f1b", ["simulation.network=analytical"], True),
               ("gpt3-175b-a100x64", ["training.global_batch_size=64"], True),
               ("mixtral-8x7b-h200x16-dualpipev", [], True),
               # a pair's backward launching its own calls (its handles renamed in the pair)
               ("mixtral-8x7b-h200x16-dualpipev", ["training.tp_async_backward=true"], True),
               ("llama3-8b-h100x16-1f1b", ["training.tp_comm_overlap=true"], False),
               ("llama3-8b-h100x16-1f1b", ["simulation.comm_compute_slowdown=0.1"], True),
               ("llama3-8b-h100x16-1f1b", ["simulation.ranks=all"], True),
               ("llama3-8b-h100x64-cp4-32k", ["training.global_batch_size=16"], True),
               # EP groups = DP groups, gradient reduction in flight during the backward's
               # all-to-alls (the network's prepare cannot reuse a template's scan there)
               ("mixtral-8x7b-h200x16-dualpipev", ["parallelism.pipeline_schedule=1f1b",
                                                   "training.overlap_grad_reduce=true",
                                                   "simulation.network=flow"], True)]


def _programs(sc, blocks):
    from sim import schedules
    from sim.engine.costs import DeviceCostModel
    from sim.engine.program import ProgramBuilder

    p = sc.parallelism
    sched = schedules.build(p.pipeline_schedule, p.pp, sc.derived.num_microbatches, p.vpp)
    return ProgramBuilder(sc, sched, DeviceCostModel(sc), blocks=blocks).build()


@pytest.mark.parametrize("name,overrides,has_blocks", BLOCK_CASES)
def test_layer_blocks_are_the_instructions_made_one_by_one(name, overrides, has_blocks):
    """A Block (a layer instance of kernels, blocking collectives and marks, kept whole; or
    DualPipe's overlapped pair of two such instances) expands to the instructions the builder
    makes without blocks (launch handles compared by where they first appear); in the engine it
    gives the same step,
    instruction count, records in the same order and busy intervals (compiled once per
    template and placed whole into a run, or expanded where its calls are not fixed-time)."""
    from sim.config import load_scenario
    from sim.engine.core import Block, expand_blocks, instruction_count
    from sim.engine.netmodel import network_for

    sc = load_scenario(name, overrides=overrides)
    plain, blocked = _programs(sc, False), _programs(sc, True)
    assert list(plain) == list(blocked)
    n_blocks = sum(type(x) is Block for prog in blocked.values() for x in prog)
    for r in plain:
        assert _canonical(expand_blocks(blocked[r])) == _canonical(plain[r]), r
        assert instruction_count(blocked[r]) == len(plain[r])
    assert (n_blocks > 0) == has_blocks
    if sc.parallelism.pipeline_schedule.startswith("dualpipe"):     # overlapped pairs as one Block
        assert any(type(x) is Block and type(x.mb) is tuple for prog in blocked.values() for x in prog)
    assert network_for(sc)._scan(blocked) == network_for(sc)._scan(plain)   # a template's scan reused
    a = Engine(plain, network_for(sc), comm_compute_slowdown=sc.simulation.comm_compute_slowdown)
    b = Engine(blocked, network_for(sc), comm_compute_slowdown=sc.simulation.comm_compute_slowdown)
    assert a.run() == b.run()
    assert a.events == b.events
    assert _intervals(a) == _intervals(b)
    ra, rb = a.records, b.records
    assert len(ra) == len(rb)
    bad = next((i for i, (x, y) in enumerate(zip(ra, rb)) if x != y), None)
    assert bad is None, f"record {bad}: {ra[bad]} against {rb[bad]}"


def _intervals(engine) -> dict:
    """An engine's busy intervals (int64 arrays, or lists from the Python) as lists, in order."""
    return {rank: tuple(list(map(int, x)) for x in four) for rank, four in engine.busy_intervals().items()}


def _canonical(program) -> list:
    """A program with each launch handle replaced by the order of its first appearance (handles
    only name a call for its wait; their values are the builder's bookkeeping)."""
    from sim.engine.core import Launch, Wait

    seen: dict = {}
    out = []
    for x in program:
        if type(x) in (Launch, Wait):
            x = x._replace(handle=seen.setdefault(x.handle, len(seen)))
        out.append(x)
    return out


ACTION_CASES = BLOCK_CASES + [
    ("llama3-8b-h100x8-zbv", [], True),                                      # I / W split (ZB-V)
    ("gpt-7.5b-a100x32-zbh2", ["training.global_batch_size=32"], True),      # ZB-H2
    ("gpt-1.7b-a100x8-gpipe", ["training.overlap_grad_reduce=true"], True),  # each last backward per layer
    ("llama3-8b-h100x16-1f1b", ["parallelism.zero_stage=3"], True),          # FSDP: per layer
    ("llama3-8b-h100x16-1f1b", ["training.recompute=full"], True),
    ("llama3-8b-h100x16-1f1b", ["training.tp_async_backward=true"], True),
]


@pytest.mark.parametrize("name,overrides,_", ACTION_CASES)
def test_action_templates_make_the_per_layer_instructions(name, overrides, _):
    """A pipeline action made from one template (its layers, embedding, head and activation
    mark) gives the instructions the builder makes layer by layer, in the same order with the
    same names, calls and times (launch handles compared by where they first appear), and the
    engine the same step, records and busy intervals."""
    from sim import schedules
    from sim.config import load_scenario
    from sim.engine.costs import DeviceCostModel
    from sim.engine.netmodel import network_for
    from sim.engine.program import ProgramBuilder

    sc = load_scenario(name, overrides=overrides)
    p = sc.parallelism
    sched = schedules.build(p.pipeline_schedule, p.pp, sc.derived.num_microbatches, p.vpp)
    made = {}
    for actions in (True, False):
        b = ProgramBuilder(sc, sched, DeviceCostModel(sc))
        b.actions = actions
        made[actions] = b.build()
    assert list(made[True]) == list(made[False])
    for r in made[True]:
        assert _canonical(made[True][r]) == _canonical(made[False][r]), r
    a, b = (Engine(made[x], network_for(sc), comm_compute_slowdown=sc.simulation.comm_compute_slowdown)
            for x in (True, False))
    assert a.run() == b.run()
    assert a.events == b.events
    assert _intervals(a) == _intervals(b)
    assert a.records == b.records


@pytest.mark.parametrize("busy", [False, True])
def test_a_block_on_a_busy_stream(busy):
    """A Block launching on the "tp" stream while a call launched before it on that stream may
    still run: the program is compiled instruction by instruction instead (hand-worked: the
    block's call queues behind the 10 ns one). Without that call the block joins the run whole;
    both give the plain engine's records."""
    from sim.engine.core import Block, Template, _Run, expand_blocks

    tmpl = Template([Compute(2, "k1 mb\x00"), Launch("c", _fixed(3), "call mb\x00", "tp"),
                     Compute(1, "k2"), Wait("c"), Compute(1, "k3 mb\x00")])
    assert tmpl.simple
    head = [Launch("long", _fixed(10), "long", "tp"), Compute(1, "k0")] if busy else [Compute(1, "k0")]
    tail = [Wait("long")] if busy else []
    prog = head + [Block(tmpl, "7", 1), Block(tmpl, "8", 2)] + tail
    flat = expand_blocks(prog)
    assert [x.name for x in flat if type(x) is Compute][:3] == ["k0", "k1 mb7", "k2"]
    fast, plain = Engine({0: prog}, _HalfFixed()), Engine({0: flat}, _ProcessOnly())
    # busy: k0 [0,1], k1 [1,3], call queued behind "long" [3->10, 13], k2 [3,4], wait to 13,
    # k3 [13,14], k1 [14,16], call [16,19], k2 [16,17], wait 19, k3 [19,20]; free: the call
    # [3,6], wait 6, k3 [6,7], then the second block 6 ns later
    assert fast.run() == plain.run() == (20 if busy else 13)
    assert sorted(fast.records) == sorted(plain.records)
    compiled, _ = fast._compile(0, prog)
    assert len(compiled) == 1 and type(compiled[0]) is _Run and compiled[0].count == len(flat)
    assert any(p[0] is None for p in compiled[0].parts) == (not busy)     # kept whole when free


@pytest.mark.parametrize("name,overrides,steps", [("gpt3-175b-a100x64", ["training.global_batch_size=64"], False),
                                                  ("llama3-8b-h100x16-1f1b", [], False),
                                                  ("llama3-8b-h100x16-1f1b", [], True),
                                                  ("mixtral-8x7b-h200x16-dualpipev", [], False)])
def test_calls_started_without_a_process_keep_every_time(name, overrides, steps, monkeypatch):
    """A call on a free stream starts at once through the network's `start` (callbacks, no SimPy
    process): the same step, breakdowns and records as every such call run by a process. With
    `steps`, every collective runs its ring steps as phases one after another (several batches
    per call)."""
    from sim.config import load_scenario
    from sim.engine import netmodel
    from sim.engine.netmodel import ClusterNetwork
    from sim.engine.simulate import simulate

    sc = load_scenario(name, overrides=overrides)
    if steps:
        from sim.network.collectives import plan_collective

        def plan(self, spec):
            key = (spec.op, spec.ranks, spec.size_bytes)
            if key not in self._plans:
                self._plans[key] = plan_collective(self.graph, spec.op, [self.gpu(r) for r in spec.ranks],
                                                   int(spec.size_bytes), granularity="step")
            return self._plans[key]

        monkeypatch.setattr(ClusterNetwork, "plan", plan)
        monkeypatch.setattr(netmodel, "_GRAPHS", {})        # no cached alone times of other plans
    used = []
    real = ClusterNetwork.start

    def counted(self, env, spec, finish):
        used.append(spec.tag)
        return real(self, env, spec, finish)

    monkeypatch.setattr(ClusterNetwork, "start", counted)
    fast = simulate(sc)
    monkeypatch.setattr(ClusterNetwork, "start", None)         # every such call in a process
    plain = simulate(sc)
    assert used
    assert fast.makespan_ns == plain.makespan_ns and fast.breakdowns == plain.breakdowns
    ra, rb = sorted(fast.records), sorted(plain.records)
    bad = next((i for i, (x, y) in enumerate(zip(ra, rb)) if x != y), None)
    assert len(ra) == len(rb) and bad is None, bad


def test_network_locality_counts_hand_worked():
    """benchmarks/network.py --locality on a hand-worked case (2 DGX H100 nodes): flows a (1 MB)
    and b (2 MB) share GPU 0's NIC rail (50 GB/s, 25 each); c (10 MB) crosses rail 2 alone (50).
    a ends first (at its rate 25, the lowest ending rate): b and c are at or above it, so both are
    recomputed, and only b's rate changes (25 -> 50). Then b ends: c alone, recomputed, unchanged."""
    spec = importlib.util.spec_from_file_location("network_bench", REPO / "benchmarks" / "network.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    G = build_graph(load_topology("dgx-h100-ndr"), 2)
    got = mod.locality(G, [("n0.gpu0", "n1.gpu0", 1 << 20), ("n0.gpu0", "n1.gpu0", 2 << 20),
                           ("n0.gpu2", "n1.gpu2", 10 << 20)])
    assert got.tolist() == [[2, 2, 1], [1, 1, 0]]
