"""A ranking that knows its uncertainty: which leaders the band cannot separate, and which layouts to
measure so the next short runs decide between them.

Every prediction carries a relative band (`Prediction.uncertainty_rel`: the preset's, or a calibrated
profile's leave-one-out error). Two layouts are closer than the band when their intervals overlap:
t_k (1 - b) < t_best (1 + b). Among those leaders, which to measure? The errors of the predictions
are not independent: they come from the same few constants (`perfmodels.constants.PARAMETERS`).
A measured step time pins those constants down (`perfmodels.calibration`, prior spread 1 per
parameter, run noise `RUN_NOISE_REL`), and through them every leader's prediction. What decides the
ranking is the difference between each leader and the best, d_k = log t_k - log t_best, whose gradient
in the constants is g_k = s_k - s_best (s: a layout's sensitivities d log t / dz, by finite
differences over the leaders at once). `suggest` picks, greedily, the layouts whose measurement
minimises the summed posterior variance of those differences, sum_k g_k' (I + S'S / noise^2)^-1 g_k
(an A-optimal design restricted to the leaders): the runs that best separate the leaders.
After measuring them, calibrate on the runs (`gridtune calibrate`) and rank again; the answer is the
fastest measured layout, or the predicted best when no measured run comes close to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from perfmodels.calibration import RUN_NOISE_REL
from perfmodels.constants import PARAMETERS, apply_constants, priors
from perfmodels.plans import from_plans
from perfmodels.specs import Cluster, Model, Plan, Training
from perfmodels.steptime import predict_many

SENSITIVITY_STEP = 0.05
"""Finite-difference step, in prior spreads of each constant."""


@dataclass(frozen=True, kw_only=True)
class Trial:
    rank: int
    plan: Plan
    predicted_s: float
    variance_after: float
    """The summed posterior variance of the leaders' differences once this and the earlier picks are
    measured (log-time units squared; smaller separates better)."""


@dataclass(frozen=True, kw_only=True)
class TrialAdvice:
    band: float
    leaders: list[int]
    """Ranks (1 = best) of the layouts whose band overlaps the best's."""
    close: bool
    variance_before: float
    trials: list[Trial]
    message: str


def leaders(times: Sequence[float], band: float) -> list[int]:
    """Indices of the layouts whose interval t (1 - band) overlaps the best's t_best (1 + band)."""
    t = np.asarray(times, dtype=float)
    best = float(t.min())
    return [int(i) for i in np.argsort(t, kind="stable") if t[i] * (1.0 - band) <= best * (1.0 + band)]


def sensitivities(model: Model, cluster: Cluster, training: Training, plans: Sequence[Plan]) -> np.ndarray:
    """d log t / dz for every plan (rows) and calibrated constant (columns, `PARAMETERS` order), at the
    constants the cluster carries (its calibration, else the priors)."""
    base = priors(cluster, training)
    if cluster.profile is not None and cluster.profile.constants:
        base.update(dict(cluster.profile.constants))
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, plan in enumerate(plans):
        groups.setdefault(plan.order, []).append(i)
    out = np.zeros((len(plans), len(PARAMETERS)))

    def log_times(constants: dict[str, float]) -> np.ndarray:
        c, t = apply_constants(cluster, training, constants)
        values = np.zeros(len(plans))
        for idx in groups.values():
            batch = predict_many(model, c, t, from_plans([plans[i] for i in idx]))
            values[idx] = np.log(batch.iteration_time_s)
        return values

    here = log_times(base)
    for j, p in enumerate(PARAMETERS):
        x0 = base[p.name]
        step = SENSITIVITY_STEP
        if p.scale == "log":
            x = x0 * np.exp(p.sigma * step)
            if x > p.upper:
                x, step = x0 * np.exp(-p.sigma * step), -step
        else:
            x = x0 + p.sigma * step
            if x > p.upper:
                x, step = x0 - p.sigma * step, -step
        out[:, j] = (log_times({**base, p.name: float(x)}) - here) / step
    return out


def _variance(S_measured: np.ndarray, G: np.ndarray) -> float:
    k = G.shape[1]
    info = np.eye(k) + S_measured.T @ S_measured / RUN_NOISE_REL**2
    return float(np.trace(G @ np.linalg.solve(info, G.T)))


def suggest(model: Model, cluster: Cluster, training: Training, plans: Sequence[Plan],
            times: Sequence[float], band: float, n: int) -> TrialAdvice:
    """Which of the ranked `plans` (best first, predicted `times`) the band cannot separate, and the
    `n` of them to measure next (ValueError for n < 0)."""
    if n < 0:
        raise ValueError(f"suggest_trials must be >= 0, got {n}")
    lead = leaders(times, band)
    close = len(lead) > 1
    t = np.asarray(times, dtype=float)
    if not close or n == 0:
        msg = (f"the best layout is faster than the others by more than the +/-{band:.0%} band"
               if not close else f"{len(lead)} layouts are within the +/-{band:.0%} band of the best")
        return TrialAdvice(band=band, leaders=[i + 1 for i in lead], close=close, variance_before=0.0,
                           trials=[], message=msg)
    lead_plans = [plans[i] for i in lead]
    S = sensitivities(model, cluster, training, lead_plans)
    best = int(np.argmin(t[lead]))
    G = np.delete(S - S[best], best, axis=0)
    chosen: list[int] = []
    trials: list[Trial] = []
    before = _variance(np.zeros((0, S.shape[1])), G)
    for _ in range(min(n, len(lead))):
        scores = [(_variance(S[[*chosen, i]], G), i) for i in range(len(lead)) if i not in chosen]
        score, pick = min(scores)
        chosen.append(pick)
        trials.append(Trial(rank=lead[pick] + 1, plan=lead_plans[pick], predicted_s=float(t[lead[pick]]),
                            variance_after=score))
    ranks = ", ".join(f"#{tr.rank}" for tr in trials)
    msg = (f"{len(lead)} layouts are within the +/-{band:.0%} band of the best: the ranking among them is "
           f"not decided by the model; measure {ranks} (short runs), calibrate on them "
           "(gridtune calibrate), and rank again: the answer is the fastest measured layout, or the "
           "predicted best when no measured run comes close to it")
    return TrialAdvice(band=band, leaders=[i + 1 for i in lead], close=True, variance_before=before,
                       trials=trials, message=msg)


def advise(model: Model, cluster: Cluster, training: Training, candidates: Sequence[object],
           n: int) -> TrialAdvice | None:
    """`suggest` over a recommendation's ranked candidates (`tuner.types.Candidate`), with the band
    their predictions claim; None without candidates."""
    if not candidates:
        return None
    plans = [c.plan for c in candidates]  # type: ignore[attr-defined]
    times = [c.prediction.iteration_time_s for c in candidates]  # type: ignore[attr-defined]
    band = float(candidates[0].prediction.uncertainty_rel)  # type: ignore[attr-defined]
    return suggest(model, cluster, training, plans, times, band, n)


def advice_json(advice: TrialAdvice | None) -> dict[str, object] | None:
    """The REST/`--json` form: {band, leaders, close, message, trials: [{rank, plan, predicted_s}]}."""
    if advice is None:
        return None
    from perfmodels.io import plan_to_dict

    return {"band": advice.band, "leaders": advice.leaders, "close": advice.close, "message": advice.message,
            "trials": [{"rank": t.rank, "plan": plan_to_dict(t.plan), "predicted_s": t.predicted_s,
                        "variance_after": t.variance_after} for t in advice.trials],
            "variance_before": advice.variance_before}
