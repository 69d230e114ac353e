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

import numpy as np
import simpy

from sim.errors import InternalError
from sim.layout import Layout
from sim.network.collectives import collective_process, estimate_plan_ns, plan_collective
from sim.network.flow import FlowNetwork
from sim.network.link_load import LoadLog
from sim.network.moe_dispatch import plan_moe_dispatch
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
        self._images: dict | None = None         # by symmetry: call -> its counterparts
        self._unions: dict = {}
        self._steps: dict = {}                   # id(plan) -> (plan, latency, its batches: _steps_of)
        self.prepared = False
        """Whether `prepare_symmetric` has readied the network for the run (Engine.run then does
        not prepare it again)."""
        self.keep_loads = False
        """Whether each run keeps its flow network's rates (`simulate(..., link_load=True)`)."""
        self.loads = None
        """The sim.network.link_load.LoadLog of the rates of the run's flow network (flow mode,
        `keep_loads`), made anew by each `bind`; None: none kept."""

    def bind(self, env) -> None:
        """Attach to the engine's SimPy environment (the flow model keeps state there)."""
        self.net = FlowNetwork(env, self.graph, mode=self.mode)
        # (each run its own: a run tried before this one is not kept)
        self.loads = self.net.loads = LoadLog() if self.keep_loads and self.mode == "flow" else None

    def gpu(self, rank: int) -> str:
        return gpu_name(self.layout.node_of(rank), self.layout.local_gpu_of(rank))

    def plan(self, spec):
        key = (spec.op, spec.ranks, spec.size_bytes, spec.routing)
        plan = self._plans.get(key)
        if plan is None:
            if not 0 <= spec.size_bytes < MAX_NS:              # NaN too: a bug in the program builder
                raise InternalError(f"a {spec.op} over {len(spec.ranks)} ranks ({spec.tag or 'untagged'}) "
                                    f"has a size of {spec.size_bytes!r} bytes")
            gpus = [self.gpu(r) for r in spec.ranks]
            if spec.op == "moe_dispatch":
                plan = plan_moe_dispatch(self.graph, gpus, int(spec.size_bytes), spec.routing)
            else:
                plan = plan_collective(self.graph, spec.op, gpus, int(spec.size_bytes))
            self._plans[key] = plan
        return plan

    def time_ns(self, spec) -> int:
        key = (spec.op, spec.ranks, spec.size_bytes, spec.routing)
        t = self._ns.get(key)
        if t is None:
            t = self._ns[key] = estimate_plan_ns(self.graph, self.plan(spec))
        return t

    def prepare(self, programs: dict) -> None:
        """Find the isolated groups (module docstring) among the calls of `programs`."""
        self.prepared = False
        self._images = None
        if self.mode != "flow":
            return
        calls, overlap, callers = self._scan(programs)
        self._isolated = frozenset(
            g for g in self._alone_groups(calls, overlap)
            # one simulated caller, or every member simulated (the engine's barrier)
            if len(callers[g]) == 1 or all(r in programs for r in g))

    def prepare_symmetric(self, programs: dict, orbits) -> bool:
        """For `ranks: all` simulated by symmetry (sim.engine.symmetry): `programs` are the
        stage representatives'. Whether every call of theirs takes, for each rank of the stage
        making its own version of it, the same time as for the representative, with no link of
        it shared with other traffic (all ranks' calls counted; in the full simulation every
        member of a group is simulated, so each group's calls wait for all its members); if so
        the network is ready for the reduced run (`prepared`)."""
        from sim.engine.symmetry import NotSymmetric

        self.prepared = False
        calls, overlap, _ = self._scan(programs)
        try:
            images = {spec: orbits.counterparts(spec, rep) for spec, rep in calls.items()}
        except NotSymmetric:
            return False
        if self.mode == "analytical":
            ok = all(self.time_ns(c) == self.time_ns(spec) for spec, cs in images.items() for c in cs[1:])
        else:
            every = {c: None for cs in images.values() for c in cs}
            overlap = {c.ranks for spec, cs in images.items() if spec.ranks in overlap for c in cs}
            isolated = frozenset(self._alone_groups(every, overlap))
            ok = True
            for spec, cs in images.items():
                alone = [c.ranks in isolated for c in cs]
                if all(alone):          # each alone on the graph: the same time for all
                    ok = all(self.alone_ns(c) == self.alone_ns(spec) for c in cs[1:])
                else:                   # on the shared network together (`_together`)
                    ok = not any(alone)
                if not ok:
                    break
            self._isolated = isolated
            self._images = images
        self.prepared = ok
        return ok

    @staticmethod
    def _scan(programs: dict) -> tuple:
        """The calls of `programs` with traffic ({spec: the first rank making it}), the groups two
        of whose calls may be in flight together, and the simulated ranks calling each group."""
        from sim.engine.core import Block, Comm, Launch, Send, Wait

        calls: dict = {}                 # distinct calls -> the first rank making it
        overlap: set = set()             # groups two of whose calls may be in flight together
        callers: dict = {}               # group -> the simulated ranks that issue its calls
        for rank, prog in programs.items():
            inflight: dict = {}          # handle -> (group, stream) of a launched, unwaited call
            busy: dict = {}              # group -> {stream: calls in flight}
            group_of: dict = {}          # id(spec) -> its group, None for calls without traffic

            def step(ins, found: set) -> None:
                t = type(ins)
                if t is Wait:
                    hit = inflight.pop(ins.handle, None)
                    if hit is not None:
                        busy[hit[0]][hit[1]] -= 1
                    return
                if t is not Comm and t is not Launch and t is not Send:
                    return
                spec = ins.spec
                g = group_of.get(id(spec), False)      # a spec recurs per layer and microbatch
                if g is False:
                    g = group_of[id(spec)] = (spec.ranks if len(spec.ranks) >= 2 and spec.size_bytes > 0
                                              else None)
                    if g is not None:
                        calls.setdefault(spec, rank)
                        callers.setdefault(g, set()).add(rank)
                if g is None:
                    return
                stream = "compute" if t is Comm else ins.stream if t is Launch else "pp"
                on = busy.setdefault(g, {})
                # calls on one stream run one after another (FIFO); on two streams they may overlap
                if any(n and s != stream for s, n in on.items()):
                    found.add(g)
                if t is not Comm:
                    inflight[ins.handle if t is Launch else ins.key] = (g, stream)
                    on[stream] = on.get(stream, 0) + 1

            def idle(groups) -> bool:
                return not any(n for g in groups for n in busy.get(g, {}).values())

            seen: dict = {}              # id(template) -> (template, its groups, overlaps it finds)
            for ins in prog:
                if type(ins) is not Block:
                    step(ins, overlap)
                    continue
                # a template instance: its launches are waited in it, so from a state where none of
                # its groups has a call in flight it finds the same overlaps every time
                tm = ins.template
                hit = seen.get(id(tm))
                if hit is not None and idle(hit[1]):
                    overlap.update(hit[2])
                    continue
                clean = hit is None and idle(c.spec.ranks for c in tm.calls if type(c) is not Wait)
                found: set = set()
                for c in tm.calls:
                    step(c, found)
                overlap.update(found)
                if clean:
                    seen[id(tm)] = (tm, {group_of[id(c.spec)] for c in tm.calls if type(c) is not Wait}
                                    - {None}, found)
        return calls, overlap, callers

    def _alone_groups(self, calls, overlap: set) -> list:
        """The groups of `calls` none of whose calls may overlap another of the group and none
        of whose links another group's calls cross."""
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
        return [g for g, used in links.items() if g not in overlap and all(users[e] == 1 for e in used)]

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
        key = (spec.op, spec.ranks, spec.size_bytes, spec.routing)
        t = self._alone.get(key)
        if t is None:
            plan = self.plan(spec)
            cache = self.graph.graph.setdefault("alone_ns", {})
            gkey = (plan.op, tuple(plan.ranks), plan.nbytes, plan.routing)
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
        elif self._images is not None:
            yield from self._together(env, self._images[spec])
        else:
            yield from collective_process(env, self.net, self.plan(spec))

    def start(self, env, spec, finish) -> bool:
        """`transfer` without a process: run the call from now and call finish() when it ends
        (at the same time and after the same events as the process would resume); False where
        it does not (calls with counterparts, `_together`)."""
        if len(spec.ranks) < 2 or spec.size_bytes <= 0:
            finish()
        elif self.mode == "analytical" or self.net is None:
            _after(env, self.time_ns(spec), finish)
        elif spec.ranks in self._isolated:
            _after(env, self.alone_ns(spec), finish)
        elif self._images is not None:
            return False
        else:
            latency, steps = self._steps_of(spec)
            chain = _Chain(self.net, steps, finish)
            if latency:
                _after(env, latency, chain.next)
            else:
                chain.next()
        return True

    def _steps_of(self, spec) -> tuple:
        """(latency, the batches of its plan's phases in order, each phase `repeat` times): what
        collective_process waits for, once per plan."""
        plan = self.plan(spec)
        hit = self._steps.get(id(plan))
        if hit is None or hit[0] is not plan:
            hit = self._steps[id(plan)] = (plan, plan.latency_ns, [
                f for ph in plan.phases for f in [ph.flows(plan.wire_factor)] * ph.repeat if f is not None])
        return hit[1], hit[2]

    def _together(self, env, specs: list):
        """A representative's call and its counterparts (sim.engine.symmetry), started together
        as every rank of the stage starts its own: each phase's flows of all of them as one
        batch. Raises NotSymmetric unless every counterpart's phase ends when the
        representative's does (then the full simulation's calls, one per group, would run
        exactly so)."""
        from sim.engine.symmetry import NotSymmetric

        key = tuple(c.ranks for c in specs) + (specs[0].op, specs[0].size_bytes, specs[0].routing)
        hit = self._unions.get(key)
        if hit is None:
            each = [self._steps_of(c) for c in specs]
            latency, first = each[0]
            if any(lat != latency or len(steps) != len(first) for lat, steps in each[1:]):
                raise NotSymmetric(f"the counterparts of {specs[0]} have other plans")
            batches = []
            for flows in zip(*(steps for _, steps in each)):
                batches.append((np.concatenate([f[0] for f in flows]), np.concatenate([f[1] for f in flows]),
                                [b for f in flows for b in f[2]], np.concatenate([f[3] for f in flows]),
                                [n for f in flows for n in f[4]], [i for i, f in enumerate(flows) for _ in f[3]]))
            hit = self._unions[key] = (latency, batches)
        latency, batches = hit
        if latency:
            yield env.timeout(latency)
        for flows in batches:
            res = yield self.net.transfer_batch(*flows)
            if min(res.segment_ends) != max(res.segment_ends):
                raise NotSymmetric(f"the counterparts of {specs[0]} end at different times")


def _after(env, delay: int, fn) -> None:
    env.timeout(delay).callbacks.append(lambda _ev: fn())


class _Chain:
    """A collective's phases one after another on the flow network (collective_process's loop
    after its latency, as callbacks)."""

    __slots__ = ("net", "steps", "i", "finish")

    def __init__(self, net, steps: list, finish):
        self.net, self.steps, self.i, self.finish = net, steps, 0, finish

    def next(self, _ev=None) -> None:
        if self.i == len(self.steps):
            self.finish()
            return
        ev = self.net.transfer_batch(*self.steps[self.i])
        self.i += 1
        ev.callbacks.append(self.next)


def network_for(sc, layout: Layout | None = None) -> ClusterNetwork:
    return ClusterNetwork(sc, layout)
