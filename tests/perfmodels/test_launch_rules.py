"""The launcher rules of perfmodels/rules.py against brute force and the frameworks' own code, and
their wording (perfmodels/launchable.py) against the search's constraints (tuner/constraints.py).

Run: `.venv/bin/python -m pytest -q tests/perfmodels/test_launch_rules.py`.
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import numpy as np
import pytest

from perfmodels import presets, rules
from perfmodels.launchable import RULES, stack_problems
from perfmodels.specs import Plan, Training
from tuner import constraints as C


def _uneven_brute(L: int, S: int, v: int) -> bool:
    """Some first/last/middle counts (multiples of v, 1..busiest) that Megatron accepts and that put no
    more layers on a stage than the balanced split's busiest, ceil(L / (S v)) * v."""
    if L % v:
        return False
    busiest = -(-L // (S * v)) * v
    options = range(v, busiest + 1, v)
    for first in options:
        for last in options:
            rest = L - first - last
            if S == 2:
                if rest == 0:
                    return True
                continue
            if rest > 0 and rest % (S - 2) == 0 and (rest // (S - 2)) % v == 0 and rest // (S - 2) <= busiest:
                return True
    return False


def test_megatron_uneven_split_matches_brute_force():
    for L in range(2, 140, 3):
        for S in range(2, 17):
            for v in (1, 2, 3, 4):
                if S * v > L:
                    continue
                assert bool(rules.megatron_uneven_split(L, S, v)) == _uneven_brute(L, S, v), (L, S, v)
    # vectorized over columns, as the search applies it
    S = np.array([2, 4, 8, 16, 5])
    got = rules.layer_split("megatron", 126, S, np.ones_like(S))
    assert got.tolist() == [True, True, True, True, True]


def test_megatron_first_last_is_accepted_by_the_count_rules():
    for L, S, v in ((126, 16, 1), (126, 4, 1), (126, 8, 1), (80, 3, 1), (94, 4, 2), (61, 8, 1)):
        split = rules.megatron_first_last(L, S, v)
        assert split is not None
        first, last = split
        middle = L - first - last
        busiest = -(-L // (S * v)) * v
        assert first % v == 0 and last % v == 0 and 0 < first <= busiest and 0 < last <= busiest
        assert (S == 2 and middle == 0) or (middle % (S - 2) == 0 and (middle // (S - 2)) % v == 0)
        assert middle // max(S - 2, 1) <= busiest
    assert rules.megatron_first_last(96, 8, 2) is None  # even
    with pytest.raises(ValueError, match="splits neither"):
        rules.megatron_first_last(95, 4, 2)  # 95 is odd: no count of it is a multiple of 2


@pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None,
                    reason="torchtitan is not installed (pip install -e '.[frameworks]')")
def test_torchtitan_layer_split_matches_its_pipeline_code():
    from torchtitan.config.configs import ParallelismConfig
    from torchtitan.distributed import pipeline_parallel
    from torchtitan.distributed.parallel_dims import ParallelDims

    for L in (16, 32, 61, 80, 126):
        for S in (2, 3, 4, 8):
            for v in (1, 2, 3, 4):
                if S * v > L:
                    continue
                per = -(-L // (S * v))
                schedule = "Interleaved1F1B" if v > 1 else "1F1B"
                par = ParallelismConfig(pipeline_parallel_degree=S, pipeline_parallel_schedule=schedule,
                                        pipeline_parallel_layers_per_stage=per,
                                        pipeline_parallel_first_stage_less_layers=0,
                                        pipeline_parallel_last_stage_less_layers=0)
                dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=S, ep=1, world_size=S)
                try:
                    stages, *_ = pipeline_parallel._get_pipeline_metadata(
                        dims, par, SimpleNamespace(layers=[None] * L))
                    theirs = stages == S * v
                except ValueError:
                    theirs = False
                assert bool(rules.torchtitan_layer_split(L, S, v)) == theirs, (L, S, v)


def test_the_words_and_the_search_constraints_agree():
    model = presets.model("llama3-405b")
    cases = [
        ("megatron-core", Plan(G_data=4, G_inter=4, G_intra_r=16, zero_stage=1)),  # TP 16 over 8 groups
        ("megatron-core", Plan(G_data=4, G_inter=4, G_intra_r=8, zero_stage=2)),  # no ZeRO-2 launcher
        ("deepspeed", Plan(G_data=32, G_inter=4, zero_stage=2, placement=("col", "row", "depth", "data",
                                                                          "inter"))),
        ("deepspeed", Plan(G_data=16, G_inter=2, G_intra_r=4, zero_stage=1)),  # AutoTP with a pipeline
        # 126 layers in 8 x 3 chunks: 6 layers a stage make 21 stages, not 24
        ("torchtitan", Plan(G_data=16, G_inter=8, schedule="interleaved-1f1b", virtual_stages=3,
                            zero_stage=2)),
        ("fsdp", Plan(G_data=128, zero_stage=3, recompute="selective")),
        ("gridtune", Plan(G_data=4, G_inter=4, G_intra_r=8, zero_stage=1)),  # the engine replicates groups
    ]
    for stack, plan in cases:
        tr = Training(global_batch_size=1024, stack=stack)
        cols = {name: np.asarray([getattr(plan, name)]) for name in ("G_data", "G_inter", "G_intra_d",
                                                                     "G_intra_r", "G_intra_c", "zero_stage",
                                                                     "virtual_stages")}
        cols["recompute"] = np.asarray([{"none": 0, "selective": 1, "full": 2}[plan.recompute]])
        searched = [C.query_groups_split, C.stack_layer_split, C.stack_zero_stages, C.stack_recompute,
                    C.stack_tp_with_pp]
        rejected = any(bool(rule(model, None, tr, cols).mask[0]) for rule in searched)
        worded = stack_problems(model, tr, plan)
        assert rejected == bool(worded), (stack, plan, worded)
        assert rejected == (stack != "gridtune"), (stack, plan)


def test_every_rule_cites_a_framework_line():
    for rule in RULES:
        assert ":" in rule.source and any(name in rule.source for name in (
            "Megatron", "DeepSpeed", "torchtitan", "LLM Foundry")), rule


def test_sequence_parallel_needs_an_even_sequence_split():
    """GPT-2 XL has 25 heads: TP 5 splits them, but not its 1,024-token sequence, which Megatron's
    sequence parallelism scatters over the TP ranks."""
    model = presets.model("gpt2-xl")
    tr = Training(global_batch_size=80, stack="megatron-core")
    plan = Plan(G_data=8, G_intra_r=5, zero_stage=1, sequence_parallel=True)
    assert any("does not split evenly" in p for p in stack_problems(model, tr, plan))
    cols = {"G_intra_r": np.array([5, 5, 4]), "sequence_parallel": np.array([True, False, True])}
    assert C.sequence_parallel_seq(model, None, tr, cols).mask.tolist() == [True, False, False]
