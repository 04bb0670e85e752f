"""The plan-validity rules (perfmodels/rules.py) and their two wordings agree.

`specs.combination_problems` (one plan, in words) and `tuner.constraints` (columns of plans, counted)
both call the rules; this checks, over every small layout, that a plan one rejects the other rejects
too, so a rule changed in one place changes everywhere.

Run: `.venv/bin/python -m pytest -q tests/perfmodels/test_rules.py`.
"""

import dataclasses
import itertools

import numpy as np
import pytest

from perfmodels import presets, rules
from perfmodels.plans import SCHEDULE_CODE
from perfmodels.specs import DEGREE_FIELDS, Model, Plan, Training, combination_problems
from tuner import constraints as C

MODEL = Model(name="gqa", num_layers=4, hidden_size=48, num_attention_heads=6, num_query_groups=3,
              ffn_hidden_size=96, seq_length=16, vocab_size=64)


def test_rules_broadcast_like_their_scalar_form():
    r = np.array([1, 2, 3, 4, 6, 12])
    assert list(rules.heads_split(6, r)) == [rules.heads_split(6, int(x)) for x in r]
    assert list(rules.query_groups_split(3, r)) == [True, False, True, False, True, True]
    assert (
        rules.query_groups_split(4, 2)
        and rules.query_groups_split(2, 4)
        and not rules.query_groups_split(4, 6)
    )
    assert not rules.enough_layers(4, 2, 3) and rules.enough_layers(4, 2, 2)
    assert rules.num_microbatches(64, 2, 2, 4) == 4 and rules.microbatch_split(64, 2, 2, 4)
    assert not rules.microbatch_split(64, 2, 2, 3)


def _columns(plans: list[Plan]) -> dict[str, np.ndarray]:
    cols = {name: np.array([getattr(p, name) for p in plans]) for name in DEGREE_FIELDS}
    cols["micro_batch_size"] = np.array([p.micro_batch_size for p in plans])
    cols["virtual_stages"] = np.array([p.virtual_stages for p in plans])
    cols["schedule"] = np.array([SCHEDULE_CODE[p.schedule] for p in plans])
    cols["sequence_parallel"] = np.array([p.sequence_parallel for p in plans])
    return cols


def test_combination_problems_and_constraints_reject_the_same_layouts():
    """The rules both enforce (the search adds: >= one micro-batch per stage, sequence parallelism
    needs row ranks, neither of which combination_problems asks of a stated plan)."""
    training = Training(global_batch_size=24)
    plans = [
        Plan(
            G_data=d,
            G_inter=p,
            G_intra_d=dd,
            G_intra_r=r,
            G_intra_c=c,
            micro_batch_size=mb,
            schedule="interleaved-1f1b" if v > 1 else "1f1b",
            virtual_stages=v,
        )
        for d, p, dd, r, c, mb, v in itertools.product(
            (1, 2), (1, 2, 4), (1, 2), (1, 2, 3), (1, 2), (1, 2, 4), (1, 2)
        )
    ]
    cols = _columns(plans)
    shared = (C.heads_split, C.query_groups_split, C.hidden_split, C.batch_split, C.enough_layers)
    bad = np.zeros(len(plans), bool)
    for fn in shared:
        bad |= fn(MODEL, None, training, cols).mask
    m = rules.num_microbatches(24, cols["G_data"], cols["G_intra_d"], cols["micro_batch_size"])
    bad |= ~rules.microbatch_split(24, cols["G_data"], cols["G_intra_d"], cols["micro_batch_size"])
    bad |= (cols["virtual_stages"] > 1) & (cols["G_inter"] > 1) & ~rules.interleave_fits(m, cols["G_inter"])
    for plan, rejected in zip(plans, bad):
        cluster = dataclasses.replace(presets.cluster("local-cpu", num_gpus=1), num_gpus=plan.world_size,
                                      gpus_per_node=plan.world_size)
        assert bool(combination_problems(MODEL, cluster, training, plan)) == bool(rejected), plan


def test_megatron_layout_cuts_any_split_no_chunk_above_the_balanced_one():
    """The custom layout gridtune prints for Megatron-Core (`--pipeline-model-parallel-layout`):
    DeepSeek-V3's 61 layers over 8 x 4 chunks the way NVIDIA cut them for 25.09 (one layer with the
    embedding, two per chunk, the last ones short), every layer once, no pipeline rank above the
    busiest stage the model prices, ceil(L / (S v)) v."""
    from perfmodels.rules import layer_split, megatron_layout, megatron_layout_split

    assert megatron_layout(61, 8, 4) == "Et|" + "t*2|" * 29 + "t|tL"
    assert megatron_layout(3, 3, 1) == "Et|t|tL"
    for L, S, v in [(61, 8, 4), (61, 8, 1), (94, 8, 4), (36, 4, 1), (48, 2, 12), (7, 2, 3)]:
        chunks = megatron_layout(L, S, v).split("|")
        counts = [int(c.strip("EL").split("*")[1]) if "*" in c else c.count("t") for c in chunks]
        assert len(chunks) == S * v and sum(counts) == L
        per_rank = [sum(counts[r::S]) for r in range(S)]
        assert max(per_rank) <= -(-L // (S * v)) * v, (L, S, v, per_rank)
    assert megatron_layout_split(61, 8, 4) and not megatron_layout_split(61, 8, 8)
    # Megatron-LM's first/last counts cannot cut 61 layers over 8 x 4; megatron-core's layout can
    assert not layer_split("megatron", 61, 8, 4) and layer_split("megatron-core", 61, 8, 4)
    with pytest.raises(ValueError, match="fewer than"):
        megatron_layout(61, 8, 8)
