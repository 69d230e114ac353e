"""Rank <-> coordinates <-> GPU, against Megatron-Core's documented example groups."""

from __future__ import annotations

import pytest

from sim.layout import Layout


def test_megatron_parallel_state_example():
    # megatron/core/parallel_state.py, initialize_model_parallel docstring: 16 GPUs, tp 2, pp 4
    # -> dp 2: TP groups [g0,g1] [g2,g3] ...; PP groups [g0,g4,g8,g12] ...; DP groups [g0,g2]
    # [g1,g3] [g4,g6] ...
    lay = Layout(tp=2, cp=1, ep=1, dp=2, pp=4, gpus_per_node=8)
    assert lay.group(0, "tp") == (0, 1) and lay.group(2, "tp") == (2, 3)
    assert lay.group(0, "pp") == (0, 4, 8, 12) and lay.group(1, "pp") == (1, 5, 9, 13)
    assert lay.group(0, "dp") == (0, 2) and lay.group(1, "dp") == (1, 3) and lay.group(4, "dp") == (4, 6)


def test_round_trip_and_groups_partition_the_world():
    lay = Layout(tp=2, cp=2, ep=2, dp=4, pp=2, gpus_per_node=8)
    seen = set()
    for r in range(lay.world_size):
        c = lay.coord(r)
        assert lay.rank(tp=c.tp, cp=c.cp, dp=c.dp, pp=c.pp) == r
        seen.add((c.tp, c.cp, c.dp, c.pp))
    assert len(seen) == lay.world_size == 32
    for dim, size in (("tp", 2), ("cp", 2), ("dp", 4), ("pp", 2), ("ep", 2), ("edp", 4), ("dp-cp", 8)):
        groups = {lay.group(r, dim) for r in range(lay.world_size)}
        assert all(len(g) == size for g in groups)
        assert sorted(r for g in groups for r in g) == list(range(32))   # a partition


def test_tp_stays_inside_a_node_and_ep_is_innermost_of_dp_cp():
    lay = Layout(tp=8, cp=1, ep=4, dp=8, pp=2, gpus_per_node=8)
    for r in range(0, lay.world_size, 8):
        assert lay.nodes_spanned(lay.group(r, "tp")) == 1
    # ep groups: consecutive dp indices (ep inner): dp 0..3 then 4..7
    assert [lay.coord(x).dp for x in lay.group(0, "ep")] == [0, 1, 2, 3]
    assert [lay.coord(x).dp for x in lay.group(0, "edp")] == [0, 4]


def test_rank_order_changes_placement():
    a = Layout(tp=2, cp=1, ep=1, dp=2, pp=2, gpus_per_node=4, rank_order=("tp", "cp", "ep", "dp", "pp"))
    b = Layout(tp=2, cp=1, ep=1, dp=2, pp=2, gpus_per_node=4, rank_order=("tp", "cp", "ep", "pp", "dp"))
    assert a.group(0, "pp") == (0, 4) and b.group(0, "pp") == (0, 2)
    assert a.nodes_spanned(a.group(0, "dp")) == 1 and b.nodes_spanned(b.group(0, "dp")) == 2


def test_bad_arguments():
    with pytest.raises(ValueError):
        Layout(tp=1, cp=1, ep=3, dp=4, pp=1, gpus_per_node=8)
    lay = Layout(tp=1, cp=1, ep=1, dp=2, pp=1, gpus_per_node=8)
    with pytest.raises(ValueError):
        lay.coord(2)


def test_pipeline_peer_hand_worked():
    """Layout.peer keeps tp / cp / dp and changes pp: TP2 DP2 PP2 in the default order, rank 3 is
    (tp 1, dp 1, pp 0); its peer at pp 1 is 3 + 2 x 2 = 7, and back."""
    lay = Layout(tp=2, cp=1, ep=1, dp=2, pp=2, gpus_per_node=8)
    assert lay.peer(3, 1) == 7 and lay.peer(7, 0) == 3 and lay.peer(3, 0) == 3


def test_coord_kept_per_rank_equals_the_arithmetic():
    """`coord` keeps each rank's coordinates (ranks: all by symmetry maps a million messages'
    ranks): every rank's kept Coord is the mixed-radix arithmetic's, and a rank out of range is
    refused every time (nothing kept for it)."""
    lay = Layout(tp=2, cp=2, ep=2, dp=2, pp=3, gpus_per_node=8, etp=1)
    first = [lay.coord(r) for r in range(lay.world_size)]
    assert first == [lay._coord(r) for r in range(lay.world_size)]
    assert [lay.coord(r) for r in range(lay.world_size)] == first
    assert len({(c.tp, c.cp, c.dp, c.pp) for c in first}) == lay.world_size
    for _ in range(2):
        with pytest.raises(ValueError):
            lay.coord(lay.world_size)
