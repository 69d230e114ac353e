"""The SimPy engine: one actor per simulated rank, a compute stream and communication streams.

A rank's work is a *program*: a list of instructions executed in order on its compute stream.

- `Compute(dur_ns)`: a kernel (or a fused run of kernels) on the compute stream.
- `Comm(spec)`: a collective the compute stream waits for (exposed: TP collectives by default).
- `Launch(handle, spec, stream)`: start a collective on a communication stream and go on (DP
  gradient buckets, ZeRO parameter gathers, PP sends); streams run their work in FIFO order.
- `Wait(handle)`: block the compute stream until a launched collective has finished.
- `Mark(name, cat, value)`: an instant record (memory allocated or freed by an action).
- `Send(key, spec)`: start a point-to-point transfer on the "pp" stream; `Recv(key)` blocks
  until the transfer with that key has arrived (torch.distributed.pipelining semantics: the
  sender does not wait for the receiver).

Durations of communication come from a network object with one method,
`transfer(env, spec) -> generator` (a SimPy process body), so the analytical (alpha-beta) and the
flow (shared links) models plug in alike. Simulated time is integer nanoseconds.

Interference (`comm_compute_slowdown` f): while any communication stream of a rank is busy,
its compute kernels progress at (1 - f) of their speed (NCCL kernels hold SMs); a kernel's
duration stretches accordingly (integer ns, rounded up at each change of the streams' state).

Collectives whose members are all simulated (`ranks: all`, or the tied-embedding all-reduce of
two simulated pipeline ranks) synchronise them: the call starts on the network when its last
member arrives (a barrier, as NCCL's kernels wait for their peers), and every member's call ends
together; an exposed member's record starts with the call, its wait before is idle. Members are
matched by the group and the call's index among the rank's calls on that group in program order
(NCCL's rule: one order of calls per communicator).

Every interval is recorded as `Record(rank, stream, name, cat, start_ns, end_ns)`; the metrics
module turns records into the time breakdown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import simpy

from sim.errors import InternalError
from sim.units import MAX_NS

try:
    import sim.engine._textout as _textout   # the compiled output loops (sim/engine/_textout.c)
except ImportError:                          # not built (no C compiler): the Python loops
    _textout = None

WATCHDOG_EVENTS = 10_000_000
"""Instructions between two looks of the engine's watchdog (issue #14: no advance of simulated
time in that many is a livelock, reported, never a hang)."""


@dataclass(frozen=True)
class CommSpec:
    """A communication operation: `op` (all_reduce, all_gather, reduce_scatter, all_to_all,
    send_recv, broadcast, moe_dispatch), the member ranks, and bytes per rank as nccl-tests counts them
    (the buffer size). `tag` labels the dimension (tp, dp, pp, cp, ep)."""

    op: str
    ranks: tuple
    size_bytes: int
    tag: str = ""
    routing: tuple = ()
    """Only for op `moe_dispatch` (the flex dispatcher's dispatch or combine, sim.network.
    moe_dispatch): (backend, experts, topk, groups, group topk); ranks in expert-parallel order and
    size_bytes one copy of each of a rank's tokens."""


# Instructions are named tuples: a large step has millions of them, and a named tuple is made
# in half the time of a frozen dataclass (benchmarks/engine.py).
class Compute(NamedTuple):
    dur_ns: int
    name: str
    cat: str = "compute"
    """compute | recompute | optimizer"""


class Comm(NamedTuple):
    spec: CommSpec
    name: str


class Launch(NamedTuple):
    handle: object
    spec: CommSpec
    name: str
    stream: str = "dp"


class Wait(NamedTuple):
    handle: object
    name: str = "wait"


class Send(NamedTuple):
    key: object
    spec: CommSpec
    name: str


class Recv(NamedTuple):
    key: object
    name: str


class Mark(NamedTuple):
    """An instant on the rank's timeline carrying a value (e.g. activation bytes allocated (+)
    or freed (-) by the action that just ended)."""

    name: str
    cat: str
    value: float = 0.0


class Template:
    """A pipeline action's (or one layer's) instructions for one microbatch, made once per rank
    (ProgramBuilder._layer) with a stand-in microbatch number (NUL) in their names and handles
    of its own launches not yet unique to an instance; `expand` makes an instance. `simple`:
    only kernels, blocking collectives, marks and its own launches, each waited for in it (an
    instance can be kept whole as a Block)."""

    __slots__ = ("ins", "items", "calls", "streams", "simple")

    def __init__(self, instructions):
        self.ins = tuple(instructions)
        launched = {x.handle for x in self.ins if type(x) is Launch}
        waited = {x.handle for x in self.ins if type(x) is Wait}
        items = []               # how to make each instruction of an instance: (kind, fields...)
        for x in self.ins:
            t = type(x)
            name = _split_name(x.name)
            if t is Compute and name:
                items.append((1, x.dur_ns, name, x.cat))
            elif t is Comm and name:
                items.append((2, x.spec, name))
            elif t is Launch and x.handle in launched:
                items.append((3, x.handle, x.spec, name or x.name, x.stream))
            elif t is Wait and x.handle in launched:
                items.append((4, x.handle, name or x.name))
            elif t is Mark and name:
                items.append((5, name, x.cat, x.value))
            elif name:
                raise TypeError(f"no template for {x!r}")       # only the kinds above name a microbatch
            else:
                items.append((0, x))
        self.items = tuple(items)
        self.calls = tuple(x for x in self.ins if type(x) in (Comm, Launch, Wait))
        """Its collectives, launches and waits (what a network's `prepare` reads)."""
        self.streams = frozenset(x.stream for x in self.ins if type(x) is Launch)
        self.simple = (all(type(x) in (Compute, Comm, Mark, Launch, Wait) for x in self.ins)
                       and launched <= waited and waited <= launched)

    def expand(self, mb, n) -> list:
        """The instructions of the instance for microbatch `mb` (its number in names; a pair of
        them for a template of two actions, see `_split_name`), its own launches' handles made
        unique by `n`."""
        if type(mb) is tuple:           # a name's parts joined with the number of its action
            first, second = mb[0].join, mb[1].join

            def join(parts):
                return second(parts) if type(parts) is _Second else first(parts)
        else:
            join = str(mb).join
        out = []
        add = out.append
        new = tuple.__new__     # a named tuple made as namedtuple's _make does: 3x faster than its
        for it in self.items:   # __new__ (0.15 against 0.5 us), for millions of instructions
            k = it[0]
            if k == 0:
                add(it[1])
            elif k == 1:
                add(new(Compute, (it[1], join(it[2]), it[3])))
            elif k == 2:
                add(new(Comm, (it[1], join(it[2]))))
            elif k == 3:
                name = it[3]
                add(new(Launch, ((it[1], n), it[2], name if type(name) is str else join(name), it[4])))
            elif k == 4:
                name = it[2]
                add(new(Wait, ((it[1], n), name if type(name) is str else join(name))))
            else:
                add(new(Mark, (join(it[1]), it[2], it[3])))
        return out


class _Second(list):
    """A name's parts around the second action's stand-in microbatch number (see `_split_name`)."""

    __slots__ = ()


def _split_name(name: str):
    """A template instruction's name split at its stand-in microbatch number: None if it has
    none, a list of parts around NUL (joined with the instance's number), or, in a template of
    two actions (DualPipe's overlapped pair, ProgramBuilder._pair), a `_Second` of the parts
    around U+0001, the second action's stand-in (joined with the second number)."""
    if "\x01" in name:
        return _Second(name.split("\x01"))
    parts = name.split("\x00")
    return parts if len(parts) > 1 else None


def _join_name(name, mb) -> str:
    """A name of a template's instance: `name` as kept (a str, or parts from `_split_name`)
    with microbatch `mb` (a str, or the pair of a two-action template's instance)."""
    if type(name) is str:
        return name
    if type(mb) is str:
        return mb.join(name)
    return mb[type(name) is _Second].join(name)


class Block(NamedTuple):
    """A template's instructions for microbatch `mb`: `template.expand(mb, n)`, kept as one entry
    (a large step repeats each action for hundreds of microbatches; the engine compiles the
    template once and places it whole into a run)."""

    template: Template
    mb: str | tuple
    """Its microbatch number, or the pair of them of a two-action template (see `_split_name`)."""
    n: int


def expand_blocks(program) -> list:
    """`program` with every Block replaced by its instructions."""
    out: list = []
    for ins in program:
        if type(ins) is Block:
            out += ins.template.expand(ins.mb, ins.n)
        else:
            out.append(ins)
    return out


def instruction_count(program) -> int:
    """Instructions of `program`, each Block counting its template's."""
    return sum(len(x.template.ins) if type(x) is Block else 1 for x in program)


class Record(NamedTuple):
    """One interval (or instant, for marks) of a rank's timeline. A named tuple: the engine
    makes one per kernel, millions in a large step (a frozen dataclass costs 5x more to make)."""

    rank: int
    stream: str
    name: str
    cat: str
    start_ns: int
    end_ns: int
    value: float = 0.0


class _Run(NamedTuple):
    """A run of consecutive instructions of one rank whose times depend on nothing else in the
    simulation: kernels (without compute-communication interference), marks, blocking
    collectives of a fixed duration (the network's `fixed_ns`), fixed-time collectives launched
    on a stream whose earlier calls are all in the run or waited for (they start in launch order
    when the stream is free), and waits for calls launched in the run (they end at max(the
    call's end, the kernels' end)). The engine runs it as one timeout of `total_ns` and then
    records each part at its offset: the same records at the same times as running the parts one
    by one, with one event instead of one per part."""

    total_ns: int
    parts: tuple
    """(stream, name, cat, start offset, end offset, value) of each record, in program order."""
    count: int
    """Instructions it stands for (the engine's instruction count and watchdog)."""
    escapes: tuple = ()
    """(handle, stream, end offset) of calls launched in the run and waited for after it: their
    completion is scheduled when the run starts."""
    last_ns: int = 0
    """The latest end offset of its records (past `total_ns` when a call escapes)."""
    busy: tuple | None = None
    """(kernel intervals, communication intervals) of its records as (start, end) offsets,
    touching intervals merged (sim.engine.metrics.breakdown's K and C: the same unions); None
    when it has no record but marks."""


def _succeed_in(env, ev, delay: int) -> None:
    """Trigger `ev` `delay` ns from now (a completion known in advance), as SimPy's succeed()
    does now: its waiters resume then, and `ev.processed` stays False until then."""
    ev._ok = True
    ev._value = None
    env.schedule(ev, simpy.core.NORMAL, delay)


def _merge(intervals: list, start: int, end: int) -> None:
    """Add [start, end) to a run's intervals, joined to the last one when they touch (the union,
    all the breakdown reads, is the same)."""
    if intervals and intervals[-1][1] == start:
        intervals[-1] = (intervals[-1][0], end)
    else:
        intervals.append((start, end))


class _RunState:
    """What `Engine._compile` knows of the run it is building (the hot counters -- its length
    `total`, its first instruction, the open kernel interval (ks, ke), whether it records more
    than marks -- stay locals of `_compile`), and of the calls in flight across runs."""

    __slots__ = ("parts", "kernels", "comms", "extra", "busy", "last", "free", "ends", "outside",
                 "where", "finished")

    def __init__(self):
        self.ends: dict = {}         # handle of a call launched in the current run -> (stream, end offset)
        self.outside: dict = {}      # stream -> its calls launched outside a run (or escaped), not waited
        self.where: dict = {}        # handle -> stream of such a call
        self.finished: set = set()   # handles of calls launched and waited for inside runs
        self._reset()

    def _reset(self) -> None:
        self.parts: list = []        # the records, as `_Run.parts`
        self.kernels: list = []      # the run's busy intervals (touching ones merged), as `_Run.busy`
        self.comms: list = []
        self.extra = 0               # instructions of the run's blocks beyond one each
        self.busy = 0                # whether a block of it records anything but marks
        self.last = 0                # the latest end offset of its launches and blocks
        self.free: dict = {}         # stream -> end offset of its last call in the run

    def close(self, total: int, count: int, ks: int, ke: int, busy: int) -> _Run:
        """The run of `count` instructions (blocks counted as one) and `total` ns, the kernel
        interval (ks, ke) still open (ks -1: none); its calls still in flight escape it
        (completion scheduled at run time; their streams count as busy until their waits).
        Then an empty run begins."""
        kernels, ends = self.kernels, self.ends
        if ks >= 0:
            kernels.append((ks, ke))
        escapes = ()
        if ends:
            escapes = tuple((h, stream, end) for h, (stream, end) in ends.items())
            for h, (stream, _) in ends.items():
                self.outside[stream] = self.outside.get(stream, 0) + 1
                self.where[h] = stream
            ends.clear()
        run = _Run(total, tuple(self.parts), count + self.extra, escapes, max(self.last, total),
                   (tuple(kernels), tuple(self.comms)) if busy or self.busy else None)
        self._reset()
        return run


class DeadlockError(RuntimeError):
    """The simulation stopped with ranks still waiting; the message lists who waits on what."""


@dataclass
class _RankState:
    pc: int = 0
    waiting_on: object = None
    """The instruction it waits in (Comm, Wait or Recv), or None (formatted by `_waiting_text`
    only for a deadlock's message)."""
    done: bool = False


def _waiting_text(ins) -> str:
    """What a rank stuck in `ins` waits on, for a deadlock's message."""
    t = type(ins)
    if t is Comm:
        return f"{ins.name} ({ins.spec.op} over {len(ins.spec.ranks)} ranks)"
    if t is Wait:
        return f"{ins.name} (handle {ins.handle!r})"
    if t is Recv:
        return f"{ins.name} (message {ins.key!r})"
    return "?"


class Engine:
    """Runs the programs of a set of ranks to completion."""

    def __init__(self, programs: dict, network, *, comm_streams=("pp", "dp", "tp", "cp", "ep"),
                 comm_compute_slowdown: float = 0.0, orbits=None):
        if not 0.0 <= comm_compute_slowdown < 1.0:
            raise ValueError(f"comm_compute_slowdown ({comm_compute_slowdown}) must be in [0, 1)")
        self.slowdown = float(comm_compute_slowdown)
        self.env = simpy.Environment()
        self.programs = dict(programs)
        self.network = network
        self._start = getattr(network, "start", None)
        """The network's `start(env, spec, finish) -> bool`, if it has one: run the call and
        call finish() when it ends, as `transfer` in a process would (False: it cannot)."""
        self.orbits = orbits
        """sim.engine.symmetry.Orbits when `programs` are stage representatives standing for every
        rank of their stage (`records`, `busy_intervals` and `p2p` then cover every rank)."""
        if hasattr(network, "bind"):
            network.bind(self.env)
        self._log: list = []
        """What happened, in order: a Record, or (rank, start, run) for a `_Run` (its records are
        made only when asked for: `records`)."""
        self._records: list | None = None
        self._made = 0
        self._handles: dict = {}
        self._arrivals: dict = {}
        self._state = {r: _RankState() for r in programs}
        self.p2p: dict = {}
        """key -> {"src", "dst", "sent_ns", "arrived_ns", "consumed_ns"} for every send/recv."""
        self._stream_names = frozenset(comm_streams)
        self._tail: dict = {}
        """(rank, stream) -> completion event of the last call queued on the stream by a process
        (the next such call starts after it: FIFO)."""
        self._free: dict = {}
        """(rank, stream) -> when the stream's last fixed-time call ends (`_launch`)."""
        self._slow: dict = {}
        """(rank, stream) -> calls in flight on the stream whose time the network decides as
        they run (each run by a process, `_comm_process`)."""
        self.events = 0
        self._busy = {r: 0 for r in programs}
        self._busy_changed: dict = {}
        self._calls: dict = {}
        self._rdv: dict = {}
        self._all_simulated: dict = {}
        self._watch_now = -1
        self._blocks: dict = {}
        """id(template) -> (template, its compiled run or None): `_block`."""
        self._fixed_spec: dict = {}
        """id(spec) -> (spec, `_fixed_comm_ns`): a spec recurs per layer and microbatch, and
        hashing one costs a hash of its group."""
        self._net_fixed: dict = {}
        """id(spec) -> (spec, the network's `fixed_ns`): `_network_fixed_ns`, the same way."""

    # -- helpers --------------------------------------------------------------------------
    def _event_for(self, table: dict, key) -> simpy.Event:
        ev = table.get(key)
        if ev is None:
            ev = table[key] = self.env.event()
        return ev

    def _set_busy(self, rank, delta):
        self._busy[rank] += delta
        ev = self._busy_changed.pop(rank, None)
        if ev is not None:
            ev.succeed()

    def _rendezvous_key(self, rank, spec: CommSpec):
        """The barrier key of a collective whose members are all simulated, else None."""
        if len(spec.ranks) < 2 or not self._members_simulated(spec.ranks):
            return None
        k = self._calls.get((rank, spec.ranks), 0)
        self._calls[(rank, spec.ranks)] = k + 1
        return (spec.ranks, k)

    def _transfer(self, spec: CommSpec, key):
        """The network time of a call; with a barrier key, once for all members after the last
        one arrives. Returns when the call started on the network (None: when it was made)."""
        if key is None:
            yield from self.network.transfer(self.env, spec)
            return None
        done = self._arrive(spec, key, self.env.now)
        yield done
        return done.call_start

    def _arrive(self, spec: CommSpec, key, at: int, member=None) -> simpy.Event:
        """One member of a barrier call arrives at `at` (now, or later for a launch queued behind
        fixed-time calls); returns the event of the call's end. `member`: (rank, stream, name,
        category, start, done) of a launch without a process, recorded when the call ends."""
        ent = self._rdv.get(key)
        if ent is None:
            ent = self._rdv[key] = [0, self.env.event(), at, []]
        ent[0] += 1
        ent[2] = max(ent[2], at)
        if member is not None:
            ent[3].append(member)
        if ent[0] == len(spec.ranks):
            del self._rdv[key]
            self._resolve(spec, ent)
        return ent[1]

    def _resolve(self, spec, ent) -> None:
        """Every member has arrived: the call starts at the last arrival. A call of a fixed time
        (an isolated group, or the analytical network) ends then + its time, with no process;
        otherwise a process runs it on the network (only members arriving now can be waiting)."""
        env = self.env
        ent[1].call_start = ent[2]             # (read by a member's exposed call: `_transfer`)
        dur = self._network_fixed_ns(spec)
        if dur is None:
            env.process(self._run_shared(spec, ent[1]))
            return
        end = ent[2] + dur
        for ev in [ent[1]] + [m[5] for m in ent[3]]:
            _succeed_in(env, ev, end - env.now)
        for rank, stream, name, cat, start, _ in ent[3]:
            self._log.append(Record(rank, stream, name, cat, start, end))
            sk = (rank, stream)
            self._free[sk] = max(self._free.get(sk, 0), end)
            self._slow[sk] -= 1

    def _run_shared(self, spec, done):
        yield from self.network.transfer(self.env, spec)
        done.succeed()

    def _launch(self, rank, stream, spec: CommSpec, name: str, done: simpy.Event, key=None):
        """Queue a call on a communication stream (FIFO). A call of a fixed duration (the
        network's `fixed_ns`, no interference) behind only fixed-time calls needs no process: it
        starts when the stream is free (the end of the call before it) and its record and its
        completion event are known at once, or for a barrier when its last member arrives.
        Otherwise a process runs it after the call queued before it (and the fixed-time calls
        ahead of it) has ended."""
        sk = (rank, stream)
        if stream not in self._stream_names:
            raise InternalError(f"rank {rank} launches {name!r} on stream {stream!r}, not one of "
                                f"{', '.join(sorted(self._stream_names))}")
        if not self.slowdown and not self._slow.get(sk):
            dur = self._network_fixed_ns(spec)
            if dur is not None:
                env = self.env
                now = env.now
                start = max(now, self._free.get(sk, 0))
                if key is not None:
                    # a barrier: it ends when its last member has arrived (`_resolve`); until
                    # then the stream is busy to an unknown time, as with a process
                    self._slow[sk] = 1
                    self._tail[sk] = done
                    self._arrive(spec, key, start, (rank, stream, name, spec.tag or stream, start, done))
                    return
                end = start + dur
                self._free[sk] = end
                self._log.append(Record(rank, stream, name, spec.tag or stream, start, end))
                _succeed_in(env, done, end - now)
                return
        self._slow[sk] = self._slow.get(sk, 0) + 1
        ahead = self._tail.get(sk)
        self._tail[sk] = done
        env = self.env
        if (key is None and not self.slowdown and (ahead is None or ahead.callbacks is None)
                and self._free.get(sk, 0) <= env.now and self._start is not None):
            # the stream is free: the call starts now, as its process would, without one
            start = env.now

            def finish():
                self._log.append(Record(rank, stream, name, spec.tag or stream, start, env.now))
                self._slow[sk] -= 1
                if self._tail.get(sk) is done:
                    del self._tail[sk]
                done.succeed()

            if self._start(env, spec, finish):
                return
        env.process(self._comm_process(rank, stream, spec, name, done, key, ahead))

    def _comm_process(self, rank, stream, spec: CommSpec, name: str, done: simpy.Event, key=None,
                      ahead: simpy.Event | None = None):
        env = self.env
        sk = (rank, stream)
        if ahead is not None and ahead.callbacks is not None:      # not processed yet
            yield ahead                                          # the call queued before it
        # fixed-time calls launched before it may still run (while a call of this kind is in
        # flight no fixed-time call joins them, so the time does not move)
        free = self._free.get(sk, 0)
        if free > env.now:
            yield env.timeout(free - env.now)
        start = env.now
        if self.slowdown:
            self._set_busy(rank, +1)
        yield from self._transfer(spec, key)
        if self.slowdown:
            self._set_busy(rank, -1)
        self._log.append(Record(rank, stream, name, spec.tag or stream, start, env.now))
        self._slow[sk] -= 1
        if self._tail.get(sk) is done:
            del self._tail[sk]
        done.succeed()

    def _slowed_compute(self, rank, dur_ns):
        """A kernel of `dur_ns` (at full speed) that runs at (1 - slowdown) while a comm stream
        of the rank is busy."""
        env = self.env
        remaining = float(dur_ns)
        while remaining > 1e-9:
            rate = (1.0 - self.slowdown) if self._busy[rank] else 1.0
            need = max(1, -int(-(remaining / rate - 1e-9) // 1))
            ch = self._busy_changed.get(rank)
            if ch is None:
                ch = self._busy_changed[rank] = env.event()
            t0 = env.now
            to = env.timeout(need)
            yield to | ch
            if to.processed or env.now - t0 >= need:
                return
            remaining -= (env.now - t0) * rate

    # -- compiling programs into runs ------------------------------------------------------
    def _network_fixed_ns(self, spec):
        """The network's time for `spec` if it is known in advance (`fixed_ns`), else None; kept
        per spec (a spec recurs: every send of a stage, every layer's collective)."""
        hit = self._net_fixed.get(id(spec))
        if hit is None or hit[0] is not spec:
            fixed = getattr(self.network, "fixed_ns", None)
            hit = self._net_fixed[id(spec)] = (spec, fixed(spec) if fixed is not None else None)
        return hit[1]

    def _fixed_comm_ns(self, spec):
        """The duration of a blocking collective that depends on nothing else in the simulation,
        or None (a barrier with simulated peers, or a time the network decides as it runs)."""
        hit = self._fixed_spec.get(id(spec))
        if hit is None or hit[0] is not spec:
            if len(spec.ranks) >= 2 and self._members_simulated(spec.ranks):
                dur = None                                    # a barrier with simulated peers
            else:
                dur = self._network_fixed_ns(spec)
            hit = self._fixed_spec[id(spec)] = (spec, dur)    # holds the spec: its id stays its own
        return hit[1]

    def _members_simulated(self, ranks) -> bool:
        ok = self._all_simulated.get(ranks)
        if ok is None:
            ok = self._all_simulated[ranks] = all(r in self.programs for r in ranks)
        return ok

    def _block(self, template: Template, rank: int):
        """The template compiled alone if it is one run of fixed-time instructions (its parts'
        names split at the stand-in microbatch number), else None; once per template. Also the
        end offset of its last call on each stream it launches on."""
        hit = self._blocks.get(id(template))
        if hit is None or hit[0] is not template:
            out, _ = self._compile(rank, list(template.ins))
            run = out[0] if len(out) == 1 and type(out[0]) is _Run and not out[0].escapes else None
            free = ()
            if run is not None:
                run = run._replace(parts=tuple(
                    (st, _split_name(name) or name, cat, a, b, v)
                    for st, name, cat, a, b, v in run.parts))
                free = tuple((st, max(b for s_, _, _, _, b, _ in run.parts if s_ == st))
                             for st in sorted(template.streams))
            hit = self._blocks[id(template)] = (template, run, free)   # holds it: its id stays its own
        return hit[1]

    def _compile(self, rank, program) -> tuple[list, list]:
        """The program with every maximal run of fixed-time instructions (see `_Run`) replaced
        by a `_Run`; also the index in `program` of each compiled instruction (for deadlock
        messages). A Block whose template is such a run joins the run whole (its parts one
        entry: (None, compiled template, offset, microbatch)); the others are expanded first.
        Kernels, marks and blocking fixed-time collectives join the run here (the hot path);
        blocks, launches and waits in `_join_block`, `_join_launch` and `_join_wait`."""
        if any(self._block(tm, rank) is None for tm in {x.template for x in program if type(x) is Block}):
            program = expand_blocks(program)
        out, origin = [], []
        run = _RunState()
        parts, add, kernels, comms = run.parts, run.parts.append, run.kernels, run.comms
        total, first, ks, ke, busy = 0, -1, -1, -1, 0   # see _RunState
        slowed = bool(self.slowdown)
        join_block, join_launch, join_wait = self._join_block, self._join_launch, self._join_wait
        for i, ins in enumerate(program):
            t = type(ins)
            part = None
            if t is Compute:
                dur = ins.dur_ns
                if not (dur and slowed):
                    if dur:
                        if not 0 < dur < MAX_NS:
                            raise InternalError(f"kernel {ins.name!r} of rank {rank} has a duration of "
                                                f"{dur!r} ns")
                        add(("compute", ins.name, ins.cat, total, total + dur, 0.0))
                        if ke != total:                      # (_merge, written out: the hot path)
                            if ks >= 0:
                                kernels.append((ks, ke))
                            ks = total
                        total += dur
                        ke = total
                        busy = 1
                    part = True
            elif t is Block:
                joined = join_block(run, ins, total, ks, ke)
                if joined is None:
                    # a stream it launches on is still busy here (rare): compile the program's
                    # instructions one by one instead
                    return self._compile(rank, expand_blocks(program))
                total, ks, ke = joined
                if first < 0:
                    first = i
                continue
            elif t is Mark:
                add(("mark", ins.name, ins.cat, total, total, ins.value))
                part = True
            elif t is Comm:
                dur = self._fixed_comm_ns(ins.spec)
                if dur is not None:
                    add(("compute", ins.name, "comm:" + (ins.spec.tag or "x"), total, total + dur, 0.0))
                    if dur:
                        _merge(comms, total, total + dur)
                    total += dur
                    busy = 1
                    part = True
            elif t is Launch:
                part = join_launch(run, ins, total, slowed)
                if part:
                    busy = 1
            elif t is Wait:
                part, total = join_wait(run, ins, total)
            elif t is Send:
                run.outside["pp"] = run.outside.get("pp", 0) + 1      # its end is not waited for here
            if part is not None:
                if first < 0:
                    first = i
                continue
            if first >= 0:
                out.append(run.close(total, i - first, ks, ke, busy))
                origin.append(first)
                parts, add, kernels, comms = run.parts, run.parts.append, run.kernels, run.comms
                total, first, ks, ke, busy = 0, -1, -1, -1, 0
            out.append(ins)
            origin.append(i)
        if first >= 0:
            out.append(run.close(total, len(program) - first, ks, ke, busy))
            origin.append(first)
        return out, origin

    def _join_block(self, run: _RunState, ins, total: int, ks: int, ke: int):
        """Block `ins` joins the run at offset `total`: its compiled template is one part, its
        kernel intervals join the open one (ks, ke) where they touch. Returns the new (total, ks,
        ke), or None where a stream it launches on is still busy (then it cannot join)."""
        _, pre, pre_free = self._blocks[id(ins.template)]
        free = run.free
        if pre_free:
            if any(run.outside.get(st) or free.get(st, 0) > total for st, _ in pre_free):
                return None
            for st, b in pre_free:
                free[st] = total + b
            if total + pre.last_ns > run.last:
                run.last = total + pre.last_ns
        run.parts.append((None, pre, total, ins.mb, 0, 0.0))
        run.extra += pre.count - 1
        if pre.busy is not None:
            run.busy = 1
            kernels = run.kernels
            ks_, cs_ = pre.busy
            for a, b in ks_:                         # its kernel intervals, joined to
                a += total                           # the open one where they touch
                if ke != a:
                    if ks >= 0:
                        kernels.append((ks, ke))
                    ks = a
                ke = b + total
            if cs_:
                a, b = cs_[0]
                _merge(run.comms, a + total, b + total)
                run.comms.extend((a + total, b + total) for a, b in cs_[1:])
        return total + pre.total_ns, ks, ke

    def _join_launch(self, run: _RunState, ins, total: int, slowed: bool):
        """Launch `ins` at offset `total`: True where its call has a fixed time and joins the run
        (FIFO on its stream), else None (its stream counts as busy outside the run)."""
        stream = ins.stream
        dur = None if slowed or run.outside.get(stream) else self._fixed_comm_ns(ins.spec)
        if dur is None:
            run.outside[stream] = run.outside.get(stream, 0) + 1
            run.where[ins.handle] = stream
            return None
        start = max(total, run.free.get(stream, 0))
        end = start + dur
        run.parts.append((stream, ins.name, ins.spec.tag or stream, start, end, 0.0))
        if dur:
            _merge(run.comms, start, end)
        if end > run.last:
            run.last = end
        run.free[stream] = end
        run.ends[ins.handle] = (stream, end)
        return True

    @staticmethod
    def _join_wait(run: _RunState, ins, total: int):
        """Wait `ins` at offset `total`: (True, the offset after it) where it waits for a call
        launched in a run, (None, total) where it must wait at run time."""
        hit = run.ends.pop(ins.handle, None)
        if hit is not None:
            run.finished.add(ins.handle)
            return True, max(total, hit[1])
        if ins.handle in run.finished:
            return True, total                   # waited for again (FSDP): long done, a no-op
        stream = run.where.pop(ins.handle, None)
        if stream is not None:
            run.outside[stream] -= 1
        return None, total

    def _rank_process(self, rank, program, origin):
        env, st = self.env, self._state[rank]
        for pc, ins in enumerate(program):
            st.pc = origin[pc]
            t = type(ins)
            if t is _Run:
                before = self.events
                self.events += ins.count
                looks = self.events // WATCHDOG_EVENTS - before // WATCHDOG_EVENTS
                start = env.now
                for h, stream, end in ins.escapes:
                    _succeed_in(env, self._event_for(self._handles, (rank, h)), end)
                    sk = (rank, stream)
                    self._free[sk] = max(self._free.get(sk, 0), start + end)
                if ins.total_ns:
                    if not start + ins.total_ns < MAX_NS:
                        raise InternalError(f"a run of {ins.count} kernels of rank {rank} starting at "
                                            f"{start} ns lasts {ins.total_ns} ns")
                    yield env.timeout(ins.total_ns)
                    looks = min(looks, 1)        # time advanced: one look sees it
                for _ in range(looks):
                    self._watchdog()
                self._log.append((rank, start, ins))
                continue
            self.events += 1
            if not self.events % WATCHDOG_EVENTS:
                self._watchdog()
            if t is Compute:                               # only with interference (slowdown > 0)
                start = env.now
                yield from self._slowed_compute(rank, ins.dur_ns)
                self._log.append(Record(rank, "compute", ins.name, ins.cat, start, env.now))
            elif t is Comm:
                start = env.now
                st.waiting_on = ins
                began = yield from self._transfer(ins.spec, self._rendezvous_key(rank, ins.spec))
                st.waiting_on = None
                # an exposed collective occupies the compute stream's timeline as communication
                # from when it runs: a barrier's wait for its last member (the tied embedding's
                # all-reduce of the last stage waiting for the first's backward) is idle time,
                # a straggler's or the pipeline's, not communication
                self._log.append(Record(rank, "compute", ins.name, "comm:" + (ins.spec.tag or "x"),
                                           start if began is None else max(start, began), env.now))
            elif t is Launch:
                done = self._event_for(self._handles, (rank, ins.handle))
                self._launch(rank, ins.stream, ins.spec, ins.name, done,
                             self._rendezvous_key(rank, ins.spec))
            elif t is Wait:
                ev = self._event_for(self._handles, (rank, ins.handle))
                if not ev.processed:
                    st.waiting_on = ins
                    start = env.now
                    yield ev
                    st.waiting_on = None
            elif t is Send:
                arrived = self._event_for(self._arrivals, ins.key)
                self.p2p.setdefault(ins.key, {})["src"] = rank
                self.p2p[ins.key]["sent_ns"] = env.now
                self._launch(rank, "pp", ins.spec, ins.name, arrived)
            elif t is Recv:
                ev = self._event_for(self._arrivals, ins.key)
                if not ev.processed:
                    st.waiting_on = ins
                    yield ev
                    st.waiting_on = None
                info = self.p2p.setdefault(ins.key, {})
                info["dst"] = rank
                info["consumed_ns"] = env.now
            else:
                raise TypeError(f"unknown instruction {ins!r}")
        st.done = True

    def _watchdog(self):
        """Every WATCHDOG_EVENTS instructions: simulated time must have advanced since the last
        look, or the engine is spinning (a livelock): stop with an internal error."""
        if self.env.now == self._watch_now:
            busy = [f"rank {r} at instruction {s.pc}" for r, s in sorted(self._state.items()) if not s.done][:5]
            raise InternalError(f"{WATCHDOG_EVENTS:,} instructions ran without simulated time advancing "
                                f"past {self.env.now} ns (a livelock; {', '.join(busy)})")
        self._watch_now = self.env.now

    def run(self) -> int:
        """Simulate; returns the makespan in ns. Raises DeadlockError naming the waiting ranks."""
        prepare = getattr(self.network, "prepare", None)
        if prepare is not None and not getattr(self.network, "prepared", False):
            # the network learns every call in advance
            prepare(self.programs)
        compiled = {}
        for r in self.programs:
            compiled[r] = self._compile(r, self.programs[r])
            self.programs[r] = ()          # compiled: its runs hold what the step needs of it
        procs = [self.env.process(self._rank_process(r, *compiled[r])) for r in self.programs]
        self.env.run()
        stuck = {r: s for r, s in self._state.items() if not s.done}
        if stuck:
            lines = [f"rank {r} at instruction {s.pc} waits on {_waiting_text(s.waiting_on)}"
                     for r, s in sorted(stuck.items())[:20]]
            raise DeadlockError("deadlock: " + "; ".join(lines))
        del procs
        return max((x.end_ns if type(x) is Record else x[1] + x[2].last_ns for x in self._log), default=0)

    def release(self) -> None:
        """Drop what only the run needed (programs, SimPy state, the network); the log, records,
        p2p table and counts stay."""
        self.programs = {}
        self.env = self.network = None
        self._tail, self._handles, self._arrivals, self._rdv = {}, {}, {}, {}
        self._fixed_spec, self._net_fixed, self._calls, self._free, self._slow = {}, {}, {}, {}, {}

    @property
    def records(self) -> list:
        """Every interval and instant of the step as Records (made from the log on first use)."""
        if self._records is None or self._made != len(self._log):
            self._records, self._made = self._make_records(None), len(self._log)
        return self._records

    def records_of(self, ranks) -> list:
        """The Records of `ranks` only (a `ranks: all` step's outputs for a few of its 1,024
        ranks without making the other ranks' millions), in the order `records` has them."""
        if self._records is not None and self._made == len(self._log):
            keep = set(ranks)
            return [r for r in self._records if r.rank in keep]
        return self._make_records(set(ranks))

    def _make_records(self, keep) -> list:
        """Records from the log: every rank's (`keep` None) or those of the ranks in `keep`;
        under `ranks: all` symmetry each representative's entries for each member it stands for.
        By the compiled module's make_records where it is built (the 1T row's million, made before
        any output is written: 0.56 s in Python, 0.27 s)."""
        members = self.orbits.members if self.orbits is not None else {}
        if _textout is not None:
            got = _textout.make_records(self._log, members, keep, Record, _join_name)
            if got is not None:
                return got
        return self._make_records_py(keep)

    def _make_records_py(self, keep) -> list:
        """`_make_records` in Python."""
        out = []
        add = out.append
        members = self.orbits.members if self.orbits is not None else {}
        new = tuple.__new__       # Record(...) without its Python-level __new__: 2.4x faster, same tuple
        for x in self._log:
            if type(x) is Record:
                for q in members.get(x.rank, (x.rank,)):
                    if keep is None or q in keep:
                        add(x if q == x.rank else x._replace(rank=q))
                continue
            rank, start, run = x
            for q in members.get(rank, (rank,)):
                if keep is not None and q not in keep:
                    continue
                for stream, name, cat, a, b, value in run.parts:
                    if stream is not None:
                        add(new(Record, (q, stream, name, cat, start + a, start + b, value)))
                        continue
                    pre, at, mb = name, start + cat, a               # a Block's parts
                    for stream, name, cat, a, b, value in pre.parts:
                        add(new(Record, (q, stream, name if type(name) is str else mb.join(name)
                                         if type(mb) is str else _join_name(name, mb), cat, at + a, at + b, value)))
        return out

    def busy_intervals(self) -> dict:
        """{rank: (kernel starts, kernel ends, communication starts, communication ends)} as
        int64 arrays (lists from `busy_intervals_py`), for sim.engine.metrics.breakdown_of
        (without making every Record): the log's records as metrics.intervals_by_rank counts
        them, and each run's merged intervals. By the compiled module's busy_intervals where it
        is built (the 1T row's 1.6M times with the breakdown made of them: 0.29 s in Python, 0.09 s)."""
        got = None if _textout is None else _textout.busy_intervals(self._log, Record)
        if got is None:
            return self.busy_intervals_py()
        import numpy as np

        by_rank = {rank: tuple(np.frombuffer(b, dtype=np.int64) for b in four) for rank, four in got.items()}
        if self.orbits is not None:         # every rank of a stage: its representative's lists
            by_rank = {q: lists for r, lists in by_rank.items() for q in self.orbits.members[r]}
        return by_rank

    def busy_intervals_py(self) -> dict:
        """`busy_intervals` in Python."""
        from sim.engine.metrics import intervals_by_rank

        by_rank = intervals_by_rank([x for x in self._log if type(x) is Record])
        for x in self._log:
            if type(x) is Record:
                continue
            rank, start, run = x
            if run.busy is None:
                continue
            kernels, comms = run.busy
            lists = by_rank.get(rank)
            if lists is None:
                lists = by_rank[rank] = ([], [], [], [])
            for a, b in kernels:
                lists[0].append(start + a)
                lists[1].append(start + b)
            for a, b in comms:
                lists[2].append(start + a)
                lists[3].append(start + b)
        if self.orbits is not None:         # every rank of a stage: its representative's lists
            by_rank = {q: lists for r, lists in by_rank.items() for q in self.orbits.members[r]}
        return by_rank
