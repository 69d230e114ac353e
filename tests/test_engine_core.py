"""The engine core on hand-worked programs: the whole (name, start, end) log is asserted."""

from __future__ import annotations

import pytest

from sim.engine.core import Comm, CommSpec, Compute, DeadlockError, Engine, Launch, Recv, Send, Wait
from sim.engine.metrics import breakdown


class FixedNetwork:
    """Every transfer takes `ns_per_byte * size` ns (a hand-checkable stand-in)."""

    def __init__(self, ns_per_byte=1):
        self.ns_per_byte = ns_per_byte

    def transfer(self, env, spec):
        yield env.timeout(spec.size_bytes * self.ns_per_byte)


def log(engine):
    return sorted((r.rank, r.stream, r.name, r.start_ns, r.end_ns) for r in engine.records)


def spec(n, tag="tp", op="all_reduce"):
    return CommSpec(op, (0, 1), n, tag)


def test_sequential_compute_and_exposed_collective():
    e = Engine({0: [Compute(10, "a"), Comm(spec(5), "ar"), Compute(7, "b")]}, FixedNetwork())
    assert e.run() == 22
    assert log(e) == [(0, "compute", "a", 0, 10), (0, "compute", "ar", 10, 15), (0, "compute", "b", 15, 22)]
    b = breakdown(e.records, 22)[0]
    assert (b.compute_ns, b.exposed_comm_ns, b.bubble_ns) == (17, 5, 0)


def test_launched_comm_overlaps_compute_and_wait_blocks():
    prog = [Launch("g", spec(30, "dp"), "grad", "dp"), Compute(10, "a"), Wait("g"), Compute(5, "opt")]
    e = Engine({0: prog}, FixedNetwork())
    assert e.run() == 35
    assert log(e) == [(0, "compute", "a", 0, 10), (0, "compute", "opt", 30, 35), (0, "dp", "grad", 0, 30)]
    b = breakdown(e.records, 35)[0]
    # computes 15; communicates without computing 10..30 = 20; no idle
    assert (b.compute_ns, b.exposed_comm_ns, b.bubble_ns) == (15, 20, 0)


def test_streams_are_fifo():
    prog = [Launch(1, spec(10, "dp"), "b1", "dp"), Launch(2, spec(10, "dp"), "b2", "dp"), Wait(2)]
    e = Engine({0: prog}, FixedNetwork())
    assert e.run() == 20
    assert log(e) == [(0, "dp", "b1", 0, 10), (0, "dp", "b2", 10, 20)]


def test_send_recv_between_ranks_and_bubble():
    progs = {0: [Compute(10, "F0"), Send("x", spec(4, "pp", "send_recv"), "send")],
             1: [Recv("x", "recv"), Compute(10, "F1")]}
    e = Engine(progs, FixedNetwork())
    assert e.run() == 24
    assert log(e) == [(0, "compute", "F0", 0, 10), (0, "pp", "send", 10, 14), (1, "compute", "F1", 14, 24)]
    bd = breakdown(e.records, 24)
    assert (bd[1].compute_ns, bd[1].exposed_comm_ns, bd[1].bubble_ns) == (10, 0, 14)
    assert (bd[0].compute_ns, bd[0].exposed_comm_ns, bd[0].bubble_ns) == (10, 4, 10)


def test_deadlock_names_the_waiting_ranks():
    progs = {0: [Recv("b", "recv-b"), Send("a", spec(1, "pp", "send_recv"), "s")],
             1: [Recv("a", "recv-a"), Send("b", spec(1, "pp", "send_recv"), "s")]}
    with pytest.raises(DeadlockError, match=r"rank 0 .* recv-b .*rank 1 .* recv-a"):
        Engine(progs, FixedNetwork()).run()


def test_deadlock_says_what_each_rank_waits_in():
    """The message names each stuck rank's instruction and what it waits for: a message, a
    handle never launched, a collective whose other member never comes."""
    progs = {0: [Compute(5, "c"), Recv(("act", 3), "recv act")],
             1: [Wait("h", "wait grads")],
             2: [Comm(CommSpec("all_reduce", (2, 3), 8, "tp"), "tp all-reduce")],
             3: [Recv("never", "recv x")]}
    with pytest.raises(DeadlockError) as e:
        Engine(progs, FixedNetwork()).run()
    assert str(e.value) == ("deadlock: rank 0 at instruction 1 waits on recv act (message ('act', 3)); "
                            "rank 1 at instruction 0 waits on wait grads (handle 'h'); "
                            "rank 2 at instruction 0 waits on tp all-reduce (all_reduce over 2 ranks); "
                            "rank 3 at instruction 0 waits on recv x (message 'never')")


def test_deterministic():
    progs = {r: [Compute(3 + r, "c"), Launch("h", spec(7, "dp"), "g", "dp"), Compute(2, "d"), Wait("h")]
             for r in range(4)}
    a, b = Engine(progs, FixedNetwork()), Engine(progs, FixedNetwork())
    assert a.run() == b.run() and log(a) == log(b)


def test_comm_slows_concurrent_compute_by_the_factor():
    # a 50 ns collective on the dp stream while a 100 ns kernel runs at half speed: the first
    # 50 ns do 25 ns of work, the remaining 75 run at full speed -> the kernel ends at 125
    prog = [Launch("g", spec(50, "dp"), "grad", "dp"), Compute(100, "a"), Wait("g"), Compute(10, "b")]
    e = Engine({0: prog}, FixedNetwork(), comm_compute_slowdown=0.5)
    assert e.run() == 135
    assert log(e) == [(0, "compute", "a", 0, 125), (0, "compute", "b", 125, 135), (0, "dp", "grad", 0, 50)]
    # no comm in flight: no slowdown; exposed collectives do not overlap compute
    e = Engine({0: [Compute(100, "a"), Comm(spec(5), "ar"), Compute(7, "b")]}, FixedNetwork(),
               comm_compute_slowdown=0.5)
    assert e.run() == 112


def test_collective_of_simulated_members_is_a_barrier():
    # ranks 0 and 1 both simulated: the all-reduce starts when the later one (rank 1, at 30)
    # arrives and ends for both at 30 + 5; rank 0's record is the call's, its wait 10-30 idle
    progs = {0: [Compute(10, "a"), Comm(spec(5), "ar"), Compute(1, "c")],
             1: [Compute(30, "a"), Comm(spec(5), "ar"), Compute(1, "c")]}
    e = Engine(progs, FixedNetwork())
    assert e.run() == 36
    assert log(e) == [(0, "compute", "a", 0, 10), (0, "compute", "ar", 30, 35), (0, "compute", "c", 35, 36),
                      (1, "compute", "a", 0, 30), (1, "compute", "ar", 30, 35), (1, "compute", "c", 35, 36)]
