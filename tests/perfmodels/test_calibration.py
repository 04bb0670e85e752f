"""Calibration recovers per-component corrections from measured steps (synthetic ground truth:
the 'measurements' are the model's own predictions under known corrections)."""

import dataclasses

import numpy as np
import pytest

from perfmodels import presets
from perfmodels.calibration import calibrate
from perfmodels.specs import Plan, Profile, Training
from perfmodels.steptime import predict

MODEL = presets.model("gpt3-1.7b")
# host floor off: the synthetic truth scales components, and a host-bound micro-batch would not scale
TRAINING = Training(global_batch_size=64, host_us_per_block=0.0)
PLANS = [Plan(G_data=16), Plan(G_data=4, G_intra_r=4), Plan(G_data=2, G_inter=2, G_intra_r=4),
         Plan(G_data=8, G_intra_r=2), Plan(G_data=1, G_inter=4, G_intra_r=4), Plan(G_data=2, G_intra_r=8)]


def test_calibration_recovers_known_corrections_and_shrinks_error():
    base = presets.cluster("selene", 16)
    truth = dataclasses.replace(base, profile=Profile(corrections=(("compute", 1.6), ("tp_comm", 2.5),
                                                                   ("dp_comm", 0.7), ("pp_p2p", 1.0))))
    pairs = [
        (predict(MODEL, base, TRAINING, p), predict(MODEL, truth, TRAINING, p).iteration_time_s)
        for p in PLANS
    ]
    result = calibrate(pairs, prior=1e-4)
    assert result.mape_before > 0.3
    assert result.mape_after < 0.05
    assert result.corrections["compute"] == pytest.approx(1.6, rel=0.1)
    assert result.corrections["tp_comm"] == pytest.approx(2.5, rel=0.25)
    calibrated = dataclasses.replace(base, profile=result.profile)
    for p, (_, measured) in zip(PLANS, pairs, strict=True):
        pred = predict(MODEL, calibrated, TRAINING, p)
        assert pred.iteration_time_s == pytest.approx(measured, rel=0.08)
        assert pred.constants_source == "calibrated"
        assert pred.uncertainty_rel == result.uncertainty_rel


def test_three_measurements_fix_the_dominant_component_and_keep_the_rest_near_one():
    base = presets.cluster("selene", 16)
    truth = dataclasses.replace(base, profile=Profile(corrections=(("compute", 1.5),)))
    pairs = [(predict(MODEL, base, TRAINING, p), predict(MODEL, truth, TRAINING, p).iteration_time_s)
             for p in PLANS[:3]]
    result = calibrate(pairs)
    assert result.corrections["compute"] == pytest.approx(1.5, rel=0.1)
    assert result.mape_after < result.mape_before / 2
    assert np.isfinite(result.uncertainty_rel)


def test_bad_measurements_are_named():
    pred = predict(MODEL, presets.cluster("selene", 16), TRAINING, PLANS[0])
    with pytest.raises(
        ValueError, match=r"measurements\[1\].iteration_time_s must be a positive number, got -1"
    ):
        calibrate([(pred, 1.0), (pred, -1.0)])
    with pytest.raises(ValueError, match="at least one"):
        calibrate([])
