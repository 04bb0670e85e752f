"""Measurement records: the JSON body of one measured run (what the store keeps and what
POST /v1/measurements takes), and the specs back from one.

A record is either that body (a Mapping) or a stored `tuner.store.Measurement`; `field_of` reads
either, so calibration works on what the store returns and on what a run just built alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from perfmodels import presets
from perfmodels.io import (
    cluster_from_dict,
    json_safe,
    model_from_dict,
    model_to_dict,
    plan_from_dict,
    plan_to_dict,
    profile_to_dict,
    training_from_dict,
    training_to_dict,
)
from perfmodels.specs import Cluster, Model, Plan, Prediction, Training

MEASURED_PARTS = ("compute_s", "tp_comm_s", "tp_comm_row_s", "tp_comm_col_s", "tp_comm_depth_s", "dp_comm_s",
                  "pp_bubble_s")


def field_of(record: Any, key: str) -> Any:
    """`record[key]` for a body, `record.key` for a stored Measurement."""
    return record[key] if isinstance(record, Mapping) else getattr(record, key)


def measured_of(record: Any) -> Mapping[str, Any]:
    """The measured figures of a record (`iteration_time_s` and whatever step parts were timed)."""
    return field_of(record, "measured")


def measurement_record(*, model: Model, cluster: Cluster, training: Training, plan: Plan,
                       measured: Mapping[str, float], prediction: Prediction | None) -> dict[str, Any]:
    """The JSON body of one measurement (the store's fields and POST /v1/measurements' body)."""
    cluster_doc: dict[str, Any] = {"preset": None, "name": cluster.name, "num_gpus": cluster.num_gpus,
                                   "gpus_per_node": cluster.gpus_per_node,
                                   # what the machine is, not the preset: ranks sharing its cores
                                   "cpu_cores_per_node": cluster.cpu_cores_per_node}
    try:
        preset = presets.cluster(cluster.name)
        cluster_doc["preset"] = preset.name
    except ValueError:
        cluster_doc = {k: v for k, v in dataclasses.asdict(cluster).items() if k not in ("profile", "gpu")}
        cluster_doc["gpu"] = dataclasses.asdict(cluster.gpu)
    if cluster.profile is not None:
        cluster_doc["profile"] = json_safe(profile_to_dict(cluster.profile))
    cluster_doc = {k: v for k, v in cluster_doc.items() if v is not None}
    body: dict[str, Any] = {
        "model": json_safe(model_to_dict(model)),
        "cluster": cluster_doc,
        "training": training_to_dict(training),
        "plan": plan_to_dict(plan),
        "measured": json_safe(dict(measured)),
    }
    if prediction is not None:
        b = prediction.breakdown
        body["prediction"] = json_safe({
            "iteration_time_s": prediction.iteration_time_s, "constants_source": prediction.constants_source,
            "uncertainty_rel": prediction.uncertainty_rel,
            **{name: getattr(b, name) for name in (*MEASURED_PARTS, "pp_p2p_s", "exposed_comm_s")},
        })
    return body


def record_specs(record: Any) -> tuple[Model, Cluster, Training, Plan]:
    """Specs back from a stored record (a Store Measurement or its dict)."""
    return (model_from_dict(field_of(record, "model")), cluster_from_dict(field_of(record, "cluster")),
            training_from_dict(field_of(record, "training")), plan_from_dict(field_of(record, "plan")))
