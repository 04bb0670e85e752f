"""Rank order, group membership and link levels (AxoNN's rank formula, field_facts.md)."""

import functools
import operator

import numpy as np
import pytest

from perfmodels import layout


def test_axonn_rank_formula_for_default_order():
    deg = {"data": 2, "inter": 2, "depth": 2, "row": 2, "col": 2}
    G_intra = 8
    for rank in range(32):
        c = layout.rank_coords(rank, deg)
        expected = c["data"] * (2 * G_intra) + c["inter"] * G_intra + c["depth"] * 4 + c["row"] * 2 + c["col"]
        assert expected == rank
        assert layout.rank_of(c, deg) == rank


def test_group_ranks_are_strided_by_inner_degrees():
    deg = {"data": 2, "inter": 1, "depth": 2, "row": 2, "col": 2}
    assert layout.group_ranks(0, "col", deg) == [0, 1]
    assert layout.group_ranks(0, "row", deg) == [0, 2]
    assert layout.group_ranks(0, "depth", deg) == [0, 4]
    assert layout.group_ranks(5, "data", deg) == [5, 13]
    assert sorted(functools.reduce(operator.iadd, layout.all_groups("row", deg), [])) == list(range(16))


def test_group_geometry_levels_and_members_per_node():
    deg = {k: np.array([v]) for k, v in {"data": 16, "inter": 1, "depth": 1, "row": 8, "col": 1}.items()}
    geo = layout.group_geometry(deg, ("col", "row", "depth", "inter", "data"), gpus_per_node=8)
    assert geo["row"]["intra"][0] and geo["row"]["members_per_node"][0] == 8
    assert not geo["data"]["intra"][0] and geo["data"]["members_per_node"][0] == 1
    # Megatron order with tp=2: each data-parallel group has 4 members on every node
    deg2 = {k: np.array([v]) for k, v in {"data": 32, "inter": 8, "depth": 1, "row": 2, "col": 1}.items()}
    geo2 = layout.group_geometry(deg2, ("col", "row", "depth", "data", "inter"), gpus_per_node=8)
    assert geo2["data"]["members_per_node"][0] == 4 and not geo2["data"]["intra"][0]
    assert geo2["inter"]["members_per_node"][0] == 1


def test_partition_layers_balanced_with_extras_after_first_stage():
    assert layout.partition_layers(8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert layout.partition_layers(10, 4) == [(0, 2), (2, 5), (5, 8), (8, 10)]
    parts = layout.partition_layers(30, 8)
    assert parts[0][0] == 0 and parts[-1][1] == 30
    assert max(e - s for s, e in parts) == 4 and min(e - s for s, e in parts) == 3
    with pytest.raises(ValueError, match="num_layers=2 into num_stages=3"):
        layout.partition_layers(2, 3)
    chunks = layout.partition_chunks(8, 2, 2)
    assert chunks == [[(0, 2), (4, 6)], [(2, 4), (6, 8)]]


def test_expert_groups_fold_a_stage_innermost_first():
    # 8 ranks: row 2 (innermost), data 2, inter 2 (default order col,row,cp,depth,inter,data: data outermost)
    deg = {"row": 2, "data": 2, "inter": 2}
    groups = layout.expert_groups(deg, G_ep=2, G_etp=1)
    # stage 0 holds ranks with inter=0: rows 0/1 at data 0 (ranks 0, 1) and data 1 (ranks 4, 5)
    assert groups["ep"][:2] == [[0, 1], [4, 5]]
    assert groups["edp"][:2] == [[0, 4], [1, 5]]
    assert groups["etp"][:4] == [[0], [1], [4], [5]]
    folded = layout.expert_groups(deg, G_ep=2, G_etp=2)
    assert folded["etp"][:2] == [[0, 1], [4, 5]] and folded["ep"][:2] == [[0, 4], [1, 5]]
    assert folded["edp"][0] == [0]
    # every stage rank is in exactly one group of each kind
    for kind in ("etp", "ep", "edp"):
        assert sorted(r for g in groups[kind] for r in g) == list(range(8))
    with pytest.raises(ValueError, match=r"G_etp\*G_ep = 1\*8 = 8 does not divide the 4 ranks"):
        layout.expert_groups(deg, G_ep=8, G_etp=1)


def test_group_geometry_orders_places_each_plan_under_its_own_order():
    """One pass over plans under several placements gives what `group_geometry` gives each
    placement's plans alone (the search prices families of every placement at once)."""
    import itertools

    from perfmodels.specs import AXES

    rng = np.random.default_rng(0)
    n = 400
    degrees = {a: rng.choice([1, 2, 3, 4, 8, 16], n) for a in AXES}
    orders = list(itertools.permutations(AXES))[::97]
    which = rng.integers(0, len(orders), n)
    together = layout.group_geometry_orders(degrees, orders, which, 8)
    for k, order in enumerate(orders):
        idx = which == k
        alone = layout.group_geometry({a: v[idx] for a, v in degrees.items()}, order, 8)
        for axis in AXES:
            for field, values in alone[axis].items():
                assert np.array_equal(values, together[axis][field][idx]), (order, axis, field)
    # strides: the product of the degrees placed inside each axis, for one hand-checked plan
    one = {a: np.asarray([d]) for a, d in zip(AXES, (2, 4, 1, 8, 3, 5))}
    strides = layout.order_strides(one, [AXES, tuple(reversed(AXES))], np.asarray([1]))
    assert {a: int(v[0]) for a, v in strides.items()} == {
        "data": 1, "inter": 5, "depth": 15, "cp": 120, "row": 120, "col": 480}
    # one axis's stride alone (what the expert groups read of "inter") is the same
    strides = layout.order_strides(degrees, orders, which)
    for axis in AXES:
        assert np.array_equal(layout.axis_stride(degrees, orders, which, axis), strides[axis]), axis
    assert int(layout.axis_stride(one, [AXES, tuple(reversed(AXES))], np.asarray([1]), "depth")[0]) == 15
