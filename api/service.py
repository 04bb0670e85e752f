"""The boundary between JSON and the domain: request models -> frozen specs -> predict/recommend ->
plain dicts. Routers stay thin by calling these functions.

Every failure caused by the client's data becomes `InputError(loc, msg)` (rendered as a 422 in
pydantic's shape by `api.errors`), so no client input reaches a 500.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

from api import schemas
from api.settings import Settings
from perfmodels import io as pio
from perfmodels.io import json_safe
from perfmodels.ranges import plausible_range
from perfmodels.specs import Cluster, Model, Plan, Prediction, Profile, Training, combination_problems
from perfmodels.steptime import predict as predict_step
from tuner.catalog import with_node_defaults
from tuner.profiles import apply_profile
from tuner.search import recommend
from tuner.store import Measurement, Store, StoredProfile, check_json

log = logging.getLogger("gridtune.api")
T = TypeVar("T")
Loc = tuple[str | int, ...]


class ResponseCache:
    """Encoded answers of pure questions (predict, recommend), LRU, bounded in bytes.

    Why: a prediction is a pure function of (model, cluster, training, plan) and the stored
    profile, which never changes once stored; dashboards and the engine ask the same question
    again and again, and answering from memory is several times cheaper than the model. Keys are the
    request's canonical JSON plus the resolved profile id, so a profile *name* that later points
    at a newer upload gets a fresh answer. `max_bytes=0` disables it.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self.hits = 0
        self.misses = 0
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        if self.max_bytes <= 0:
            return None
        with self._lock:
            value = self._items.get(key)
            if value is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: str, value: bytes) -> None:
        cost = len(value) + len(key)
        if self.max_bytes <= 0 or cost > self.max_bytes // 4:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.size -= len(old) + len(key)
            self._items[key] = value
            self.size += cost
            while self.size > self.max_bytes and self._items:
                k, v = self._items.popitem(last=False)
                self.size -= len(k) + len(v)


def encode(payload: dict[str, Any]) -> bytes:
    """JSON bytes of an answer (already made finite)."""
    return json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()


def encode_listing(payload: dict[str, Any]) -> bytes:
    """JSON bytes of stored rows (datetimes as ISO text). Rows are scrubbed by the store, and any
    text UTF-8 cannot carry is replaced rather than failing the whole read."""
    return json.dumps(payload, separators=(",", ":"), allow_nan=False, ensure_ascii=False,
                      default=_json_default).encode("utf-8", "replace")


def _json_default(value: Any) -> Any:
    if isinstance(value, _dt.datetime):
        return value.isoformat().replace("+00:00", "Z")
    raise TypeError(f"{type(value).__name__} is not JSON")


def cache_key(kind: str, body: Any, profile_id: str | None) -> str:
    return f"{kind}|{profile_id or ''}|{body.model_dump_json(exclude_none=True)}"


class InputError(Exception):
    """The client's data is wrong; `loc` points at it like pydantic's error locations."""

    def __init__(self, loc: Loc, msg: str) -> None:
        super().__init__(msg)
        self.loc = loc
        self.msg = msg


class Unavailable(Exception):
    """The service cannot answer now (busy, search over time, a component missing): 503."""


def convert(loc: Loc, fn: Callable[..., T], *args: Any) -> T:
    """Run a converter on client data; whatever it raises is the data's fault, so 422 at `loc`."""
    try:
        return fn(*args)
    except Exception as exc:  # the converters only ever see client data
        msg = str(exc) or type(exc).__name__
        raise InputError(loc, msg) from None


def _dump(obj: Any) -> dict[str, Any]:
    return obj.model_dump(exclude_none=True)


# --------------------------------------------------------------------------------------------
# Profiles: looked up by id (or name), parsed once, cached (stored profiles never change)
# --------------------------------------------------------------------------------------------


class ProfileCache:
    def __init__(self, store: Store, size: int = 256) -> None:
        self.store = store
        self.size = size
        self._items: OrderedDict[str, tuple[StoredProfile, Profile]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> tuple[StoredProfile, Profile] | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit
        stored = self.store.get_profile(key)
        if stored is None:
            return None
        profile = convert(("body", "cluster", "profile_id"), pio.profile_from_dict, stored.profile)
        profile = dataclasses.replace(profile, profile_id=stored.id)
        entry = (stored, profile)
        if stored.id == key:  # names may later point at a newer profile: cache ids only
            with self._lock:
                self._items[key] = entry
                while len(self._items) > self.size:
                    self._items.popitem(last=False)
        return entry


# --------------------------------------------------------------------------------------------
# Specs from request models
# --------------------------------------------------------------------------------------------


def to_model(body: schemas.ModelIn) -> Model:
    return convert(("body", "model"), pio.model_from_dict, _dump(body))


def to_training(body: schemas.TrainingIn) -> Training:
    return convert(("body", "training"), pio.training_from_dict, _dump(body))


def to_plan(body: schemas.PlanIn) -> Plan:
    return convert(("body", "plan"), pio.plan_from_dict, _dump(body))


def resolve_profile_id(body: schemas.ClusterIn, profiles: ProfileCache) -> str | None:
    """The stored id that `cluster.profile_id` (an id or a name) resolves to; 422 if none."""
    if body.profile_id is None:
        return None
    found = profiles.get(body.profile_id)
    if found is None:
        raise InputError(
            ("body", "cluster", "profile_id"),
            f"cluster.profile_id={body.profile_id!r} names no stored profile (POST /v1/clusters stores one; "
            "GET /v1/clusters lists them)",
        )
    return found[0].id


def to_cluster(body: schemas.ClusterIn, profiles: ProfileCache) -> tuple[Cluster, str | None]:
    """The Cluster spec and the stored profile id it uses (None: preset constants).

    With `profile_id`, the stored profile's Cluster JSON (if any) is the base and the request's
    fields override it, so `{"profile_id": "...", "num_gpus": 256}` is enough.
    """
    data = _dump(body)
    key = data.get("profile_id")
    if key is None:
        # {"gpu": "H100", "num_gpus": 64}: node size and links from that GPU's preset node, as the CLI
        data = convert(("body", "cluster"), with_node_defaults, data)[0]
        cluster = convert(("body", "cluster"), pio.cluster_from_dict, data)
        return apply_profile(cluster, cluster.profile)[0], None
    if "profile" in data:
        raise InputError(("body", "cluster"), "cluster has both profile_id and profile; give one")
    found = profiles.get(key)
    if found is None:
        raise InputError(
            ("body", "cluster", "profile_id"),
            f"cluster.profile_id={key!r} names no stored profile (POST /v1/clusters stores one; "
            "GET /v1/clusters lists them)",
        )
    stored, profile = found
    merged = {**(stored.cluster or {}), **data, "profile_id": stored.id}
    merged.pop("profile", None)
    cluster = convert(("body", "cluster"), pio.cluster_from_dict, merged, profile)
    return apply_profile(cluster, profile)[0], stored.id  # the peak follows measured GEMMs (MFU <= 100%)


def check_combination(model: Model, cluster: Cluster, training: Training, plan: Plan) -> None:
    problems = combination_problems(model, cluster, training, plan)
    if problems:
        raise InputError(("body",), "; ".join(problems))


# --------------------------------------------------------------------------------------------
# predict
# --------------------------------------------------------------------------------------------

def prediction_json(pred: Prediction, profile_id: str | None) -> dict[str, Any]:
    out = json_safe(pio.prediction_to_dict(pred))
    out["profile_id"] = profile_id
    return out


def predict_cached(body: schemas.PredictRequest, profiles: ProfileCache, cache: ResponseCache) -> bytes:
    """The encoded answer of /v1/predict, from the cache when this exact question was asked."""
    key = cache_key("predict", body, resolve_profile_id(body.cluster, profiles))
    hit = cache.get(key)
    if hit is not None:
        return hit
    out = predict(body, profiles)
    schemas.PredictionOut.model_validate(out)  # the documented contract, checked once per answer
    data = encode(out)
    cache.put(key, data)
    return data


def predict(body: schemas.PredictRequest, profiles: ProfileCache) -> dict[str, Any]:
    raw, profile_id = _predict_raw(body, profiles)
    bad = non_finite(raw)
    if bad:
        raise InputError(*_not_finite_error(body, profiles, bad))
    return prediction_json_safe(raw, profile_id)


def _predict_raw(body: schemas.PredictRequest, profiles: ProfileCache) -> tuple[dict[str, Any], str | None]:
    model = to_model(body.model)
    cluster, profile_id = to_cluster(body.cluster, profiles)
    training = to_training(body.training)
    plan = to_plan(body.plan)
    check_combination(model, cluster, training, plan)
    try:
        pred = predict_step(model, cluster, training, plan)
    except (ValueError, ArithmeticError) as exc:
        raise InputError(("body",), str(exc) or type(exc).__name__) from None
    return pio.prediction_to_dict(pred), profile_id


def prediction_json_safe(raw: dict[str, Any], profile_id: str | None) -> dict[str, Any]:
    out = json_safe(raw)
    out["profile_id"] = profile_id
    return out


def non_finite(value: Any, where: str = "") -> list[str]:
    """Paths of the numbers in `value` that are NaN or infinite (an answer must have none)."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [where]
    if isinstance(value, dict):
        return [w for k, v in value.items() for w in non_finite(v, f"{where}.{k}" if where else str(k))]
    if isinstance(value, (list, tuple)):
        return [w for i, v in enumerate(value) for w in non_finite(v, f"{where}[{i}]")]
    return []


def _numeric_inputs(data: Any, path: Loc = ()) -> list[Loc]:
    if isinstance(data, bool):
        return []
    if isinstance(data, (int, float)):
        return [path]
    if isinstance(data, dict):
        return [p for k, v in data.items() for p in _numeric_inputs(v, (*path, k))]
    if isinstance(data, list):
        return [p for i, v in enumerate(data) for p in _numeric_inputs(v, (*path, i))]
    return []


MAX_CULPRIT_TRIES = 64


def _finite_without(trial: dict[str, Any], parent: dict[str, Any], key: str, profiles: ProfileCache) -> bool:
    """Is the answer finite with `parent[key]` left out (its default taken), or, where it cannot be
    left out, set to the middle (geometric mean) of its plausible range?"""
    value = parent.pop(key)
    found = plausible_range(key)
    middle = None if found is None else (max(found[0], 1e-3) * found[1]) ** 0.5
    for attempt in (None, middle):
        if attempt is not None:
            parent[key] = attempt
        try:
            raw, _ = _predict_raw(schemas.PredictRequest.model_validate(trial), profiles)
        except Exception:  # not a valid question without this input
            continue
        finally:
            parent.pop(key, None)
        if not non_finite(raw):
            parent[key] = value
            return True
    parent[key] = value
    return False


def _not_finite_error(
    body: schemas.PredictRequest, profiles: ProfileCache, bad: list[str]
) -> tuple[Loc, str]:
    """The final guard's 422: which outputs left the finite numbers, and the input that caused it.

    The ranges of the schemas and specs keep every answer finite; should a combination still
    overflow, each numeric input the client gave is left out in turn (the preset's or default value
    takes its place, else the middle of its plausible range) and the first whose absence makes the
    answer finite is named. Costs a few predictions, only on this error path."""
    outputs = ", ".join(bad[:4]) + (" ..." if len(bad) > 4 else "")
    data = body.model_dump(exclude_none=True)
    for path in _numeric_inputs(data)[:MAX_CULPRIT_TRIES]:
        trial = json.loads(json.dumps(data))
        parent = trial
        for part in path[:-1]:
            parent = parent[part]
        value = parent[path[-1]]
        if isinstance(parent, list):
            continue
        if _finite_without(trial, parent, path[-1], profiles):
            name = ".".join(str(p) for p in path)
            return ("body", *path), (
                f"{name}={value!r} makes the prediction leave the finite numbers ({outputs} not finite); "
                "give a value nearer the hardware's real one")
    return ("body",), (f"these inputs make the prediction leave the finite numbers ({outputs} not finite); "
                       "check the physical constants (bandwidths, TFLOP/s, efficiencies)")


# --------------------------------------------------------------------------------------------
# recommend (the slow one: routers run `run_recommend` in a thread pool)
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecommendJob:
    model: Model
    cluster: Cluster
    training: Training
    top_k: int
    search: Any  # tuner.types.SearchOptions
    profile_id: str | None
    time_budget_s: float
    key: str = ""
    suggest_trials: int = 0


def search_options(body: schemas.SearchIn | None, settings: Settings) -> tuple[Any, float]:
    from tuner.types import SearchOptions

    data = _dump(body) if body is not None else {}
    data.pop("suggest_trials", None)  # not a search option: what to say about the answer (run_recommend)
    budget = float(data.pop("time_budget_s", settings.default_search_time_s))
    budget = min(budget, settings.max_search_time_s)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key == "placement":
            kwargs[key] = tuple(tuple(p) for p in value)
        elif isinstance(value, list):
            kwargs[key] = tuple(dict.fromkeys(value))  # de-duplicated, order kept
        else:
            kwargs[key] = value
    options = convert(("body", "search"), lambda: SearchOptions(**kwargs, time_budget_s=budget))
    return options, budget


def prepare_recommend(
    body: schemas.RecommendRequest, profiles: ProfileCache, settings: Settings
) -> RecommendJob:
    model = to_model(body.model)
    cluster, profile_id = to_cluster(body.cluster, profiles)
    if cluster.num_gpus > settings.max_recommend_gpus:
        raise InputError(
            ("body", "cluster", "num_gpus"),
            f"cluster.num_gpus={cluster.num_gpus:,} is more than this service searches "
            f"({settings.max_recommend_gpus:,} GPUs at most, GRIDTUNE_MAX_GPUS; /v1/predict takes up to "
            "4,194,304)",
        )
    training = to_training(body.training)
    options, budget = search_options(body.search, settings)
    top_k = min(body.top_k, settings.max_top_k)
    return RecommendJob(model=model, cluster=cluster, training=training, top_k=top_k, search=options,
                        profile_id=profile_id, time_budget_s=budget,
                        key=cache_key(f"recommend|{budget}", body, profile_id),
                        suggest_trials=int((body.search.suggest_trials if body.search else None) or 0))


def run_recommend(job: RecommendJob) -> tuple[bytes, bool]:
    """Run one search; returns the encoded answer and whether it may be cached (finished in budget)."""
    try:
        rec = recommend(job.model, job.cluster, job.training, top_k=job.top_k, search=job.search)
    except ValueError as exc:
        raise InputError(("body",), str(exc)) from None
    out = recommendation_json(rec, job.profile_id)
    if rec.best is not None:
        from tuner.launch import all_launches

        out["launch"] = all_launches(job.model, job.cluster, job.training, rec.best.plan)
    from tuner.trials import advice_json, advise

    out["uncertainty"] = advice_json(advise(job.model, job.cluster, job.training, rec.candidates,
                                            job.suggest_trials))
    schemas.RecommendOut.model_validate(out)
    # a search cut short by its budget depends on load: not reused
    cut_short = any(str(reason).startswith("not evaluated") for reason in rec.pruned)
    complete = not cut_short and float(rec.search_time_s or 0.0) < job.time_budget_s
    return encode(out), complete


def recommendation_json(rec: Any, profile_id: str | None) -> dict[str, Any]:
    best = None
    if rec.best is not None:
        best = {
            "plan": pio.plan_to_dict(rec.best.plan),
            "prediction": prediction_json(rec.best.prediction, profile_id),
        }
    return json_safe(
        {
            "best": best,
            "candidates": [
                {
                    "rank": c.rank,
                    "plan": pio.plan_to_dict(c.plan),
                    "prediction": prediction_json(c.prediction, profile_id),
                    "equivalent_placements": [list(p) for p in getattr(c, "equivalent_placements", ())],
                    "equivalent_zero_stages": list(getattr(c, "equivalent_zero_stages", ())),
                }
                for c in rec.candidates
            ],
            "num_evaluated": int(rec.num_evaluated),
            "num_valid": int(rec.num_valid),
            "complete": bool(getattr(rec, "complete", True)),
            "num_not_evaluated": int(getattr(rec, "num_not_evaluated", 0)),
            "num_proved_slower": int(getattr(rec, "num_proved_slower", 0)),
            "exhaustive": bool(getattr(rec, "exhaustive", False)),
            "pruned": {str(k): int(v) for k, v in rec.pruned.items()},
            "pruned_examples": {str(k): [str(x) for x in v] for k, v in rec.pruned_examples.items()},
            "constants_source": rec.constants_source,
            "profile_id": profile_id,
            "explanation": rec.explanation,
            "search_time_s": float(rec.search_time_s),
        }
    )


# --------------------------------------------------------------------------------------------
# Writes
# --------------------------------------------------------------------------------------------


def cluster_json(stored: StoredProfile) -> dict[str, Any]:
    return {
        "id": stored.id,
        "name": stored.name,
        "cluster": stored.cluster,
        "profile": stored.profile,
        "created_at": stored.created_at,
    }


def create_cluster(body: schemas.ClusterCreate, store: Store) -> dict[str, Any]:
    profile_json = _dump(body.profile)
    for extra in schemas.PROFILE_EXTRAS:  # free-form: kept as sent, nulls included
        if extra in body.profile.model_fields_set:
            profile_json[extra] = getattr(body.profile, extra)
    convert(("body", "profile"), check_json, "profile", profile_json)
    convert(("body", "profile"), pio.profile_from_dict, profile_json)
    cluster_data = None
    if body.cluster is not None:
        cluster_data = _dump(body.cluster)
        if "profile_id" in cluster_data or "profile" in cluster_data:
            raise InputError(("body", "cluster"), "cluster must not carry profile_id or profile here; "
                             "the profile goes in the body's 'profile'")
        convert(("body", "cluster"), pio.cluster_from_dict, cluster_data)
    try:
        stored = store.add_profile(name=body.name, profile=profile_json, cluster=cluster_data)
    except ValueError as exc:  # the payload; database failures stay server errors
        raise InputError(("body",), str(exc)) from None
    return cluster_json(stored)


def measurement_json(m: Measurement) -> dict[str, Any]:
    """A stored measurement as the response body: every field of `tuner.store.Measurement`."""
    return {f.name: getattr(m, f.name) for f in dataclasses.fields(m)}


def create_measurement(
    body: schemas.MeasurementCreate, store: Store, profiles: ProfileCache
) -> dict[str, Any]:
    model = to_model(body.model)
    cluster, profile_id = to_cluster(body.cluster, profiles)
    training = to_training(body.training)
    plan = to_plan(body.plan)
    check_combination(model, cluster, training, plan)
    measured = body.measured.model_dump()
    convert(("body", "measured"), check_json, "measured", measured)
    if body.prediction is not None:
        convert(("body", "prediction"), check_json, "prediction", body.prediction)
    cluster_id = body.cluster_id or profile_id or cluster.name
    try:
        stored = store.add_measurement(
            model=_dump(body.model),
            cluster=_dump(body.cluster),
            training=_dump(body.training),
            plan=_dump(body.plan),
            measured=measured,
            prediction=body.prediction,
            cluster_id=cluster_id,
        )
    except ValueError as exc:  # the payload; database failures stay server errors
        raise InputError(("body",), str(exc)) from None
    return measurement_json(stored)
