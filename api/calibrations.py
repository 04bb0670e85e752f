"""The domain work of /v1/calibrations: the user's measured runs in, the fitted constants stored as a
profile that `cluster.profile_id` names in /v1/predict and /v1/recommend.

Every run is checked before anything is fitted or stored, and a problem is a 422 whose location is
the run's index and field (`body.runs[i].plan`, `.cluster.gpu`, ...). The fit is
`perfmodels.calibration.calibrate_runs`; the stored document is `perfmodels.io.profile_to_dict` of
the calibrated profile (its `constants`, source "calibrated", the leave-one-out band) plus a
`calibration` section with what the answer shows, so GET returns the same object."""

from __future__ import annotations

import dataclasses
from typing import Any

from api import calibration_schemas as cs
from api.service import InputError, Loc, ProfileCache, _dump, convert, to_cluster
from perfmodels import io as pio
from perfmodels.calibration import Calibration, Run, calibrate_runs
from perfmodels.io import json_safe
from perfmodels.specs import Cluster, Plan, Profile, combination_problems
from tuner.store import Store, StoredProfile

LOO_MAX = 20
"""Leave-one-out over at most this many runs (each is one more fit)."""


def _cluster_at(loc: Loc, body: Any, profiles: ProfileCache) -> Cluster:
    try:
        return to_cluster(body, profiles)[0]
    except InputError as exc:
        raise InputError((*loc, *exc.loc[2:]), exc.msg) from None


def _sized(loc: Loc, cluster: Cluster, plan: Plan) -> Cluster:
    """The cluster the run used: a run may take part of it (whole nodes, or part of one node)."""
    world = plan.world_size
    if world == cluster.num_gpus:
        return cluster
    if world < cluster.num_gpus and (world % cluster.gpus_per_node == 0 or world < cluster.gpus_per_node):
        return cluster.with_gpus(world)
    raise InputError((*loc, "plan"), f"the plan uses {world} GPUs, which do not fit cluster.num_gpus="
                     f"{cluster.num_gpus} in whole nodes of {cluster.gpus_per_node}")


def runs_from_body(body: cs.CalibrationCreate, profiles: ProfileCache) -> tuple[Cluster, list[Run]]:
    """The body's cluster and runs as specs; InputError naming the run and field on the first problem."""
    base = _cluster_at(("body", "cluster"), body.cluster, profiles)
    runs = []
    for i, r in enumerate(body.runs):
        loc: Loc = ("body", "runs", i)
        model = convert((*loc, "model"), pio.model_from_dict, _dump(r.model))
        training = convert((*loc, "training"), pio.training_from_dict, _dump(r.training))
        plan = convert((*loc, "plan"), pio.plan_from_dict, _dump(r.plan))
        cluster = base if r.cluster is None else _cluster_at((*loc, "cluster"), r.cluster, profiles)
        if cluster.gpu.name != base.gpu.name:
            raise InputError((*loc, "cluster", "gpu"), f"runs[{i}] ran on {cluster.gpu.name!r}, the cluster "
                             f"has {base.gpu.name!r}: calibrate one GPU type at a time")
        cluster = _sized(loc, cluster, plan)
        problems = combination_problems(model, cluster, training, plan)
        if problems:
            raise InputError((*loc, "plan"), f"runs[{i}].plan does not fit: " + "; ".join(problems))
        runs.append(Run.stated(model=model, cluster=cluster, training=training, plan=plan,
                               measured_s=float(r.iteration_time_s), peak_memory_gib=r.peak_memory_gib))
    return base, runs


def calibration_json(cal: Calibration, runs: list[Run]) -> dict[str, Any]:
    """The `calibration` section: what the answer shows besides the id and name."""
    return json_safe({
        "parameters": {name: {"value": p.value, "prior": p.prior, "fitted": p.fitted, "unit": p.unit,
                              "variance_ratio": p.variance_ratio} for name, p in cal.parameters.items()},
        "loo_mape": cal.loo_mape,
        "uncertainty_rel": cal.uncertainty_rel,
        "mape_before": cal.mape_before,
        "mape_after": cal.mape_after,
        "stack": runs[0].trainings[0].stack_name,
        "gpu": runs[0].cluster.gpu.name,
        "runs": [{"measured_s": float(m), "predicted_s_before": float(b), "predicted_s_after": float(a)}
                 for m, b, a in zip(cal.measured_s, cal.predicted_before_s, cal.predicted_after_s,
                                    strict=True)],
    })


def stored_cluster_json(cluster: Cluster) -> dict[str, Any]:
    """The base cluster as stored beside the profile (what a later `profile_id` request starts from)."""
    out = json_safe(pio.cluster_to_dict(cluster))
    for key in ("profile", "profile_id"):
        out.pop(key, None)
    return {k: v for k, v in out.items() if v is not None}


def create_calibration(body: cs.CalibrationCreate, store: Store, profiles: ProfileCache) -> dict[str, Any]:
    base, runs = runs_from_body(body, profiles)
    try:
        cal = calibrate_runs(runs, loo_max=LOO_MAX)
    except ValueError as exc:
        raise InputError(("body", "runs"), str(exc)) from None
    base_profile = base.profile
    if base_profile is not None:
        base_profile = dataclasses.replace(base_profile, constants=(), corrections=(), source="profile")
    profile: Profile = cal.profile(base_profile)
    section = calibration_json(cal, runs)
    name = body.name or f"calibration-{section['stack']}-{section['gpu']}"
    doc = json_safe(pio.profile_to_dict(profile))
    doc.pop("profile_id", None)
    doc["calibration"] = section
    stored = store.add_profile(name=name, profile=doc, cluster=stored_cluster_json(base))
    return calibration_out(stored)


def calibration_out(stored: StoredProfile) -> dict[str, Any]:
    section = dict(stored.profile.get("calibration") or {})
    return {"profile_id": stored.id, "name": stored.name, **section}


def get_calibration(store: Store, key: str) -> dict[str, Any] | None:
    stored = store.get_profile(key)
    if stored is None or not isinstance(stored.profile.get("calibration"), dict):
        return None
    return calibration_out(stored)
