"""The closed loop's HTTP side: the service at GRIDTUNE_URL (or an explicit URL) takes the
measurements and can choose the plan (POST /v1/measurements, POST /v1/recommend)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from perfmodels.io import plan_from_dict
from perfmodels.specs import Cluster, Model, Plan, Profile, Training
from tuner.closed_loop.records import measurement_record
from tuner.service_client import post_json
from tuner.types import SearchOptions

ENV_URL = "GRIDTUNE_URL"
# The profile fields posted to the service: the constants, not the client's own uncertainty band.
_PROFILE_SERVICE_KEYS = tuple(f.name for f in dataclasses.fields(Profile)
                              if f.name not in ("uncertainty_rel", "run_scatter_rel"))


def service_url(explicit: str | None = None) -> str | None:
    url = explicit or os.environ.get(ENV_URL, "").strip()
    return url.rstrip("/") if url else None


def for_service(body: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `body` the service takes: the profile without its uncertainty band, unset fields or
    extras (provenance, fits), and with every correction positive."""
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
    return plan_from_dict(
        {k: v for k, v in best["plan"].items() if k in {f.name for f in dataclasses.fields(Plan)}}
    )
