"""The band a calibrated prediction claims holds one more measured run: the leave-one-out error of
the model combined with the run-to-run scatter measured on the machine (perfmodels.calibration
`band_rel`, `pooled_run_scatter_rel`). Expected values are derived by hand in each test."""

from __future__ import annotations

import math

import numpy as np
import pytest

from perfmodels import presets
from perfmodels.calibration import (
    BAND_Z,
    Run,
    band_rel,
    calibrate_runs,
    pooled_run_scatter_rel,
)
from perfmodels.io import profile_from_dict, profile_to_dict
from perfmodels.specs import Plan, Training
from perfmodels.steptime import predict


def test_band_z_is_the_two_sided_normal_quantile_of_the_loo_coverage():
    # 90% two-sided: Phi^-1(0.95) = 1.6449
    assert abs(BAND_Z - 1.6449) < 1e-4


def test_pooled_scatter_of_repeated_runs_by_hand():
    # plan A: 1.0 and 1.2 s -> sum of squared log deviations about the mean = ln(1.2)^2 / 2, 1 dof;
    # plan B: 2.0 and 2.0 -> 0, 1 dof; plan C measured once -> nothing.
    # pooled sd = sqrt((ln(1.2)^2 / 2) / 2) = ln(1.2) / 2 = 0.091161, 2 dof
    scatter, dof = pooled_run_scatter_rel([[1.0, 1.2], [2.0, 2.0], [3.0]])
    assert dof == 2
    assert scatter == pytest.approx(math.log(1.2) / 2, rel=1e-12)
    assert pooled_run_scatter_rel([[1.0], [2.0]]) is None


def test_band_adds_the_measured_scatter_in_quadrature():
    # leave-one-out errors all 30%: their 90% quantile is 0.30; a measured scatter of 10% at
    # z = 1.645 is 0.1645; together sqrt(0.30^2 + 0.1645^2) = 0.3421. The old band was 0.30.
    loo = np.full(10, 0.30)
    assert band_rel(loo, run_scatter_rel=0.10, mape_after=0.05) == pytest.approx(
        math.hypot(0.30, BAND_Z * 0.10), rel=1e-12)
    assert band_rel(loo, run_scatter_rel=0.10, mape_after=0.05) == pytest.approx(0.3421, abs=1e-4)
    # no measured scatter: the leave-one-out quantile, as before
    assert band_rel(loo, run_scatter_rel=0.0, mape_after=0.05) == pytest.approx(0.30)
    # never below the in-sample error
    assert band_rel(np.full(3, 0.01), run_scatter_rel=0.0, mape_after=0.2) == pytest.approx(0.2)


def test_calibration_carries_the_scatter_into_the_profile_and_its_band():
    """Exact synthetic runs (leave-one-out error ~0) on a machine whose runs scatter by 20%: the band
    is the scatter's 1.645 x 20% = 32.9%, and the profile stores the 20% it came from."""
    model = presets.model("gpt3-1.7b")
    cluster = presets.cluster("selene", num_gpus=32)
    training = Training(global_batch_size=32, dtype="bf16", stack="megatron-lm")
    runs = []
    for tp in (1, 2, 4):
        plan = Plan(G_data=32 // tp, G_intra_r=tp, micro_batch_size=1)
        runs.append(Run.stated(model=model, cluster=cluster, training=training, plan=plan,
                               measured_s=predict(model, cluster, training, plan).iteration_time_s))
    quiet = calibrate_runs(runs)
    noisy = calibrate_runs(runs, run_scatter_rel=0.20)
    assert quiet.uncertainty_rel < 0.05
    loo_q = np.quantile(noisy.loo_errors, 0.9)
    assert noisy.uncertainty_rel == pytest.approx(math.hypot(loo_q, BAND_Z * 0.20))
    assert noisy.uncertainty_rel == pytest.approx(0.329, abs=0.01)
    prof = noisy.profile()
    assert prof.run_scatter_rel == pytest.approx(0.20)
    assert prof.uncertainty_rel == pytest.approx(noisy.uncertainty_rel)
    back = profile_from_dict(profile_to_dict(prof))
    assert back.run_scatter_rel == pytest.approx(0.20)


def test_measured_range_the_band_admits_by_hand():
    """|p - m| / m <= b  <=>  p / (1 + b) <= m <= p / (1 - b): at p = 1 s, b = 50%: 0.667-2 s."""
    from perfmodels.calibration import measured_range_s

    lo, hi = measured_range_s(1.0, 0.5)
    assert lo == pytest.approx(2 / 3) and hi == pytest.approx(2.0)
    assert measured_range_s(1.0, 1.0)[1] == float("inf")
