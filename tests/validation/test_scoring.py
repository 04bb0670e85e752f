"""Median-over-candidates scoring: the arithmetic on hand-built numbers, and on a hand-built case."""

import numpy as np
import pytest

from perfmodels import presets
from perfmodels.specs import Model, Plan, Training
from perfmodels.steptime import predict
from validation.cases import Case
from validation.hardware import CardMemory
from validation.scoring import score_case, summarize


def test_median_and_spread_over_the_candidates_that_fit():
    times = np.array([1.0, 2.0, 3.0, 10.0])
    mems = np.array([10.0, 10.0, 10.0, 90.0])  # the 10 s candidate does not fit in 80 GiB
    s = summarize(times, mems, np.full(4, 80.0))
    assert (s.median_time_s, s.spread, s.fastest_fitting_time_s) == (2.0, 3.0, 1.0)
    assert (s.fits, s.candidates, s.fitting, s.memory_gib) == (True, 4, 3, 10.0)


def test_when_nothing_fits_the_median_is_over_all_and_there_is_no_fastest_fitting():
    s = summarize(np.array([4.0, 2.0]), np.array([90.0, 100.0]), np.array([80.0, 80.0]))
    assert (s.median_time_s, s.spread, s.fastest_fitting_time_s, s.fits) == (3.0, 2.0, None, False)
    assert s.memory_gib == 95.0


def test_one_candidate_has_no_spread():
    s = summarize(np.array([5.0]), np.array([1.0]), np.array([80.0]))
    assert (s.median_time_s, s.spread, s.fastest_fitting_time_s) == (5.0, 1.0, 5.0)


def _case(trainings, plans) -> Case:
    model = Model(name="gpt", num_layers=8, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                  vocab_size=51200)
    return Case(case_id="x", source="", framework="megatron-core", group="g", model=model,
                cluster=presets.cluster("selene", 16), trainings=tuple(trainings), plans=tuple(plans),
                measured_time_s=1.0, card_memory=CardMemory(gib=80.0))


def test_a_case_with_unknown_options_scores_the_median_of_its_candidates():
    """Three candidate stacks of one stated layout: the score is the median of the three predictions
    made one by one, and the spread their max/min."""
    plan = Plan(G_data=4, G_intra_r=4, micro_batch_size=2, recompute="full", zero_stage=1)
    trainings = [Training(global_batch_size=64, dtype="bf16", stack="megatron-core", flash_attention=f,
                          overlap_grad_reduce=o) for f, o in ((True, True), (False, True), (False, False))]
    one_by_one = [
        predict(_case(trainings, [plan]).model, presets.cluster("selene", 16), t, plan).iteration_time_s
        for t in trainings
    ]
    s = score_case(_case(trainings, [plan]))
    assert s.candidates == 3
    assert s.median_time_s == pytest.approx(float(np.median(one_by_one)), rel=1e-9)
    assert s.spread == pytest.approx(max(one_by_one) / min(one_by_one), rel=1e-9)
    assert s.fastest_fitting_time_s == pytest.approx(min(one_by_one), rel=1e-9)


def test_invalid_candidates_are_dropped_and_a_case_with_none_left_is_an_error():
    good = Plan(G_data=4, G_intra_r=4, micro_batch_size=2)
    bad = Plan(G_data=16, micro_batch_size=3)  # 64 samples do not split into 16 x 3
    training = Training(global_batch_size=64, stack="megatron-core")
    assert score_case(_case([training], [good, bad])).candidates == 1
    with pytest.raises(ValueError, match="no valid plan"):
        score_case(_case([training], [bad]))
