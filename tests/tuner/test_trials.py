"""tuner.trials: which leaders the band cannot separate, and which layouts to measure next."""

from __future__ import annotations

import pytest

from perfmodels import presets
from perfmodels.specs import Training
from tuner.search import recommend
from tuner.trials import advise, leaders, suggest

MODEL = presets.model("gpt3-1.7b")
CLUSTER = presets.cluster("selene", num_gpus=32)
TRAINING = Training(global_batch_size=128, stack="megatron-core")


def test_leaders_are_the_intervals_that_overlap_the_best() -> None:
    # 1.1 s x (1 - 0.1) = 0.99 < 1.0 x 1.1: overlaps; 1.5 x 0.9 = 1.35 > 1.1: does not
    assert leaders([1.1, 1.0, 1.5], 0.1) == [1, 0]
    assert leaders([1.0, 1.3], 0.1) == [0]
    assert leaders([1.0, 1.0], 0.0) == [0, 1]  # a tie is not separated by any band


def test_suggested_trials_separate_the_leaders() -> None:
    rec = recommend(MODEL, CLUSTER, TRAINING, top_k=8)
    advice = advise(MODEL, CLUSTER, TRAINING, rec.candidates, 3)
    assert advice is not None and advice.close and advice.band == pytest.approx(0.15)
    ranks = [t.rank for t in advice.trials]
    assert len(ranks) == len(set(ranks)) == min(3, len(advice.leaders))
    assert set(ranks) <= set(advice.leaders)
    # each measurement leaves less of the leaders' differences unknown, and the greedy first pick is
    # the single layout that leaves the least
    variances = [t.variance_after for t in advice.trials]
    assert variances == sorted(variances, reverse=True) and variances[0] < advice.variance_before
    one = advise(MODEL, CLUSTER, TRAINING, rec.candidates, 1)
    assert one is not None and one.trials[0].rank == ranks[0]


def test_a_clear_winner_needs_no_trials() -> None:
    rec = recommend(MODEL, CLUSTER, TRAINING, top_k=3)
    advice = suggest(MODEL, CLUSTER, TRAINING, [c.plan for c in rec.candidates], [1.0, 1.5, 2.0], 0.1, 3)
    assert not advice.close and advice.trials == [] and advice.leaders == [1]
    with pytest.raises(ValueError, match="suggest_trials"):
        suggest(MODEL, CLUSTER, TRAINING, [rec.candidates[0].plan], [1.0], 0.1, -1)
