"""The flow model: max-min sharing, full duplex, integer ns, analytical mode, determinism."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from sim.errors import ConfigError
from sim.network import FlowNetwork, max_min_rates
from sim.topology import load_topology
from sim.topology.graph import build_graph


@pytest.fixture(scope="module")
def a100x2():
    return build_graph(load_topology("dgx-a100-hdr"), 2)


def _run(G, transfers, mode="flow", starts=None):
    env = simpy.Environment()
    net = FlowNetwork(env, G, mode=mode, record=True)
    log = []

    def go(name, src, dst, nbytes, delay):
        if delay:
            yield env.timeout(delay)
        res = yield net.transfer(src, dst, nbytes, name=name)
        log.append((name, env.now))
        assert res.end_ns == env.now

    for i, (name, src, dst, nbytes) in enumerate(transfers):
        env.process(go(name, src, dst, nbytes, (starts or {}).get(name, 0)))
    env.run()
    return log, net


def test_two_flows_share_a_link_and_a_third_is_unaffected(a100x2):
    S = 230_000_000  # 1 ms alone on a 230 GB/s NVLink
    lat = 600        # GPU->NVSwitch->GPU: 2 x 300 ns
    log, _ = _run(a100x2, [("A", "n0.gpu0", "n0.gpu1", S), ("B", "n0.gpu0", "n0.gpu2", S),
                           ("C", "n0.gpu3", "n0.gpu4", S)])
    # A and B share gpu0's NVLink egress: half each, 2 ms; C alone: 1 ms.
    assert log == [("C", 1_000_000 + lat), ("A", 2_000_000 + lat), ("B", 2_000_000 + lat)]


def test_full_duplex(a100x2):
    S = 230_000_000
    log, _ = _run(a100x2, [("AB", "n0.gpu0", "n0.gpu1", S), ("BA", "n0.gpu1", "n0.gpu0", S)])
    assert log == [("AB", 1_000_600), ("BA", 1_000_600)]  # opposite directions do not share


def test_rates_reallocated_when_a_flow_ends(a100x2):
    S = 230_000_000
    # B is half the size: both at 115 GB/s until B ends at 1 ms, then A alone at 230 GB/s.
    log, net = _run(a100x2, [("A", "n0.gpu0", "n0.gpu1", S), ("B", "n0.gpu0", "n0.gpu2", S // 2)])
    assert log == [("B", 1_000_600), ("A", 1_500_600)]
    assert net.completed == 2


def test_late_arrival_slows_the_running_flow(a100x2):
    S = 230_000_000
    log, _ = _run(a100x2, [("A", "n0.gpu0", "n0.gpu1", S), ("B", "n0.gpu0", "n0.gpu2", S)],
                  starts={"B": 500_000})
    # A: 0.5 ms alone (half done), then shares: its other half at 115 GB/s takes 1 ms. B got half
    # its bytes in that 1 ms and sends the rest alone at 230 GB/s in 0.5 ms.
    assert log == [("A", 1_500_600), ("B", 2_000_600)]


def test_inter_node_flow_bounded_by_the_nic(a100x2):
    S = 24_000_000  # 1 ms at HDR's 24 GB/s
    log, net = _run(a100x2, [("X", "n0.gpu0", "n1.gpu0", S)])
    lat = net.router.path_latency_ns(net.router.path("n0.gpu0", "n1.gpu0"))
    assert log == [("X", 1_000_000 + lat)]


def test_analytical_mode_ignores_sharing(a100x2):
    S = 230_000_000
    log, _ = _run(a100x2, [("A", "n0.gpu0", "n0.gpu1", S), ("B", "n0.gpu0", "n0.gpu2", S)],
                  mode="analytical")
    assert log == [("A", 1_000_600), ("B", 1_000_600)]


def test_integer_ns_and_ceil(a100x2):
    log, _ = _run(a100x2, [("tiny", "n0.gpu0", "n0.gpu1", 1)])
    assert log == [("tiny", 1 + 600)]  # 1 byte at 230 B/ns rounds up to 1 ns
    assert all(isinstance(t, int) for _, t in log)


def test_zero_bytes_and_bad_sizes(a100x2):
    log, _ = _run(a100x2, [("z", "n0.gpu0", "n0.gpu1", 0)])
    assert log == [("z", 600)]
    env = simpy.Environment()
    net = FlowNetwork(env, a100x2)
    with pytest.raises(ConfigError):
        net.transfer("n0.gpu0", "n0.gpu1", -1)
    with pytest.raises(ConfigError):
        net.transfer("n0.gpu0", "n9.gpu1", 5)
    with pytest.raises(ConfigError, match="simulation.network"):
        FlowNetwork(env, a100x2, mode="fluid")


def test_max_min_progressive_filling_textbook():
    # Links: L0 cap 10, L1 cap 4. Flow 0 on L0; flow 1 on L0+L1; flow 2 on L1.
    rate, _ = max_min_rates(np.array([10.0, 4.0]), np.array([0, 1, 1, 2]), np.array([0, 0, 1, 1]), 3)
    assert rate.tolist() == [8.0, 2.0, 2.0]
    rate, _ = max_min_rates(np.array([10.0]), np.array([0, 1]), np.array([0, 0]), 2,
                            max_rate=np.array([1.0, np.inf]))
    assert rate.tolist() == [1.0, 9.0]


def test_many_flows_bit_for_bit_reproducible():
    G = build_graph(load_topology("dgx-h100-ndr"), 8)
    gpus = G.graph["gpus"]

    def once():
        rng = np.random.default_rng(7)
        env = simpy.Environment()
        net = FlowNetwork(env, G, record=True)
        for k in range(300):
            a, b = rng.choice(len(gpus), 2, replace=False)
            net.transfer(gpus[a], gpus[b], int(rng.integers(1, 50_000_000)), name=f"f{k}", key=k)
        env.run()
        return [(r.name, r.end_ns) for r in net.log]

    first = once()
    assert first == once()
    assert len(first) == 300


def test_a_remembered_solution_is_not_changed_by_later_flows(a100x2):
    """The list form keeps a remembered max-min solution as the current rates; a flow joining
    afterwards must not extend that list in place (it did: the memo then held a rate too many,
    and the same two flows later reported three rates)."""
    env = simpy.Environment()
    net = FlowNetwork(env, a100x2)
    seen = []

    def run():
        for _ in range(2):
            a = net.transfer("n0.gpu0", "n1.gpu0", 1 << 20)
            b = net.transfer("n0.gpu1", "n1.gpu1", 1 << 20)
            yield env.timeout(10)
            seen.append(sorted(net.current_rates()))
            c = net.transfer("n0.gpu2", "n1.gpu2", 1 << 20)     # joins while a and b's rates hold
            yield env.all_of([a, b, c])

    env.process(run())
    env.run()
    assert seen[0] == seen[1] and len(seen[0]) == 2
    for key, (rates, _) in net._memo.items():
        if len(key) == 3:                       # the list form's problems: one rate per flow
            assert len(rates) == len(key[0]), key


def test_a_remembered_solution_is_not_changed_by_ending_flows(a100x2):
    """Flows ending leave the list form by deleting their rows; the current rates may be a
    remembered solution's list, which must keep every rate (a deletion in place would leave the
    memo a rate short, and the same three flows would later get two rates). Hand-worked: three
    flows of 1, 2 and 4 MiB start together, the first ends first (one contiguous row), then the
    same three again."""
    env = simpy.Environment()
    net = FlowNetwork(env, a100x2)
    rates = []

    def run():
        for _ in range(2):
            evs = [net.transfer(f"n0.gpu{i}", f"n1.gpu{i}", (1 << 20) << i) for i in range(3)]
            yield env.timeout(1)
            rates.append(sorted(net.current_rates().values()))
            yield env.all_of(evs)

    env.process(run())
    env.run()
    assert rates[0] == rates[1] and len(rates[0]) == 3
    for key, (r, _) in net._memo.items():
        if len(key) == 3:
            assert len(r) == len(key[0]), key
