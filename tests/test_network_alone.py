"""Batches alone on their links (sim.network.flow, "batches alone"): a batch whose flows share no
link with any other live flow runs outside the max-min set, each flow at its narrowest link (or
its cap), until a later flow meets one of them. The truth: the same network with every flow in
the filling (`alone=False`), and hand-worked times."""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from hypothesis import given, settings, strategies as st

from flow_traffic import GRAPH2, draw_calls, run_calls
from sim.network import FlowNetwork
from sim.topology import load_topology
from sim.topology.graph import build_graph
from sim.topology.routing import router_for

S = 230_000_000             # 1 ms alone on an A100's 230 GB/s NVLink


@pytest.fixture(scope="module")
def a100x2():
    return build_graph(load_topology("dgx-a100-hdr"), 2)


def test_a_batch_alone_then_met_halfway(a100x2):
    """Hand-worked. A batch of two flows starts alone: gpu0->gpu1 S bytes (1 ms at 230 GB/s) and
    gpu2->gpu3 S/2 bytes (0.5 ms). At 0.75 ms C (gpu0->gpu4, S bytes) meets the first flow on
    gpu0's NVLink: the first flow's last S/4 goes at 115 GB/s (0.5 ms, ends at 1.25 ms, and with
    it the batch); C sends S/4 meanwhile and its last 3S/4 alone at 230 GB/s (0.75 ms, ends at
    2 ms). Before C the network solved nothing: the batch ran alone."""
    env = simpy.Environment()
    net = FlowNetwork(env, a100x2, record=True)
    router = router_for(a100x2)
    paths = [router.path("n0.gpu0", "n0.gpu1"), router.path("n0.gpu2", "n0.gpu3")]
    seen = {}

    def batch():
        edges = np.array([e for p in paths for e in p], dtype=np.int64)
        res = yield net.transfer_batch(edges, np.array([len(p) for p in paths]), [S, S // 2],
                                       np.full(2, np.inf), ["a", "b"], segments=[0, 1])
        seen["batch"] = (env.now, res.segment_ends)

    def probe():
        yield env.timeout(600_000)
        seen["rates"] = net.current_rates()
        seen["load"] = float(net.link_load().max())
        seen["active"] = net.active_flows
        seen["solves"] = net.solves
        yield env.timeout(150_000)
        c = yield net.transfer("n0.gpu0", "n0.gpu4", S, name="c", latency=False)
        seen["c"] = c.end_ns

    env.process(batch())
    env.process(probe())
    env.run()
    assert seen["solves"] == 0
    assert seen["rates"] == {"a": 230.0} and seen["load"] == 230.0 and seen["active"] == 1
    assert seen["batch"] == (1_250_000, (1_250_000, 500_000))
    assert seen["c"] == 2_000_000
    assert sorted((r.name, r.end_ns) for r in net.log) == [("a", 1_250_000), ("b", 500_000), ("c", 2_000_000)]
    assert net.completed == 3


def test_two_batches_meeting_at_their_start_share_from_the_start(a100x2):
    """Two single flows started at the same instant on gpu0's NVLink (neither alone): half the
    rate each, 2 ms; a third on other links alone: 1 ms."""
    env = simpy.Environment()
    net = FlowNetwork(env, a100x2)
    evs = [net.transfer("n0.gpu0", "n0.gpu1", S, latency=False), net.transfer("n0.gpu0", "n0.gpu2", S, latency=False),
           net.transfer("n0.gpu5", "n0.gpu6", S, latency=False)]
    env.run()
    assert [e.value.end_ns for e in evs] == [2_000_000, 2_000_000, 1_000_000]


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_alone_or_in_the_filling_every_flow_ends_at_the_same_nanosecond(data):
    """Random traffic on two nodes (single transfers, capped or not, and batches with segments,
    arriving over time, so batches start alone and are met later, some at the instant they
    start): every flow's end, every batch's segment ends and the step's end are the same as with
    every flow in the max-min filling, in list or array form."""
    calls = draw_calls(data, 25)

    def run(alone, small_flows=32):
        log, ends, last, _, completed = run_calls(calls, small_flows, alone=alone)
        return sorted(log), ends, last, completed         # (the log's order: when each was noted)

    want = run(False)
    assert want[3] == sum(c[5] for c in calls)
    assert run(True) == want
    assert run(True, small_flows=0) == want


@pytest.mark.parametrize("alone", [False, True])
def test_an_unrelated_flow_ending_does_not_move_a_flow_s_end(alone):
    """51,866,610 bytes capped at 0.3 GB/s take 172,888,700 ns exactly. A 1-byte flow on other
    links ends after 1 ns; the shared set then re-solves, and the capped flow keeps its rate, so
    it keeps its end. (It did not: the network re-derived every flow's bytes left at each solve,
    51866610 - 0.3 x 1 rounded, and this end came out 1 ns late; found by
    test_alone_or_in_the_filling_every_flow_ends_at_the_same_nanosecond.)"""
    G = GRAPH2
    gpus = G.graph["gpus"]
    router = router_for(G)
    env = simpy.Environment()
    net = FlowNetwork(env, G, alone=alone)
    a = net.transfer(gpus[0], gpus[1], 1, latency=False)
    b = net.transfer(gpus[1], gpus[2], 51_866_610, max_rate_gbps=0.3, latency=False)
    env.run()
    assert set(router.path(gpus[0], gpus[1])).isdisjoint(router.path(gpus[1], gpus[2]))
    assert a.value.end_ns == 1
    assert b.value.end_ns == 172_888_700


def test_a_flow_on_the_links_of_an_ended_flow_of_a_batch_alone_runs_alone_too(a100x2):
    """A batch alone: gpu0->gpu1 S bytes (1 ms) and gpu2->gpu3 S/2 (0.5 ms). At 0.6 ms a flow
    gpu2->gpu3 starts on the second flow's links, which that flow left at 0.5 ms: it meets no
    live flow, so it runs alone too (no solve at all) and takes 1 ms; the batch still ends at
    1 ms."""
    env = simpy.Environment()
    net = FlowNetwork(env, a100x2)
    router = router_for(a100x2)
    paths = [router.path("n0.gpu0", "n0.gpu1"), router.path("n0.gpu2", "n0.gpu3")]
    edges = np.array([e for p in paths for e in p], dtype=np.int64)
    batch = net.transfer_batch(edges, np.array([len(p) for p in paths]), [S, S // 2], np.full(2, np.inf),
                               ["a", "b"])
    seen = {}

    def late():
        yield env.timeout(600_000)
        res = yield net.transfer("n0.gpu2", "n0.gpu3", S, name="c", latency=False)
        seen["c"] = res.end_ns

    env.process(late())
    env.run()
    assert batch.value.end_ns == 1_000_000 and seen["c"] == 1_600_000
    assert net.solves == 0 and net.completed == 3
