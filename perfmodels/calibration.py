"""Calibrate the model from measured steps: per-component corrections and an uncertainty band.

The step time is (to first order) a sum of components that each scale with one kind of constant:

    step ~ c_compute * (compute + bubble + optimizer) + c_tp * exposed tensor-parallel comm
         + c_dp * (exposed data-parallel and depth comm) + c_pp * pipeline p2p

Given measured steps of a cluster, we solve for the non-negative multipliers c_k with scipy's
non-negative least squares on relative errors, with a ridge pull towards 1 (weight `prior`), so a
component that no measurement exercised keeps its profiled value and three measurements are enough
to fix the dominant ones. The multipliers become `Profile.corrections`, which
`perfmodels.steptime` applies; the profile's `source` becomes "calibrated" and its
`uncertainty_rel` is the leave-one-out median relative error (or the in-sample one when fewer than
three measurements exist), so later predictions say how far to trust them.

    profile = calibrate([(prediction, measured_seconds), ...], base=cluster.profile)
    cluster = dataclasses.replace(cluster, profile=profile)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import nnls

from perfmodels.specs import Prediction, Profile

COMPONENTS = ("compute", "tp_comm", "dp_comm", "pp_p2p")


@dataclass(frozen=True, kw_only=True)
class CalibrationResult:
    profile: Profile
    corrections: dict[str, float]
    mape_before: float
    mape_after: float
    uncertainty_rel: float
    num_measurements: int


def component_seconds(pred: Prediction) -> np.ndarray:
    """The four correctable parts of a prediction, in COMPONENTS order (seconds per step).

    They sum to the predicted step time, so corrections of 1 reproduce the uncorrected model."""
    b = pred.breakdown
    comm_exposed = b.exposed_comm_s - b.pp_p2p_s
    dp_share = (b.dp_comm_s + b.tp_comm_depth_s)
    tp_share = b.tp_comm_s
    total_comm = max(dp_share + tp_share, 1e-30)
    tp = comm_exposed * tp_share / total_comm
    dp = comm_exposed * dp_share / total_comm
    compute = pred.iteration_time_s - comm_exposed - b.pp_p2p_s
    return np.array([compute, tp, dp, b.pp_p2p_s])


def _fit(X: np.ndarray, y: np.ndarray, prior: float) -> np.ndarray:
    """min sum(((X c - y) / y)^2) + prior * sum((c - 1)^2), c >= 0."""
    A = X / y[:, None]
    b = np.ones(len(y))
    k = X.shape[1]
    A = np.vstack([A, np.sqrt(prior) * np.eye(k)])
    b = np.concatenate([b, np.sqrt(prior) * np.ones(k)])
    c, _ = nnls(A, b)
    return c


def calibrate(pairs: Sequence[tuple[Prediction, float]], base: Profile | None = None, prior: float = 0.05,
              ) -> CalibrationResult:
    """Fit per-component corrections from (prediction made with `base`, measured step seconds)."""
    if not pairs:
        raise ValueError("calibrate needs at least one (prediction, measured_seconds) pair")
    for i, (_, measured) in enumerate(pairs):
        if not (isinstance(measured, (int, float)) and measured > 0 and np.isfinite(measured)):
            raise ValueError(
                f"measurements[{i}].iteration_time_s must be a positive number, got {measured!r}"
            )
    X = np.array([component_seconds(p) for p, _ in pairs])
    y = np.array([float(m) for _, m in pairs])
    old = np.array([base.correction(name) if base is not None else 1.0 for name in COMPONENTS])
    c = _fit(X, y, prior)
    fitted = X @ c
    before = float(np.mean(np.abs(X.sum(axis=1) - y) / y))
    after = float(np.mean(np.abs(fitted - y) / y))
    if len(y) >= 3:
        loo = []
        for i in range(len(y)):
            keep = np.arange(len(y)) != i
            ci = _fit(X[keep], y[keep], prior)
            loo.append(abs(X[i] @ ci - y[i]) / y[i])
        uncertainty = float(np.median(loo))
    else:
        uncertainty = max(after, 0.10)
    combined = {name: float(old[j] * c[j]) for j, name in enumerate(COMPONENTS)}
    extra = tuple((k, v) for k, v in (base.corrections if base else ()) if k not in combined)
    profile = replace(
        base or Profile(),
        corrections=tuple(sorted(combined.items())) + extra,
        source="calibrated",
        uncertainty_rel=max(uncertainty, 0.01),
    )
    return CalibrationResult(profile=profile, corrections=combined, mape_before=before, mape_after=after,
                             uncertainty_rel=profile.uncertainty_rel or uncertainty, num_measurements=len(y))
