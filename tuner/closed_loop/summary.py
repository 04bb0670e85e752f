"""Validation: predicted vs measured over many plans, before and after calibration
(`gridtune validate`, the local closed loop in docs/architecture.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfmodels.io import json_safe, plan_to_dict
from perfmodels.specs import Plan, Profile
from perfmodels.steptime import predict
from tuner.closed_loop.calibration import calibrate_records, calibration_pairs, refit_constants
from tuner.closed_loop.metrics import mape, predicted_rank_of_measured_best, spearman, spread_plans
from tuner.closed_loop.records import record_specs


@dataclass(frozen=True, kw_only=True)
class PlanResult:
    """One plan of a validation run: what was predicted (before/after calibration) and measured."""

    plan: Plan
    predicted_s: float
    measured_s: float
    calibrated_s: float | None = None
    used_for_calibration: bool = False
    measured_parts: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ValidationSummary:
    """Figures of `gridtune validate` (the local closed loop)."""

    plans: tuple[PlanResult, ...]
    spearman: float
    measured_best_predicted_rank: int
    mape_uncalibrated: float
    mape_uncalibrated_holdout: float
    mape_calibrated: float
    spearman_calibrated: float
    corrections: dict[str, float]
    calibration_uncertainty_rel: float
    constants: dict[str, float] = field(default_factory=dict)
    """The physical constants the calibration fitted (`perfmodels.constants.PARAMETERS`)."""
    calibrated_profile: Profile | None
    kernel_overhead_us: float | None = None
    collective_factor_by_group_size: dict[int, float] = field(default_factory=dict)
    calibrated_on: tuple[int, ...] = ()


def summarize(records: Sequence[Mapping[str, Any]], *, base: Profile | None, calibrate_on: int = 3,
              ) -> ValidationSummary:
    """Figures from measurement records (the bodies `measurement_record` builds, with their
    measured iteration times): Spearman, MAPE and the measured-best plan's predicted rank over all
    of them, then calibration (`calibrate_records`) from `calibrate_on` of them chosen by
    `spread_plans` (predictions only), and the MAPE of the others before and after."""
    if not records:
        raise ValueError("nothing to summarize: no measured plan")
    pairs = calibration_pairs(records, base)
    predicted = [p.iteration_time_s for p, _ in pairs]
    measured = [m for _, m in pairs]
    chosen = spread_plans(predicted, calibrate_on)
    used = [records[i] for i in chosen]
    result = calibrate_records(used, base, profile_id="calibrated:validate")
    refit = refit_constants(used, base)
    calibrated = []
    for rec in records:
        model, cluster, training, plan = record_specs(rec)
        cal_cluster = dataclasses.replace(cluster, profile=result.profile)
        calibrated.append(predict(model, cal_cluster, training, plan).iteration_time_s)
    rest = [i for i in range(len(records)) if i not in chosen] or list(range(len(records)))
    plans = tuple(
        PlanResult(
            plan=record_specs(rec)[3],
            predicted_s=predicted[i],
            measured_s=measured[i],
            calibrated_s=calibrated[i],
            used_for_calibration=i in chosen,
            measured_parts={k: float(v) for k, v in rec["measured"].items() if isinstance(v, (int, float))},
        )
        for i, rec in enumerate(records)
    )
    return ValidationSummary(
        plans=plans,
        spearman=spearman(predicted, measured),
        measured_best_predicted_rank=predicted_rank_of_measured_best(predicted, measured),
        mape_uncalibrated=mape(predicted, measured),
        mape_uncalibrated_holdout=mape([predicted[i] for i in rest], [measured[i] for i in rest]),
        mape_calibrated=mape([calibrated[i] for i in rest], [measured[i] for i in rest]),
        spearman_calibrated=spearman(calibrated, measured),
        corrections=dict(result.corrections),
        constants=dict(result.constants),
        # the band a user should believe: never below the error seen on plans calibration did not use
        calibration_uncertainty_rel=float(
            max(result.uncertainty_rel, mape([calibrated[i] for i in rest], [measured[i] for i in rest]))
        ),
        calibrated_profile=result.profile,
        kernel_overhead_us=refit.kernel_overhead_us,
        collective_factor_by_group_size=refit.collective_factor_by_group_size,
        calibrated_on=tuple(chosen),
    )

# ValidationSummary fields that summary_json leaves out (the profile is reported on its own) or
# writes itself (plans).
_NOT_IN_JSON = ("plans", "calibrated_profile", "calibrated_on")


def summary_json(s: ValidationSummary) -> dict[str, Any]:
    """The `gridtune validate --json` object."""
    figures = {f.name: getattr(s, f.name) for f in dataclasses.fields(s) if f.name not in _NOT_IN_JSON}
    plans = [{"plan": plan_to_dict(p.plan), "predicted_s": p.predicted_s, "measured_s": p.measured_s,
              "calibrated_s": p.calibrated_s, "used_for_calibration": p.used_for_calibration,
              "measured": p.measured_parts} for p in s.plans]
    return json_safe({**figures, "plans": plans})
