"""The engine's network: engine CommSpecs (global ranks) -> collectives on the cluster graph.

`simulation.network: analytical` costs each call with sim.network.collectives.collective_time_ns
(latency + the busiest link of each phase on the real routes; cached per distinct call);
`flow` runs the call's flows on a shared FlowNetwork, so concurrent communication of the
simulated ranks (e.g. a DP gradient bucket and a PP send leaving through the same NIC) shares
link bandwidth max-min fairly.
"""

from __future__ import annotations

from sim.errors import InternalError
from sim.layout import Layout
from sim.network.collectives import collective_process, estimate_plan_ns, plan_collective
from sim.network.flow import FlowNetwork
from sim.topology.graph import build_graph, gpu_name
from sim.units import MAX_NS


_GRAPHS: dict = {}


def cluster_graph(topology, num_nodes: int):
    """The cluster graph of `topology` at `num_nodes`, built once per process (a sweep simulates
    thousands of layouts of one cluster). The graph is only read by the network model; the
    router and collective plans it caches in `G.graph` are pure functions of the graph."""
    key = (id(topology), num_nodes)
    hit = _GRAPHS.get(key)
    if hit is None or hit[0] is not topology:
        if len(_GRAPHS) >= 16:
            _GRAPHS.clear()
        hit = _GRAPHS[key] = (topology, build_graph(topology, num_nodes))
    return hit[1]


class ClusterNetwork:
    def __init__(self, sc, layout: Layout | None = None):
        self.layout = layout or Layout.from_scenario(sc)
        self.graph = cluster_graph(sc.cluster.topology, sc.cluster.num_nodes)
        self.mode = sc.simulation.network
        self.net = None
        self._plans: dict = {}
        self._ns: dict = {}

    def bind(self, env) -> None:
        """Attach to the engine's SimPy environment (the flow model keeps state there)."""
        self.net = FlowNetwork(env, self.graph, mode=self.mode)

    def gpu(self, rank: int) -> str:
        return gpu_name(self.layout.node_of(rank), self.layout.local_gpu_of(rank))

    def plan(self, spec):
        key = (spec.op, spec.ranks, spec.size_bytes)
        plan = self._plans.get(key)
        if plan is None:
            if not 0 <= spec.size_bytes < MAX_NS:              # NaN too: a bug in the program builder
                raise InternalError(f"a {spec.op} over {len(spec.ranks)} ranks ({spec.tag or 'untagged'}) "
                                    f"has a size of {spec.size_bytes!r} bytes")
            plan = self._plans[key] = plan_collective(self.graph, spec.op, [self.gpu(r) for r in spec.ranks],
                                                      int(spec.size_bytes))
        return plan

    def time_ns(self, spec) -> int:
        key = (spec.op, spec.ranks, spec.size_bytes)
        t = self._ns.get(key)
        if t is None:
            t = self._ns[key] = estimate_plan_ns(self.graph, self.plan(spec))
        return t

    def transfer(self, env, spec):
        if len(spec.ranks) < 2 or spec.size_bytes <= 0:
            return
        if self.mode == "analytical" or self.net is None:
            yield env.timeout(self.time_ns(spec))
        else:
            yield env.process(collective_process(env, self.net, self.plan(spec)))


def network_for(sc, layout: Layout | None = None) -> ClusterNetwork:
    return ClusterNetwork(sc, layout)
