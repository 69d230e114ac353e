"""The engine's network: engine CommSpecs (global ranks) -> collectives on the cluster graph.

`simulation.network: analytical` costs each call with sim.network.collectives.collective_time_ns
(latency + the busiest link of each phase on the real routes; cached per distinct call);
`flow` runs the call's flows on a shared FlowNetwork, so concurrent communication of the
simulated ranks (e.g. a DP gradient bucket and a PP send leaving through the same NIC) shares
link bandwidth max-min fairly.

Isolated groups (flow mode): before the run the engine shows the network every program
(`prepare`). A process group whose calls never overlap each other (each one blocking, or
launched and waited for before the group's next call on another stream; calls on one stream run
one after another; issued by one simulated rank, or by all members through the engine's
barrier) and whose links no other group's calls cross can never share a link with other
traffic: each of its calls takes exactly the time of its flows alone on the graph. That time is computed once per distinct call (the same FlowNetwork, in a private
environment holding only that call) and the call becomes a fixed delay (`fixed_ns`), which the
engine merges with the kernels around it. In a large step most tensor-parallel collectives are
such calls (NVLink inside a node, used by nothing else), and the shared network is left with
the traffic that can actually contend.
"""

from __future__ import annotations

import simpy

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
        self._isolated: frozenset = frozenset()
        self._alone: dict = {}

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

    def prepare(self, programs: dict) -> None:
        """Find the isolated groups (module docstring) among the calls of `programs`."""
        if self.mode != "flow":
            return
        from sim.engine.core import Comm, Compute, Launch, Mark, Send, Wait

        calls: set = set()               # distinct calls
        overlap: set = set()             # groups two of whose calls may be in flight together
        callers: dict = {}               # group -> the simulated ranks that issue its calls
        for rank, prog in programs.items():
            inflight: dict = {}          # handle -> (group, stream) of a launched, unwaited call
            busy: dict = {}              # group -> {stream: calls in flight}
            group_of: dict = {}          # id(spec) -> its group, None for calls without traffic
            for ins in prog:
                t = type(ins)
                if t is Compute or t is Mark:
                    continue
                if t is Wait:
                    hit = inflight.pop(ins.handle, None)
                    if hit is not None:
                        busy[hit[0]][hit[1]] -= 1
                    continue
                if t is not Comm and t is not Launch and t is not Send:
                    continue
                spec = ins.spec
                g = group_of.get(id(spec), False)      # a spec recurs per layer and microbatch
                if g is False:
                    g = group_of[id(spec)] = (spec.ranks if len(spec.ranks) >= 2 and spec.size_bytes > 0
                                              else None)
                    if g is not None:
                        calls.add(spec)
                        callers.setdefault(g, set()).add(rank)
                if g is None:
                    continue
                stream = "compute" if t is Comm else ins.stream if t is Launch else "pp"
                on = busy.setdefault(g, {})
                # calls on one stream run one after another (FIFO); on two streams they may overlap
                if any(n and s != stream for s, n in on.items()):
                    overlap.add(g)
                if t is not Comm:
                    inflight[ins.handle if t is Launch else ins.key] = (g, stream)
                    on[stream] = on.get(stream, 0) + 1
        links: dict = {}
        for spec in calls:
            used = links.setdefault(spec.ranks, set())
            for ph in self.plan(spec).phases:
                for path in ph.paths:
                    used.update(path)
        users: dict = {}
        for used in links.values():
            for e in used:
                users[e] = users.get(e, 0) + 1
        self._isolated = frozenset(
            g for g, used in links.items()
            if g not in overlap and all(users[e] == 1 for e in used)
            # one simulated caller, or every member simulated (the engine's barrier)
            and (len(callers[g]) == 1 or all(r in programs for r in g)))

    def fixed_ns(self, spec):
        """The duration of a call that depends on nothing else in the simulation, or None: every
        call in analytical mode, calls of isolated groups in flow mode."""
        if len(spec.ranks) < 2 or spec.size_bytes <= 0:
            return 0
        if self.mode == "analytical":
            return self.time_ns(spec)
        if spec.ranks in self._isolated:
            return self.alone_ns(spec)
        return None

    def alone_ns(self, spec) -> int:
        """The flow model's time of one call with nothing else on the network (cached per graph:
        a sweep meets the same calls again)."""
        key = (spec.op, spec.ranks, spec.size_bytes)
        t = self._alone.get(key)
        if t is None:
            plan = self.plan(spec)
            cache = self.graph.graph.setdefault("alone_ns", {})
            gkey = (plan.op, tuple(plan.ranks), plan.nbytes)
            t = cache.get(gkey)
            if t is None:
                env = simpy.Environment()
                env.process(collective_process(env, FlowNetwork(env, self.graph), plan))
                env.run()
                t = cache[gkey] = env.now
            self._alone[key] = t
        return t

    def transfer(self, env, spec):
        if len(spec.ranks) < 2 or spec.size_bytes <= 0:
            return
        if self.mode == "analytical" or self.net is None:
            yield env.timeout(self.time_ns(spec))
        elif spec.ranks in self._isolated:
            yield env.timeout(self.alone_ns(spec))
        else:
            yield from collective_process(env, self.net, self.plan(spec))


def network_for(sc, layout: Layout | None = None) -> ClusterNetwork:
    return ClusterNetwork(sc, layout)
