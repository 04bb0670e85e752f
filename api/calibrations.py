"""The domain work of /v1/calibrations: the user's measured runs in, the fitted constants stored as a
profile that `cluster.profile_id` names in /v1/predict and /v1/recommend.

Every run is checked before anything is fitted or stored, and a problem is a 422 whose location is
the run's index and field (`body.runs[i].plan`, `.cluster.gpu`, ...). The fit is
`perfmodels.calibration.calibrate_runs`; the stored document is `perfmodels.io.profile_to_dict` of
the calibrated profile (its `constants`, source "calibrated", the leave-one-out band) plus a
`calibration` section with what the answer shows, so GET returns the same object."""

from __future__ import annotations

from typing import Any

from api import calibration_schemas as cs
from api.service import InputError, Loc, ProfileCache, _dump, convert, to_cluster
from perfmodels import io as pio
from perfmodels.calibration import Run, calibrate_runs
from perfmodels.specs import Cluster, combination_problems
from tuner.closed_loop.runs import calibration_document, default_name, sized_cluster
from tuner.store import Store, StoredProfile

LOO_MAX = 20
"""Leave-one-out over at most this many runs (each is one more fit)."""


def _cluster_at(loc: Loc, body: Any, profiles: ProfileCache) -> Cluster:
    try:
        return to_cluster(body, profiles)[0]
    except InputError as exc:
        raise InputError((*loc, *exc.loc[2:]), exc.msg) from None


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
        try:
            cluster = sized_cluster(cluster, plan.world_size, f"runs[{i}].plan")
        except ValueError as exc:
            raise InputError((*loc, "plan"), str(exc)) from None
        problems = combination_problems(model, cluster, training, plan)
        if problems:
            raise InputError((*loc, "plan"), f"runs[{i}].plan does not fit: " + "; ".join(problems))
        runs.append(Run.stated(model=model, cluster=cluster, training=training, plan=plan,
                               measured_s=float(r.iteration_time_s), peak_memory_gib=r.peak_memory_gib))
    return base, runs


def create_calibration(body: cs.CalibrationCreate, store: Store, profiles: ProfileCache) -> dict[str, Any]:
    base, runs = runs_from_body(body, profiles)
    try:
        cal = calibrate_runs(runs, loo_max=LOO_MAX)
    except ValueError as exc:
        raise InputError(("body", "runs"), str(exc)) from None
    doc = calibration_document(cal, runs, base)
    stored = store.add_profile(name=body.name or default_name(runs), profile=doc,
                               cluster=doc["calibration"]["cluster"])
    return calibration_out(stored)


def calibration_out(stored: StoredProfile) -> dict[str, Any]:
    section = dict(stored.profile.get("calibration") or {})
    section.pop("cluster", None)
    return {"profile_id": stored.id, "name": stored.name, **section}


def get_calibration(store: Store, key: str) -> dict[str, Any] | None:
    stored = store.get_profile(key)
    if stored is None or not isinstance(stored.profile.get("calibration"), dict):
        return None
    return calibration_out(stored)
