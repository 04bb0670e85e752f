"""Measured runs for calibration, from whatever the user has: REST run objects (also JSON lines),
and the document a calibration is stored as (the service store or a `--out` file).

One path for every source: `run_from_dict` reads the objects `POST /v1/calibrations` takes
(`{"model", "training", "plan", "iteration_time_s", "peak_memory_gib"?, "cluster"?}`), the CLI reads
JSON lines of them, and the log parsers (`tuner.logs`) produce them; `calibration_document` is what
both the service and `gridtune calibrate --out` store, a `perfmodels.io.profile_to_dict` profile
(read back by `--profile` and `cluster.profile_id`) with a `calibration` section for people.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from perfmodels import io as pio
from perfmodels.calibration import Calibration, Run
from perfmodels.io import json_safe
from perfmodels.specs import Cluster, Profile, Training, combination_problems

RUN_KEYS = ("model", "training", "plan", "iteration_time_s", "peak_memory_gib", "cluster", "source")


def sized_cluster(cluster: Cluster, world: int, where: str) -> Cluster:
    """The part of `cluster` a run of `world` GPUs used (whole nodes, or part of one node)."""
    if world == cluster.num_gpus:
        return cluster
    if world < cluster.num_gpus and (world % cluster.gpus_per_node == 0 or world < cluster.gpus_per_node):
        return cluster.with_gpus(world)
    raise ValueError(f"{where}: the plan uses {world} GPUs, which do not fit cluster.num_gpus="
                     f"{cluster.num_gpus} in whole nodes of {cluster.gpus_per_node}")


def run_from_dict(i: int, data: Mapping[str, Any], cluster: Cluster, *, stack: str | None = None) -> Run:
    """A run object as a `Run` on `cluster` (sized to its plan); ValueError names `runs[i].field`.

    `stack`: the training stack when the run's training does not name one."""
    where = f"runs[{i}]"
    if not isinstance(data, Mapping):
        raise ValueError(f"{where} must be an object with model, training, plan and iteration_time_s")
    unknown = sorted(set(data) - set(RUN_KEYS))
    if unknown:
        raise ValueError(f"{where} has unknown field(s) {unknown}; known: {list(RUN_KEYS[:5])}")
    for key in ("model", "training", "plan", "iteration_time_s"):
        if key not in data:
            raise ValueError(f"{where}.{key} is missing")
    parsed = {}
    for key, fn in (("model", pio.model_from_dict), ("training", pio.training_from_dict),
                    ("plan", pio.plan_from_dict)):
        value = data[key]
        if key == "training" and stack and isinstance(value, Mapping) and "stack" not in value:
            value = {**value, "stack": stack}
        try:
            parsed[key] = fn(value)
        except (ValueError, TypeError, AttributeError) as exc:
            raise ValueError(f"{where}.{key}: {exc}") from None
    measured = data["iteration_time_s"]
    if isinstance(measured, bool) or not isinstance(measured, (int, float)) or not measured > 0 \
            or measured != measured or measured == float("inf"):
        raise ValueError(f"{where}.iteration_time_s must be a positive number of seconds, got {measured!r}")
    peak = data.get("peak_memory_gib")
    if peak is not None and (isinstance(peak, bool) or not isinstance(peak, (int, float)) or not peak > 0):
        raise ValueError(f"{where}.peak_memory_gib must be a positive number of GiB, got {peak!r}")
    run_cluster = cluster
    if data.get("cluster") is not None:
        try:
            run_cluster = pio.cluster_from_dict(data["cluster"], cluster.profile)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{where}.cluster: {exc}") from None
        if run_cluster.gpu.name != cluster.gpu.name:
            raise ValueError(f"{where}.cluster.gpu: {run_cluster.gpu.name!r} differs from the cluster's "
                             f"{cluster.gpu.name!r}; calibrate one GPU type at a time")
    plan, model, training = parsed["plan"], parsed["model"], parsed["training"]
    run_cluster = sized_cluster(run_cluster, plan.world_size, f"{where}.plan")
    problems = combination_problems(model, run_cluster, training, plan)
    if problems:
        raise ValueError(f"{where}.plan does not fit: " + "; ".join(problems))
    return Run.stated(model=model, cluster=run_cluster, training=training, plan=plan,
                      measured_s=float(measured), peak_memory_gib=float(peak) if peak else None)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The run objects of a JSON-lines file (blank lines and `#` comments skipped)."""
    out = []
    for n, line in enumerate(Path(path).read_text().splitlines(), start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            out.append(json.loads(text))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not a JSON object ({exc.msg})") from None
    return out


def calibration_section(cal: Calibration, runs: Sequence[Run], base: Cluster) -> dict[str, Any]:
    """What a calibration shows besides its id and name: every parameter, the runs before and after,
    the leave-one-out error and band, the stack and GPU, and the base cluster it applies to."""
    cluster = json_safe(pio.cluster_to_dict(base))
    for key in ("profile", "profile_id"):
        cluster.pop(key, None)
    return json_safe({
        "parameters": {name: {"value": p.value, "prior": p.prior, "fitted": p.fitted, "unit": p.unit,
                              "variance_ratio": p.variance_ratio} for name, p in cal.parameters.items()},
        "loo_mape": cal.loo_mape,
        "uncertainty_rel": cal.uncertainty_rel,
        "mape_before": cal.mape_before,
        "mape_after": cal.mape_after,
        "stack": runs[0].trainings[0].stack_name,
        "gpu": runs[0].cluster.gpu.name,
        "cluster": {k: v for k, v in cluster.items() if v is not None},
        "runs": [{"measured_s": float(m), "predicted_s_before": float(b), "predicted_s_after": float(a)}
                 for m, b, a in zip(cal.measured_s, cal.predicted_before_s, cal.predicted_after_s,
                                    strict=True)],
    })


def calibration_document(cal: Calibration, runs: Sequence[Run], base: Cluster) -> dict[str, Any]:
    """The stored form: the calibrated profile (on top of the base cluster's microbenchmark profile,
    if any) as `profile_to_dict` writes it, plus the `calibration` section."""
    base_profile: Profile | None = base.profile
    if base_profile is not None:
        base_profile = dataclasses.replace(base_profile, constants=(), corrections=(), source="profile")
    doc = json_safe(pio.profile_to_dict(cal.profile(base_profile)))
    doc.pop("profile_id", None)
    doc["calibration"] = calibration_section(cal, runs, base)
    return doc


def default_name(runs: Sequence[Run]) -> str:
    training: Training = runs[0].trainings[0]
    return f"calibration-{training.stack_name}-{runs[0].cluster.gpu.name}"
