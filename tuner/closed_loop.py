"""The closed loop's torch-free half: the specs of an engine run, the plans worth running, how
good the predictions were, and calibration from stored measurements (DESIGN.md section 4).

Why torch-free: the service and `gridtune validate`'s reporting use it without a framework;
`engine.train` (torch) calls it for everything that is not training.

What an engine run is, in the model's nouns (so predictions describe what the engine does):
- `local_cluster(nproc)`: the "local-cpu" preset with one node of `nproc` ranks (gloo);
- `engine_training(global_batch_size)`: fp32, AdamW, data-parallel reduction after backward
  (`engine.sync_gradients` runs after the last micro-batch: overlap_grad_reduce=False),
  synchronous tensor-parallel collectives (overlap_tp_comm=False), fused attention
  (the built-in GPT calls `scaled_dot_product_attention`: flash_attention=True);
- `engine_search_options(...)`: the options the engine runs on CPU: schedule 1f1b, no virtual
  stages, no recomputation, ZeRO 0, the default placement, no sequence parallelism.

Calibration wiring (the choice made for issue 7): measurements are stored per `cluster_id`
(`tuner.store.Store.add_measurement`, or POST /v1/measurements). `calibrate_cluster(store,
cluster_id)` takes the stored measurements of that cluster and calibrates in two stages
(`calibrate_records`): `refit_constants` refits the constants that the measured step parts pin
down (per-kernel overhead from the measured compute time; collective cost per group size from the
measured per-group waits), then `perfmodels.calibration.calibrate` fits non-negative
per-component corrections of what remains; the result is stored as a profile named `calibrated_profile_name(cluster_id)` ("calibrated:<cluster_id>"), with
source="calibrated" and the leave-one-out uncertainty. `latest_calibrated_profile(store,
cluster_id)` returns the newest one; `engine.train(auto=True)` uses it when it exists, so later
predictions and plan choices for that cluster use the corrections and say so
(`Prediction.constants_source == "calibrated"`, `uncertainty_rel` from the residuals).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats

from perfmodels import presets
from perfmodels.calibration import CalibrationResult, calibrate
from perfmodels.io import (
    cluster_from_dict,
    model_from_dict,
    model_to_dict,
    plan_from_dict,
    plan_to_dict,
    profile_from_dict,
    profile_to_dict,
    training_from_dict,
    training_to_dict,
)
from perfmodels.specs import AXES, Cluster, Model, Plan, Prediction, Profile, Training
from perfmodels.steptime import predict
from tuner.search import recommend
from tuner.service_client import post_json
from tuner.types import Candidate, SearchOptions

ENV_URL = "GRIDTUNE_URL"
CALIBRATED_PREFIX = "calibrated:"
MEASURED_PARTS = ("compute_s", "tp_comm_s", "tp_comm_row_s", "tp_comm_col_s", "tp_comm_depth_s", "dp_comm_s",
                  "pp_bubble_s")
_PROFILE_SERVICE_KEYS = ("profile_id", "collectives", "gemm_tflops_max", "gemm_half_size", "gemm_overhead_us",
                         "hbm_bandwidth_GBps", "corrections", "source")


# --------------------------------------------------------------------------------------------
# What an engine run is
# --------------------------------------------------------------------------------------------


def local_cluster(nproc: int, profile: Profile | None = None) -> Cluster:
    """`nproc` CPU ranks on one machine (gloo), optionally with measured/calibrated constants."""
    base = presets.cluster("local-cpu", num_gpus=nproc)
    return dataclasses.replace(base, gpus_per_node=nproc, profile=profile,
                               profile_id=profile.profile_id if profile is not None and profile.profile_id else None)


def engine_training(global_batch_size: int, *, dtype: str = "fp32", optimizer: str = "adamw",
                    stack: str = "gridtune") -> Training:
    """The Training spec of what engine.train does: the `gridtune` stack (see perfmodels.stacks and
    the module docstring). Another `stack` predicts the same runs as that framework would behave,
    which shows how much of the engine's behaviour the stack presets capture."""
    return Training(global_batch_size=global_batch_size, dtype=dtype, optimizer=optimizer,  # type: ignore[arg-type]
                    stack=stack)


def engine_search_options(*, micro_batch_size: int | None = None, data_parallel_only: bool = False,
                          pipeline: bool = True, time_budget_s: float = 10.0) -> SearchOptions:
    """Pins that keep the search to what the engine runs (one micro-batch size when given).

    `pipeline=False`: nets other than the built-in GPT (engine.auto_parallelize splits their
    Linears over row/col/depth, but they have no pipeline stages). `data_parallel_only`: an
    already built net, which can only be replicated.
    """
    pins: dict[str, Any] = {}
    if not pipeline or data_parallel_only:
        pins["G_inter"] = (1,)
    if data_parallel_only:
        pins.update(G_intra_d=(1,), G_intra_r=(1,), G_intra_c=(1,))
    return SearchOptions(micro_batch_size=(micro_batch_size,) if micro_batch_size else None, schedule=("1f1b",),
                         virtual_stages=(1,), recompute=("none",), zero_stage=(0,), placement=(AXES,),
                         sequence_parallel=(False,), time_budget_s=time_budget_s, **pins)


def candidate_plans(model: Model, cluster: Cluster, training: Training, options: SearchOptions,
                    top_k: int = 10_000) -> list[Candidate]:
    """Every plan the pinned search keeps, fastest predicted first."""
    return recommend(model, cluster, training, top_k=top_k, search=options).candidates


def default_cluster_id(cluster: Cluster) -> str:
    """Where measurements of this machine are filed: '<cluster name>@<host>/<ranks>'.

    Deliberately independent of the profile in use, so runs with measured, calibrated or preset
    constants all feed (and find) the same calibration."""
    return f"{cluster.name}@{socket.gethostname()}/{cluster.num_gpus}"


# --------------------------------------------------------------------------------------------
# How good were the predictions
# --------------------------------------------------------------------------------------------


def spearman(predicted: Sequence[float], measured: Sequence[float]) -> float:
    if len(predicted) < 2:
        return float("nan")
    return float(stats.spearmanr(predicted, measured).statistic)


def mape(predicted: Sequence[float], measured: Sequence[float]) -> float:
    p, m = np.asarray(predicted, float), np.asarray(measured, float)
    if not len(m):
        return float("nan")
    return float(np.mean(np.abs(p - m) / m))


def predicted_rank_of_measured_best(predicted: Sequence[float], measured: Sequence[float]) -> int:
    """1-based position, in predicted order, of the plan that measured fastest."""
    best = int(np.argmin(measured))
    order = np.argsort(np.asarray(predicted, float), kind="stable")
    return int(np.flatnonzero(order == best)[0]) + 1


def spread_plans(predicted_s: Sequence[float], k: int = 3) -> list[int]:
    """Indices of `k` plans spread evenly over the predicted order (fastest, median, slowest for
    k=3): a rule that looks only at predictions, and that spans both the step-time range and the
    mix of components (fast plans are compute-bound, slow ones communication-bound)."""
    n = len(predicted_s)
    if n <= k:
        return list(range(n))
    order = [int(i) for i in np.argsort(np.asarray(predicted_s, float), kind="stable")]
    picks = [order[round(j * (n - 1) / (k - 1))] for j in range(k)] if k > 1 else [order[0]]
    return list(dict.fromkeys(picks))


# --------------------------------------------------------------------------------------------
# Measurement records (what is stored) and calibration from them
# --------------------------------------------------------------------------------------------


def measurement_record(*, model: Model, cluster: Cluster, training: Training, plan: Plan,
                       measured: Mapping[str, float], prediction: Prediction | None) -> dict[str, Any]:
    """The JSON body of one measurement (the store's fields and POST /v1/measurements' body)."""
    cluster_doc: dict[str, Any] = {"preset": None, "name": cluster.name, "num_gpus": cluster.num_gpus,
                                   "gpus_per_node": cluster.gpus_per_node}
    try:
        preset = presets.cluster(cluster.name)
        cluster_doc["preset"] = preset.name
    except ValueError:
        cluster_doc = {k: v for k, v in dataclasses.asdict(cluster).items() if k not in ("profile", "gpu")}
        cluster_doc["gpu"] = dataclasses.asdict(cluster.gpu)
    if cluster.profile is not None:
        cluster_doc["profile"] = _finite(profile_to_dict(cluster.profile))
    cluster_doc = {k: v for k, v in cluster_doc.items() if v is not None}
    body: dict[str, Any] = {
        "model": _finite(model_to_dict(model)),
        "cluster": cluster_doc,
        "training": training_to_dict(training),
        "plan": plan_to_dict(plan),
        "measured": _finite(dict(measured)),
    }
    if prediction is not None:
        b = prediction.breakdown
        body["prediction"] = _finite({
            "iteration_time_s": prediction.iteration_time_s, "constants_source": prediction.constants_source,
            "uncertainty_rel": prediction.uncertainty_rel,
            **{name: getattr(b, name) for name in (*MEASURED_PARTS, "pp_p2p_s", "exposed_comm_s")},
        })
    return body


def record_specs(record: Mapping[str, Any]) -> tuple[Model, Cluster, Training, Plan]:
    """Specs back from a stored record (a Store Measurement's fields or its dict)."""
    get = (lambda k: record[k]) if isinstance(record, Mapping) else (lambda k: getattr(record, k))
    return (model_from_dict(get("model")), cluster_from_dict(get("cluster")), training_from_dict(get("training")),
            plan_from_dict(get("plan")))


def uncorrected(profile: Profile | None) -> Profile | None:
    """The profile without calibration corrections (what calibration fits against)."""
    if profile is None:
        return None
    return dataclasses.replace(profile, corrections=(), source="profile", uncertainty_rel=None)


def calibration_pairs(records: Sequence[Any], base: Profile | None = None) -> list[tuple[Prediction, float]]:
    """(prediction with the uncorrected profile, measured seconds) for every usable record.

    `base` replaces each record's own profile when given (all records then share the constants)."""
    pairs = []
    for rec in records:
        model, cluster, training, plan = record_specs(rec)
        measured = (rec["measured"] if isinstance(rec, Mapping) else rec.measured).get("iteration_time_s")
        if not measured or measured <= 0:
            continue
        profile = base if base is not None else uncorrected(cluster.profile)
        pairs.append((predict(model, dataclasses.replace(cluster, profile=profile), training, plan), float(measured)))
    return pairs


@dataclass(frozen=True, kw_only=True)
class Refit:
    """Constants refitted from measured step parts (stage 1 of calibration)."""

    profile: Profile
    kernel_overhead_us: float | None
    collective_factor_by_group_size: dict[int, float]


_MEASURED_AXIS_PARTS = {"tp_comm_row_s": "G_intra_r", "tp_comm_col_s": "G_intra_c", "tp_comm_depth_s": "G_intra_d",
                        "dp_comm_s": "G_data"}


def _measured(rec: Any) -> Mapping[str, Any]:
    return rec["measured"] if isinstance(rec, Mapping) else rec.measured


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
    """
    prof = base or Profile()
    usable = [r for r in records if "compute_s" in _measured(r)]
    overhead = None
    if usable:
        zero = dataclasses.replace(prof, gemm_overhead_us=0.0)
        unit = dataclasses.replace(prof, gemm_overhead_us=1000.0)
        a_list, k_list, y_list = [], [], []
        for rec in usable:
            b0, b1 = _predict_with(rec, zero).breakdown, _predict_with(rec, unit).breakdown
            a = b0.compute_s + b0.optimizer_s
            a_list.append(a)
            k_list.append((b1.compute_s + b1.optimizer_s - a) / 1000.0)
            y_list.append(max(float(_measured(rec)["compute_s"]), 1e-9))
        a_arr, k_arr, y_arr = np.array(a_list), np.array(k_list), np.array(y_list)
        denom = float(np.sum((k_arr / y_arr) ** 2))
        if denom > 0:
            overhead = max(0.0, float(np.sum(k_arr / y_arr * (1.0 - a_arr / y_arr)) / denom))
            prof = dataclasses.replace(prof, gemm_overhead_us=overhead)
    num: dict[int, float] = {}
    den: dict[int, float] = {}
    for rec in usable:
        plan = rec["plan"] if isinstance(rec, Mapping) else rec.plan
        breakdown = _predict_with(rec, prof).breakdown
        for key, degree in _MEASURED_AXIS_PARTS.items():
            size = int(plan.get(degree, 1))
            if size > 1 and key in _measured(rec):
                num[size] = num.get(size, 0.0) + float(_measured(rec)[key])
                den[size] = den.get(size, 0.0) + float(getattr(breakdown, key))
    factors = {size: num[size] / den[size] for size in num if den[size] > 0 and num[size] > 0}
    if factors and prof.collectives:
        prof = dataclasses.replace(prof, collectives=tuple(
            dataclasses.replace(f, alpha_us=f.alpha_us * factors.get(f.group_size, 1.0),
                                busbw_GBps=f.busbw_GBps / factors.get(f.group_size, 1.0))
            for f in prof.collectives))
    return Refit(profile=prof, kernel_overhead_us=overhead, collective_factor_by_group_size=factors)


def calibrate_records(records: Sequence[Any], base: Profile | None = None, *, profile_id: str = "",
                      prior: float = 0.05) -> CalibrationResult:
    """Calibrate from measured records in two stages: `refit_constants` (per-kernel overhead and
    per-group-size collective cost from the measured parts), then `perfmodels.calibration.calibrate`
    (non-negative per-component corrections of what remains). The result's profile has source
    "calibrated"; its uncertainty band is the median leave-one-out error of the whole two-stage
    procedure (each record predicted by a calibration that never saw it), so it is not flattered by
    the refit having seen the record."""
    if base is None:
        for rec in records:
            _, cluster, _, _ = record_specs(rec)
            if cluster.profile is not None:
                base = uncorrected(cluster.profile)
                break
    result = _two_stage(records, base, prior)
    # MAPE before: with the constants the records were predicted with, not the refitted ones
    before = calibration_pairs(records, base)
    mape_before = mape([p.iteration_time_s for p, _ in before], [m for _, m in before])
    uncertainty = result.uncertainty_rel
    if len(records) >= 3:
        errors = []
        for i in range(min(len(records), LOO_MAX)):
            others = [r for j, r in enumerate(records) if j != i]
            held_out = _two_stage(others, base, prior)
            pred, measured = calibration_pairs([records[i]], held_out.profile)[0]
            errors.append(abs(pred.iteration_time_s - measured) / measured)
        uncertainty = max(float(np.median(errors)), result.mape_after, 0.01)
    profile = dataclasses.replace(result.profile, uncertainty_rel=uncertainty)
    if profile_id:
        profile = dataclasses.replace(profile, profile_id=profile_id)
    return dataclasses.replace(result, profile=profile, mape_before=mape_before, uncertainty_rel=uncertainty)


LOO_MAX = 30  # leave-one-out over at most this many records (each refit costs a few predictions)


def _two_stage(records: Sequence[Any], base: Profile | None, prior: float) -> CalibrationResult:
    refit = refit_constants(records, base)
    return calibrate(calibration_pairs(records, refit.profile), base=refit.profile, prior=prior)


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
        doc = _finite(profile_to_dict(result.profile))
        doc["provenance"] = {"calibrated_from": len(records), "cluster_id": cluster_id,
                             "mape_before": result.mape_before, "mape_after": result.mape_after}
        store.add_profile(name=name, profile=_finite(doc), cluster=None)
    return result


def latest_calibrated_profile(store: Any, cluster_id: str) -> Profile | None:
    """The newest calibrated profile stored for `cluster_id`, else None."""
    stored = store.get_profile(calibrated_profile_name(cluster_id))
    if stored is None:
        return None
    doc = {k: v for k, v in stored.profile.items() if k in {f.name for f in dataclasses.fields(Profile)}}
    return profile_from_dict(doc)


# --------------------------------------------------------------------------------------------
# The service (GRIDTUNE_URL)
# --------------------------------------------------------------------------------------------


def service_url(explicit: str | None = None) -> str | None:
    url = explicit or os.environ.get(ENV_URL, "").strip()
    return url.rstrip("/") if url else None


def for_service(body: Mapping[str, Any]) -> dict[str, Any]:
    """Drop the keys the service's schemas do not accept (profile extras such as uncertainty_rel)."""
    out = json.loads(json.dumps(body))
    prof = out.get("cluster", {}).get("profile")
    if prof is not None:
        prof = {k: v for k, v in prof.items() if k in _PROFILE_SERVICE_KEYS and v is not None}
        # the service accepts only positive corrections; a component fitted to zero becomes tiny
        prof["corrections"] = {k: max(float(v), 1e-6) for k, v in dict(prof.get("corrections") or {}).items()}
        out["cluster"]["profile"] = prof
    return out


def post_measurement(url: str, body: Mapping[str, Any], *, cluster_id: str | None = None,
                     timeout_s: float = 30.0) -> dict[str, Any]:
    """POST {url}/v1/measurements; returns the stored measurement's JSON (ValueError on failure)."""
    payload = for_service(body)
    if cluster_id:
        payload["cluster_id"] = cluster_id
    return dict(post_json(url, "/v1/measurements", payload, timeout_s=timeout_s))


def service_recommend(url: str, model: Model, cluster: Cluster, training: Training, options: SearchOptions,
                      *, timeout_s: float = 60.0) -> Plan:
    """The best plan from POST {url}/v1/recommend with the same specs and pins."""
    body = measurement_record(model=model, cluster=cluster, training=training, plan=Plan(), measured={},
                              prediction=None)
    search = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(options).items()
              if v is not None and k not in ("examples_per_reason",)}
    if "placement" in search:
        search["placement"] = [list(p) for p in search["placement"]]
    payload = for_service({"model": body["model"], "cluster": body["cluster"], "training": body["training"],
                           "top_k": 1, "search": search})
    answer = post_json(url, "/v1/recommend", payload, timeout_s=timeout_s)
    best = answer.get("best") if isinstance(answer, dict) else None
    if not best:
        raise ValueError(f"the service at {url} found no valid layout: {str(answer)[:500]}")
    return plan_from_dict({k: v for k, v in best["plan"].items() if k in {f.name for f in dataclasses.fields(Plan)}})


def _finite(value: Any) -> Any:
    """JSON-safe copy: non-finite floats become None, tuples lists, numpy scalars Python."""
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


# --------------------------------------------------------------------------------------------
# Validation: predicted vs measured over many plans, before and after calibration
# --------------------------------------------------------------------------------------------


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
    """Figures of `gridtune validate` (DESIGN.md section 5, local closed loop)."""

    plans: tuple[PlanResult, ...]
    spearman: float
    measured_best_predicted_rank: int
    mape_uncalibrated: float
    mape_uncalibrated_holdout: float
    mape_calibrated: float
    spearman_calibrated: float
    corrections: dict[str, float]
    calibration_uncertainty_rel: float
    calibrated_profile: Profile | None
    kernel_overhead_us: float | None = None
    collective_factor_by_group_size: dict[int, float] = field(default_factory=dict)
    calibrated_on: tuple[int, ...] = ()


def summarize(records: Sequence[Mapping[str, Any]], *, base: Profile | None, calibrate_on: int = 3,
              prior: float = 0.05) -> ValidationSummary:
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
    result = calibrate_records(used, base, profile_id="calibrated:validate", prior=prior)
    refit = refit_constants(used, base)
    calibrated = []
    for rec in records:
        model, cluster, training, plan = record_specs(rec)
        cal_cluster = dataclasses.replace(cluster, profile=result.profile)
        calibrated.append(predict(model, cal_cluster, training, plan).iteration_time_s)
    rest = [i for i in range(len(records)) if i not in chosen] or list(range(len(records)))
    plans = tuple(
        PlanResult(plan=record_specs(rec)[3], predicted_s=predicted[i], measured_s=measured[i],
                   calibrated_s=calibrated[i], used_for_calibration=i in chosen,
                   measured_parts={k: float(v) for k, v in rec["measured"].items() if isinstance(v, (int, float))})
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
        # the band a user should believe: never below the error seen on plans calibration did not use
        calibration_uncertainty_rel=float(max(result.uncertainty_rel,
                                              mape([calibrated[i] for i in rest], [measured[i] for i in rest]))),
        calibrated_profile=result.profile,
        kernel_overhead_us=refit.kernel_overhead_us,
        collective_factor_by_group_size=refit.collective_factor_by_group_size,
        calibrated_on=tuple(chosen),
    )


def summary_json(s: ValidationSummary) -> dict[str, Any]:
    """The `gridtune validate --json` object."""
    return _finite({
        "spearman": s.spearman,
        "measured_best_predicted_rank": s.measured_best_predicted_rank,
        "mape_uncalibrated": s.mape_uncalibrated,
        "mape_uncalibrated_holdout": s.mape_uncalibrated_holdout,
        "mape_calibrated": s.mape_calibrated,
        "spearman_calibrated": s.spearman_calibrated,
        "corrections": s.corrections,
        "calibration_uncertainty_rel": s.calibration_uncertainty_rel,
        "kernel_overhead_us": s.kernel_overhead_us,
        "collective_factor_by_group_size": {str(k): v for k, v in s.collective_factor_by_group_size.items()},
        "plans": [{"plan": plan_to_dict(p.plan), "predicted_s": p.predicted_s, "measured_s": p.measured_s,
                   "calibrated_s": p.calibrated_s, "used_for_calibration": p.used_for_calibration,
                   "measured": p.measured_parts} for p in s.plans],
    })
