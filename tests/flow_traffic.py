"""Random flow-network traffic shared by the tests that run the same traffic two ways and
compare every flow's end (lists or arrays, batches alone or in the filling)."""

from __future__ import annotations

import numpy as np
import simpy
from hypothesis import strategies as st

from sim.network import FlowNetwork
from sim.topology import load_topology
from sim.topology.graph import build_graph
from sim.topology.routing import router_for

GRAPH2 = build_graph(load_topology("dgx-h100-ndr"), 2)
"""Two DGX H100 nodes (16 GPUs)."""


def draw_calls(data, max_calls: int) -> list:
    """1..max_calls calls: (source GPU, destination offset, bytes, start ns (ties too), cap GB/s
    or None, flows in the call, whether a batch has segments)."""
    n = data.draw(st.integers(1, max_calls))
    return data.draw(st.lists(st.tuples(
        st.integers(0, 15), st.integers(1, 15), st.integers(1, 1 << 27),
        st.integers(0, 4) | st.integers(0, 400_000),
        st.sampled_from([None, None, None, 7.5, 0.3]),
        st.integers(1, 6), st.booleans()), min_size=n, max_size=n))


def run_calls(calls: list, small_flows: int = 32, **options) -> tuple:
    """Run `calls` on GRAPH2: one flow a plain transfer (capped or not), more a batch (flow j
    `bytes + 999 j`, on ECMP key j; segments j % 2 where asked). Returns (the network's log as
    (name, start, end), each call's (end ns, result end, segment ends), the last time, solves,
    flows completed); `options` go to FlowNetwork."""
    G = GRAPH2
    gpus = G.graph["gpus"]
    router = router_for(G)
    env = simpy.Environment()
    net = FlowNetwork(env, G, record=True, **options)
    net.small_flows = small_flows
    ends = {}

    def go(i, src, off, nbytes, start, cap, k, seg):
        yield env.timeout(start)
        pairs = [(gpus[(src + j) % 16], gpus[(src + j + off) % 16]) for j in range(k)]
        if k == 1:
            res = yield net.transfer(*pairs[0], nbytes, max_rate_gbps=cap, name=f"c{i}")
        else:
            paths = [router.path(a, b, key=j) for j, (a, b) in enumerate(pairs)]
            edges = np.array([e for p in paths for e in p], dtype=np.int64)
            res = yield net.transfer_batch(edges, np.array([len(p) for p in paths]),
                                           [nbytes + 999 * j for j in range(k)],
                                           np.full(k, np.inf if cap is None else cap),
                                           [f"c{i}.{j}" for j in range(k)],
                                           segments=[j % 2 for j in range(k)] if seg else None)
        ends[i] = (env.now, res.end_ns, res.segment_ends)

    for i, c in enumerate(calls):
        env.process(go(i, *c))
    env.run()
    return [(r.name, r.start_ns, r.end_ns) for r in net.log], ends, env.now, net.solves, net.completed
