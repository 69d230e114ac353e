"""The flow network's max-min filling: the compiled kernel (sim/network/_maxmin.c), the numpy
filling and the Python-floats filling give the same rates bit for bit, and those rates are the
correctly rounded max-min fair ones where a hand computation gives them exactly."""

from __future__ import annotations

import os
from fractions import Fraction

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

import sim.network.flow as flow
from sim.errors import InternalError
from sim.network import FlowNetwork
from sim.topology import load_topology
from sim.topology.graph import build_graph

compiled = pytest.mark.skipif(flow._maxmin is None, reason="the compiled kernel is not built here")


def test_the_kernel_is_built_where_ci_requires_it():
    """CI (.ci/run) installs with a C compiler and sets SIM5D_REQUIRE_KERNEL: a build that
    silently fell back to numpy fails here rather than only running slower."""
    if not os.environ.get("SIM5D_REQUIRE_KERNEL"):
        pytest.skip("SIM5D_REQUIRE_KERNEL not set")
    assert flow.KERNEL == "compiled"


def _three_ways(capacity, flow_of, edge_of, n_flows, max_rate, level):
    """(compiled or None, numpy, Python floats) fillings of one problem."""
    E = capacity.shape[0]
    capped = np.flatnonzero(np.isfinite(max_rate))
    cap = np.concatenate([capacity, max_rate[capped]])
    fo = np.concatenate([flow_of, capped])
    eo = np.concatenate([edge_of, E + np.arange(capped.size)])
    got = flow.max_min_rates(capacity, flow_of, edge_of, n_flows, max_rate, start_level=level)
    small = flow._fill_small(cap, fo.tolist(), eo.tolist(), n_flows, float(level))
    saved = flow._SMALL_ENTRIES
    flow._SMALL_ENTRIES = -1
    try:
        big = flow._fill_numpy(cap, fo, eo, n_flows, level, None)
    finally:
        flow._SMALL_ENTRIES = saved
    return got, big, small


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_compiled_numpy_and_python_fillings_are_equal_bit_for_bit(data):
    """Random problems with ties (few distinct capacities), caps and start levels, some above a
    link's fair share (the partial re-solve's floor): the same rates and iteration counts from
    the compiled kernel (where built), the numpy filling and the Python-floats one (which the
    flow network uses for up to 64 entries)."""
    n_links = data.draw(st.integers(1, 30))
    caps = data.draw(st.lists(st.sampled_from([12.5, 25.0, 50.0, 100.0, 0.1, 3.3, 7.77]) | st.floats(0.01, 500),
                              min_size=n_links, max_size=n_links))
    paths = data.draw(st.lists(st.lists(st.integers(0, n_links - 1), min_size=1, max_size=6, unique=True),
                               min_size=1, max_size=60))
    flow_of = np.repeat(np.arange(len(paths)), [len(p) for p in paths])
    edge_of = np.array([e for p in paths for e in p], dtype=np.int64)
    max_rate = np.array(data.draw(st.lists(st.sampled_from([np.inf, np.inf, np.inf, 5.0, 0.7]),
                                           min_size=len(paths), max_size=len(paths))))
    level = data.draw(st.sampled_from([0.0, 0.05, 1.0 / 3.0, 2.0]))
    got, big, small = _three_ways(np.array(caps), flow_of, edge_of, len(paths), max_rate, level)
    assert got[1] == big[1] == small[1]
    assert got[0].tobytes() == big[0].tobytes() == small[0].tobytes()
    assert (got[0] >= level).all()


@compiled
def test_compiled_and_numpy_fillings_equal_on_thousands_of_flows():
    """Problems of the size the flow network meets (thousands of flows, hundreds of links), some
    with their entries shuffled."""
    rng = np.random.default_rng(7)
    for trial in range(12):
        E, F = int(rng.integers(50, 400)), int(rng.integers(500, 4000))
        caps = rng.choice([12.5, 25.0, 50.0, 400.0], E) if trial % 2 else rng.uniform(0.1, 500, E)
        lens = rng.integers(1, 8, F)
        edge_of = np.concatenate([rng.choice(E, n, replace=False) for n in lens])
        flow_of = np.repeat(np.arange(F), lens)
        if trial % 4 == 1:                      # entries in any order, not grouped by flow
            order = rng.permutation(flow_of.size)
            flow_of, edge_of = flow_of[order], edge_of[order]
        max_rate = np.where(rng.random(F) < 0.1, rng.choice([5.0, 0.7, 33.0], F), np.inf)
        got, big, _ = _three_ways(caps, flow_of, edge_of, F, max_rate, [0.0, 0.05, 1 / 3][trial % 3])
        assert got[1] == big[1]
        assert got[0].tobytes() == big[0].tobytes()


@pytest.mark.parametrize("cap_a, cap_b, n_a, n_b", [(1.0, 0.1, 7, 3), (0.7, 0.3, 5, 3), (2.3, 0.7, 10, 4),
                                                     (1.1, 0.2, 7, 2)])
def test_second_level_rates_are_the_correctly_rounded_exact_ones(cap_a, cap_b, n_a, n_b):
    """n_b of the n_a flows on link a also cross link b, the bottleneck: they get cap_b / n_b and
    the others (cap_a - cap_b) / (n_a - n_b), computed exactly with fractions and rounded once.
    (A filling that sums per-level increments rounds at each level: 0.22499999999999998 for the
    first case, where the exact rate 0.9 / 4 is 0.225.)"""
    flow_of = [f for f in range(n_a) for _ in range(2 if f < n_b else 1)]
    edge_of = [e for f in range(n_a) for e in ((0, 1) if f < n_b else (0,))]
    rate, it = flow.max_min_rates(np.array([cap_a, cap_b]), np.array(flow_of), np.array(edge_of), n_a)
    assert it == 2
    assert rate[:n_b].tolist() == [float(Fraction(cap_b) / n_b)] * n_b
    assert rate[n_b:].tolist() == [float((Fraction(cap_a) - n_b * Fraction(float(Fraction(cap_b) / n_b)))
                                         / (n_a - n_b))] * (n_a - n_b)
    if (cap_a, n_a, n_b) == (1.0, 7, 3):
        assert rate[-1] == 0.225


@compiled
def test_a_nan_capacity_is_reported_by_every_filling():
    for fill in ("compiled", "numpy"):
        saved = flow._maxmin
        if fill == "numpy":
            flow._maxmin = None
        try:
            with pytest.raises(InternalError, match="froze no flow"):
                flow.max_min_rates(np.array([10.0, np.nan]), np.array([0, 1, 1]), np.array([0, 0, 1]), 2)
        finally:
            flow._maxmin = saved


def _random_traffic(nodes: int, n: int, *, seed: int, most_bytes: int) -> tuple:
    """(the graph of `nodes` DGX H100 servers, its GPUs, and n random flows as source GPU
    numbers, destination GPU numbers (never the source) and sizes from 64 KiB to most_bytes)."""
    G = build_graph(load_topology("dgx-h100-ndr"), nodes)
    gpus = G.graph["gpus"]
    rng = np.random.default_rng(seed)
    src = rng.integers(0, len(gpus), n)
    dst = (src + rng.integers(1, len(gpus), n)) % len(gpus)
    return G, gpus, src, dst, rng.integers(1 << 16, most_bytes, n)


@compiled
def test_the_network_ends_every_flow_at_the_same_ns_with_either_filling():
    """600 random flows (the partial re-solve after each end: compiled `resolve` against the numpy
    steps): the same end time for every flow and the same iteration count."""
    G, gpus, src, dst, size = _random_traffic(16, 600, seed=5, most_bytes=16 << 20)

    def run():
        env = simpy.Environment()
        net = FlowNetwork(env, G, record=True)
        for i, (s, d, b) in enumerate(zip(src, dst, size)):
            net.transfer(gpus[s], gpus[d], int(b), max_rate_gbps=20.0 if i % 9 == 0 else None)
        env.run()
        return [(r.name, r.end_ns) for r in net.log], net.iterations, net.solves

    got = run()
    saved = flow._maxmin
    flow._maxmin = None
    try:
        want = run()
    finally:
        flow._maxmin = saved
    assert got == want
    assert got[2] > 500


@compiled
def test_bad_arrays_are_refused_not_read_out_of_bounds():
    k = flow._maxmin
    rate = np.zeros(2)
    with pytest.raises(ValueError, match="out of range"):
        k.fill(np.array([1.0]), np.array([0, 1]), np.array([0, 5]), 2, 0.0, np.zeros(0), rate)
    with pytest.raises(ValueError, match="out of range"):
        k.fill(np.array([1.0]), np.array([0, 2]), np.array([0, 0]), 2, 0.0, np.zeros(0), rate)
    with pytest.raises(ValueError, match="one number per flow"):
        k.fill(np.array([1.0]), np.array([0, 1]), np.array([0, 0]), 2, 0.0, np.ones(3), rate)
    with pytest.raises(ValueError, match="out of range"):
        k.resolve(np.array([5.0]), np.array([0, 9]), np.array([1, 1]), np.array([1.0, 2.0]), np.full(2, np.inf),
                  1.5, rate.copy())
    with pytest.raises(ValueError, match="add up"):
        k.keep_entries(np.array([0, 1]), np.array([1, 2]), np.ones(2, dtype=bool), np.empty(2, dtype=np.int64))
    with pytest.raises(ValueError, match="add up"):
        k.resolve(np.array([1.0]), np.array([0, 0]), np.array([1, 2]), rate, np.full(2, np.inf), 0.5, rate.copy())


@compiled
def test_capped_flows_on_links_of_their_own_are_filled_within_the_kernel_s_memory():
    """More links than entries: 3,000 flows, each alone on its own link and capped (each cap a
    private link too, so 6,000 links for 3,000 entries). The compiled fill's scratch memory
    held 2 numbers for the F + 1 flow starts, and the links' capacities laid out after them ran
    past its end here (glibc aborted the process, now and then, on a later allocation; found by
    tests/test_network_alone.py's random traffic). The same rates as numpy's filling, for
    several sizes in a row (each reusing the memory the last one grew)."""
    for F in (3000, 10, 2999, 4000):
        capacity = np.linspace(1.0, 2.0, F)
        caps = np.where(np.arange(F) % 2 == 0, 0.5, 1.5)
        got, big, _ = _three_ways(capacity, np.arange(F), np.arange(F), F, caps, 0.0)
        assert got[0].tolist() == big[0].tolist() == np.minimum(capacity, caps).tolist()


@compiled
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 40), min_size=0, max_size=6),
                          st.floats(1e-6, 1e6, allow_nan=False)), max_size=300),
       st.integers(41, 60))
def test_link_sums_are_numpys_bincount_bit_for_bit(flows, n):
    """The compiled per-link sums of a solve's rates (sim.network.link_load's dense sums) add
    each flow's rate on its links in the flows' order, as np.bincount over the repeated rates
    does: the same floats, on random paths (repeated links within a path included) and rates
    of twelve orders of magnitude."""
    lens = np.array([len(p) for p, _ in flows], dtype=np.int64)
    edges = np.array([e for p, _ in flows for e in p], dtype=np.int64)
    rates = np.array([r for _, r in flows], dtype=np.float64)
    got = np.zeros(n)
    flow._maxmin.link_sums(edges, lens, rates, got)
    want = np.bincount(edges, weights=np.repeat(rates, lens), minlength=n)
    assert got.tobytes() == want.tobytes()


@compiled
def test_link_sums_refuse_bad_arrays():
    k = flow._maxmin
    with pytest.raises(ValueError, match="out of range"):
        k.link_sums(np.array([0, 7]), np.array([2]), np.array([1.0]), np.zeros(5))
    with pytest.raises(ValueError, match="add up"):
        k.link_sums(np.array([0, 1]), np.array([1, 2]), np.array([1.0, 2.0]), np.zeros(5))
    with pytest.raises(ValueError, match="add up"):
        k.link_sums(np.array([0, 1, 2]), np.array([1, 1]), np.array([1.0, 2.0]), np.zeros(5))
    with pytest.raises(ValueError, match="one rate per flow"):
        k.link_sums(np.array([0, 1]), np.array([1, 1]), np.array([1.0]), np.zeros(5))


@compiled
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 40), min_size=0, max_size=6), st.integers(0, 20)),
                max_size=300),
       st.integers(0, 20))
def test_mark_live_marks_the_links_numpy_marks(flows, now):
    """The compiled marking of the links that the shared set's flows still running hold
    (finish > now) sets the same mask as numpy's repeat, selection and scatter, on random paths
    (repeated links within one included), and leaves the rest of the mask as it was."""
    lens = np.array([len(p) for p, _ in flows], dtype=np.int64)
    edges = np.array([e for p, _ in flows for e in p], dtype=np.int64)
    finish = np.array([f for _, f in flows], dtype=np.int64)
    got = np.zeros(50, dtype=bool)
    got[45] = True                              # (set before: kept)
    want = got.copy()
    flow._maxmin.mark_live(edges, lens, finish, now, got)
    want[edges[np.repeat(finish > now, lens)]] = True
    assert got.tolist() == want.tolist()


@compiled
def test_mark_live_refuses_bad_arrays():
    k = flow._maxmin
    mask = np.zeros(5, dtype=bool)
    with pytest.raises(ValueError, match="outside the mask"):
        k.mark_live(np.array([0, 7]), np.array([2]), np.array([9]), 0, mask)
    with pytest.raises(ValueError, match="add up"):
        k.mark_live(np.array([0, 1]), np.array([1, 2]), np.array([9, 9]), 0, mask)
    with pytest.raises(ValueError, match="one finish time per flow"):
        k.mark_live(np.array([0, 1]), np.array([1, 1]), np.array([9]), 0, mask)


def test_remembered_solves_are_checked_against_their_problem(monkeypatch):
    """The flow network remembers each max-min problem's rates under a key of its arrays' CRC-32s
    and checks the arrays on a hit. Three rounds of the same 200 flows among 64 GPUs (each round
    a problem solved before): the same ends and iteration count with the memo's CRC keys, with
    keys of the arrays' bytes, and with one key for every problem (a hit not checked hands one
    problem's rates to another: with the check removed this fails). The memo saves fills."""
    G, gpus, src, dst, size = _random_traffic(8, 200, seed=11, most_bytes=8 << 20)

    def run():
        env = simpy.Environment()
        net = FlowNetwork(env, G, record=True)
        fills = []
        fill = net._fill
        net._fill = lambda *a: fills.append(1) or fill(*a)

        def rounds():
            for k in range(3):
                events = [net.transfer(gpus[s], gpus[d], int(b), name=f"{k}:{i}")
                          for i, (s, d, b) in enumerate(zip(src, dst, size))]
                yield simpy.AllOf(env, events)
        env.process(rounds())
        env.run()
        return [(r.name, r.end_ns) for r in net.log], net.iterations, net.solves, len(fills)

    if flow._crc32 is None:
        pytest.skip("the isal package is missing: the keys are the arrays' bytes")
    crc = run()
    monkeypatch.setattr(flow, "_crc32", None)
    plain = run()
    monkeypatch.undo()
    key = flow._problem_key
    monkeypatch.setattr(flow, "_problem_key", lambda *a: ((0,), key(*a)[1]))    # one key for every problem
    colliding = run()
    assert crc[:3] == plain[:3] == colliding[:3]
    assert crc[3] == plain[3] < colliding[3] and crc[2] > 100
