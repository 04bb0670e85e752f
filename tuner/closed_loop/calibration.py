"""Calibration from stored measurements, in two stages.

Measurements are stored per `cluster_id` (`tuner.store.Store.add_measurement`, or
POST /v1/measurements). `calibrate_cluster(store, cluster_id)` takes the stored measurements of
that cluster and calibrates them (`calibrate_records`): `refit_constants` refits the constants
that the measured step parts pin down (per-kernel overhead from the measured compute time;
collective cost per group size from the measured per-group waits), then
`perfmodels.calibration.calibrate_runs` fits the physical constants of the stack on the cluster
(`perfmodels.constants.PARAMETERS`) to the measured step times: the same fit as
`POST /v1/calibrations` and `gridtune calibrate`, so there is one calibration path.
The result is stored as a profile named `calibrated_profile_name(cluster_id)`
("calibrated:<cluster_id>"), with source="calibrated" and the leave-one-out uncertainty.
`latest_calibrated_profile(store, cluster_id)` returns the newest one; `engine.train(auto=True)`
uses it when it exists, so later predictions for that cluster use the corrections and say so
(`Prediction.constants_source == "calibrated"`, `uncertainty_rel` from the residuals).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfmodels.calibration import (
    RUN_NOISE_REL,
    CalibrationResult,
    Run,
    calibrate_runs,
    pooled_run_scatter_rel,
)
from perfmodels.io import json_safe, plan_to_dict, profile_from_dict, profile_to_dict
from perfmodels.specs import Prediction, Profile
from perfmodels.steptime import predict
from tuner.closed_loop.metrics import mape
from tuner.closed_loop.records import field_of, measured_of, record_specs

CALIBRATED_PREFIX = "calibrated:"


def uncorrected(profile: Profile | None) -> Profile | None:
    """The profile without calibration (corrections or constants): what calibration fits against."""
    if profile is None:
        return None
    return dataclasses.replace(profile, corrections=(), constants=(), source="profile", uncertainty_rel=None,
                               run_scatter_rel=None)


def calibration_pairs(records: Sequence[Any], base: Profile | None = None) -> list[tuple[Prediction, float]]:
    """(prediction with the uncorrected profile, measured seconds) for every usable record.

    `base` replaces each record's own profile when given (all records then share the constants)."""
    pairs = []
    for rec in records:
        model, cluster, training, plan = record_specs(rec)
        measured = measured_of(rec).get("iteration_time_s")
        if not measured or measured <= 0:
            continue
        profile = base if base is not None else uncorrected(cluster.profile)
        pairs.append(
            (predict(model, dataclasses.replace(cluster, profile=profile), training, plan), float(measured))
        )
    return pairs


@dataclass(frozen=True, kw_only=True)
class Refit:
    """Constants refitted from measured step parts (stage 1 of calibration)."""

    profile: Profile
    kernel_overhead_us: float | None
    collective_factor_by_group_size: dict[int, float]

_MEASURED_AXIS_PARTS = {
    "tp_comm_row_s": "G_intra_r",
    "tp_comm_col_s": "G_intra_c",
    "tp_comm_depth_s": "G_intra_d",
    "dp_comm_s": "G_data",
}
_OVERLAP_FLAG = {"tp_comm_row_s": "overlap_tp_comm", "tp_comm_col_s": "overlap_tp_comm",
                 "tp_comm_depth_s": "overlap_depth_comm", "dp_comm_s": "overlap_grad_reduce"}
"""The stack flag under which an axis's collectives run in the background (async_op): their measured
wait is then only what did not overlap, not what they cost."""


def _background_axes(rec: Any) -> list[str]:
    """The measured parts of `rec` whose collectives its stack launched in the background."""
    _, _, training, _ = record_specs(rec)
    plan = field_of(rec, "plan")
    stack = training.effective_stack
    return [key for key, degree in _MEASURED_AXIS_PARTS.items()
            if int(plan.get(degree, 1)) > 1 and getattr(stack, _OVERLAP_FLAG[key])]


def _predict_with(rec: Any, profile: Profile | None) -> Prediction:
    model, cluster, training, plan = record_specs(rec)
    return predict(model, dataclasses.replace(cluster, profile=profile), training, plan)


def refit_constants(records: Sequence[Any], base: Profile | None) -> Refit:
    """Stage 1 of calibration: refit the constants that measured step parts pin down directly.

    - per-kernel overhead (`gemm_overhead_us`, charged per GEMM, attention and element-wise kernel
      by perfmodels.compute): least squares (relative) of the predicted compute + optimizer time,
      which is linear in it, against the measured compute time (wall minus communication waits).
      On CPU ranks this is eager PyTorch's per-operator cost (and sharing cores), which the
      GEMM microbenchmark does not see;
    - collectives, per group size p: one factor = measured / predicted communication time summed
      over the groups of size p (row, col, depth, data) of all records, applied to the alpha and
      1/bus-bandwidth of every fitted collective of size p (sub-group collectives on oversubscribed
      cores also wait for descheduled peers, which a collective-only microbenchmark does not see).
    Records without measured parts leave the constants as they are.

    Collectives launched in the background (async_op: the engine's depth prefetch and bucketed
    gradient all-reduce, `_background_axes`) do not set their collective cost: their measured wait
    is only what did not overlap. Nor is their split from compute observable: on CPU ranks their
    copies and reductions run on the computing cores, so a record's measured compute holds part of
    them (4 ranks / 2 cores: depth plans measured 2-3x the compute of data-parallel ones with the
    same GEMMs). The per-kernel overhead is therefore fitted to the measured compute plus those
    collectives' measured waits, against the predicted compute plus their predicted time (with the
    collective factors fitted first).
    """
    prof = base or Profile()
    timed = [r for r in records if "compute_s" in measured_of(r)]
    num: dict[int, float] = {}
    den: dict[int, float] = {}
    for rec in timed:
        plan = field_of(rec, "plan")
        breakdown = _predict_with(rec, prof).breakdown
        background = _background_axes(rec)
        for key, degree in _MEASURED_AXIS_PARTS.items():
            size = int(plan.get(degree, 1))
            if size > 1 and key in measured_of(rec) and key not in background:
                num[size] = num.get(size, 0.0) + float(measured_of(rec)[key])
                den[size] = den.get(size, 0.0) + float(getattr(breakdown, key))
    factors = {size: num[size] / den[size] for size in num if den[size] > 0 and num[size] > 0}
    if factors and prof.collectives:
        prof = dataclasses.replace(prof, collectives=tuple(
            dataclasses.replace(f, alpha_us=f.alpha_us * factors.get(f.group_size, 1.0),
                                busbw_GBps=f.busbw_GBps / factors.get(f.group_size, 1.0))
            for f in prof.collectives))
    overhead = None
    if timed:
        zero = dataclasses.replace(prof, gemm_overhead_us=0.0)
        unit = dataclasses.replace(prof, gemm_overhead_us=1000.0)
        a_list, k_list, y_list = [], [], []
        for rec in timed:
            b0, b1 = _predict_with(rec, zero).breakdown, _predict_with(rec, unit).breakdown
            background = _background_axes(rec)
            riding = sum(getattr(b0, key) for key in background)
            a = b0.compute_s + b0.optimizer_s
            a_list.append(a + riding)
            k_list.append((b1.compute_s + b1.optimizer_s - a) / 1000.0)
            measured = measured_of(rec)
            y_list.append(max(float(measured["compute_s"]) + sum(float(measured.get(key, 0.0))
                                                                for key in background), 1e-9))
        a_arr, k_arr, y_arr = np.array(a_list), np.array(k_list), np.array(y_list)
        denom = float(np.sum((k_arr / y_arr) ** 2))
        if denom > 0:
            overhead = max(0.0, float(np.sum(k_arr / y_arr * (1.0 - a_arr / y_arr)) / denom))
            prof = dataclasses.replace(prof, gemm_overhead_us=overhead)
    return Refit(profile=prof, kernel_overhead_us=overhead, collective_factor_by_group_size=factors)

LOO_MAX = 30  # leave-one-out over at most this many records (each refit costs a few predictions)

MEDIAN_SE_FACTOR = float(np.sqrt(np.pi / 2.0))
"""The standard error of a median of n normal samples is sqrt(pi/2) sigma / sqrt(n) (large n)."""


@dataclass(frozen=True, kw_only=True)
class RunScatter:
    """The measured relative scatter of one run's step time (the median of its steady steps) on a
    cluster, and where it came from: "runs" (repeated runs of the same plan: validate's rounds,
    repeated engine.train runs), "steps" (only one run per plan: the standard error of a median of
    its steady steps, a floor, since load that changes between runs is not in it) or "assumed"
    (nothing measured: `RUN_NOISE_REL`)."""

    scatter_rel: float
    dof: int
    source: str


def _record_key(rec: Any) -> str:
    """Records of the same model, training and plan on a cluster: repeated runs of one layout."""
    import json

    return json.dumps([field_of(rec, "model"), field_of(rec, "training"),
                       plan_to_dict(record_specs(rec)[3])], sort_keys=True, default=str)


def measured_run_scatter(records: Sequence[Any]) -> RunScatter:
    """The run-to-run scatter of one run, pooled (`pooled_run_scatter_rel`, in log time) over
    - each record that was itself several runs (`gridtune validate`'s rounds): its stored
      `run_scatter_rel` with `runs_measured - 1` degrees of freedom;
    - records of the same layout stored more than once (repeated engine.train runs): their times.
    Without either, the largest standard error of a record's median from its own steady steps'
    scatter (`step_scatter_rel` over `steps_measured`), a floor; without that, `RUN_NOISE_REL`."""
    squares, dof = 0.0, 0
    by_plan: dict[str, list[float]] = {}
    step_floor = 0.0
    for rec in records:
        m = measured_of(rec)
        rounds = int(m.get("runs_measured", 1) or 1)
        if rounds >= 2 and m.get("run_scatter_rel") is not None:
            squares += float(m["run_scatter_rel"]) ** 2 * (rounds - 1)
            dof += rounds - 1
        elif m.get("iteration_time_s"):
            by_plan.setdefault(_record_key(rec), []).append(float(m["iteration_time_s"]))
        steps = float(m.get("steps_measured", 0) or 0)
        if m.get("step_scatter_rel") is not None and steps >= 2:
            step_floor = max(step_floor, MEDIAN_SE_FACTOR * float(m["step_scatter_rel"]) / np.sqrt(steps))
    repeated = pooled_run_scatter_rel(list(by_plan.values()))
    if repeated is not None:
        squares += repeated[0] ** 2 * repeated[1]
        dof += repeated[1]
    if dof > 0:
        return RunScatter(scatter_rel=float(np.sqrt(squares / dof)), dof=dof, source="runs")
    if step_floor > 0:
        return RunScatter(scatter_rel=step_floor, dof=0, source="steps")
    return RunScatter(scatter_rel=RUN_NOISE_REL, dof=0, source="assumed")


def calibrate_records(records: Sequence[Any], base: Profile | None = None, *, profile_id: str = "",
                      ) -> CalibrationResult:
    """Calibrate from measured records in two stages: `refit_constants` (per-kernel overhead and
    per-group-size collective cost from the measured parts), then `perfmodels.calibration.calibrate_runs`
    (the physical constants, with priors, fitted to the measured step times). The result's profile
    has source "calibrated" and carries the constants; its uncertainty band combines the
    leave-one-out error of the constants' fit (each record predicted by a fit on the others; with
    one record, by the refitted constants alone) with the run-to-run scatter the records measured
    (`measured_run_scatter`, `perfmodels.calibration.band_rel`), never below the in-sample error."""
    if not records:
        raise ValueError("calibrate_records needs at least one measured record")
    if base is None:
        for rec in records:
            _, cluster, _, _ = record_specs(rec)
            if cluster.profile is not None:
                base = uncorrected(cluster.profile)
                break
    refit = refit_constants(records, base)
    runs = []
    for i, rec in enumerate(records):
        model, cluster, training, plan = record_specs(rec)
        measured = measured_of(rec).get("iteration_time_s")
        if not measured or measured <= 0:
            raise ValueError(f"records[{i}].measured.iteration_time_s must be a positive number, "
                             f"got {measured!r}")
        runs.append(Run.stated(model=model, cluster=dataclasses.replace(cluster, profile=refit.profile),
                               training=training, plan=plan, measured_s=float(measured)))
    cal = calibrate_runs(runs, loo_max=LOO_MAX, run_scatter_rel=measured_run_scatter(records).scatter_rel)
    profile = cal.profile(refit.profile, profile_id=profile_id)
    # MAPE before: with the constants the records were predicted with, not the refitted ones
    before = calibration_pairs(records, base)
    return CalibrationResult(
        profile=profile, corrections={}, constants=dict(profile.constants),
        mape_before=mape([p.iteration_time_s for p, _ in before], [m for _, m in before]),
        mape_after=cal.mape_after, uncertainty_rel=float(profile.uncertainty_rel or cal.uncertainty_rel),
        num_measurements=len(records))


def calibrated_profile_name(cluster_id: str) -> str:
    return CALIBRATED_PREFIX + cluster_id


def calibrate_cluster(store: Any, cluster_id: str, *, limit: int = 200, save: bool = True,
                      ) -> CalibrationResult | None:
    """Calibrate from the newest `limit` measurements of `cluster_id`; store the calibrated
    profile (name "calibrated:<cluster_id>") unless `save` is False. None if nothing is stored."""
    records = store.list_measurements(cluster_id=cluster_id, limit=limit)
    if not records:
        return None
    name = calibrated_profile_name(cluster_id)
    result = calibrate_records(records, profile_id=name)
    if save:
        doc = json_safe(profile_to_dict(result.profile))
        doc["provenance"] = {"calibrated_from": len(records), "cluster_id": cluster_id,
                             "mape_before": result.mape_before, "mape_after": result.mape_after,
                             "constants": result.constants,
                             "run_scatter": dataclasses.asdict(measured_run_scatter(records))}
        store.add_profile(name=name, profile=json_safe(doc), cluster=None)
    return result


def latest_calibrated_profile(store: Any, cluster_id: str) -> Profile | None:
    """The newest calibrated profile stored for `cluster_id`, else None."""
    stored = store.get_profile(calibrated_profile_name(cluster_id))
    if stored is None:
        return None
    doc = {k: v for k, v in stored.profile.items() if k in {f.name for f in dataclasses.fields(Profile)}}
    return profile_from_dict(doc)
