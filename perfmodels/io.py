"""Plain dicts (JSON) to specs and back: the one converter behind the CLI's files and the REST API.

Accepted forms (the REST bodies of docs/architecture.md, "The path of one request"):
- model: the transformer fields, or {"preset": "gpt3-175b", ...overrides}, or {"layers": [...]};
- cluster: {"preset": "selene", "num_gpus": 1024, ...overrides} or every field, where "gpu" is a
  preset name or an object with "peak_tflops" (per dtype) and "memory_gib";
- training and plan: their field names.
Unknown keys and wrong types raise `ValueError` naming the key and value.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from perfmodels import presets, stacks
from perfmodels.specs import (
    GPU,
    Cluster,
    CollectiveFit,
    LayerSpec,
    Model,
    Plan,
    Prediction,
    Profile,
    Training,
)

TRANSFORMER_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size")
"""The dimensions a transformer given by its shape must state (the rest have defaults)."""


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _check_keys(owner: str, data: Mapping[str, Any], allowed: set[str]) -> None:
    if not isinstance(data, Mapping):
        raise ValueError(f"{owner} must be an object, got {data!r}")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ValueError(f"{owner} has unknown field(s) {unknown}; allowed: {sorted(allowed)}")


def _build(owner: str, cls: type, data: Mapping[str, Any]) -> Any:
    try:
        return cls(**data)
    except TypeError as exc:  # wrong types surface as TypeError inside dataclass init
        raise ValueError(f"{owner}: {exc}") from None


def model_from_dict(data: Mapping[str, Any]) -> Model:
    allowed = _fields(Model) | {"preset"}
    _check_keys("model", data, allowed)
    data = dict(data)
    preset = data.pop("preset", None)
    if "layers" in data and data["layers"] is not None:
        layers = data.pop("layers")
        if not isinstance(layers, (list, tuple)) or not layers:
            raise ValueError(f"model.layers must be a non-empty list, got {layers!r}")
        specs = []
        for i, layer in enumerate(layers):
            _check_keys(f"model.layers[{i}]", layer, _fields(LayerSpec))
            specs.append(_build(f"model.layers[{i}]", LayerSpec, layer))
        data["layers"] = tuple(specs)
    else:
        data.pop("layers", None)
    if preset is not None:
        base = presets.model(str(preset))
        overrides = {k: v for k, v in data.items() if v is not None}
        return dataclasses.replace(base, **overrides) if overrides else base
    data = {k: v for k, v in data.items() if v is not None}
    if "layers" not in data:
        # every missing dimension in one message, not the first of them as "got 0"
        missing = [f for f in TRANSFORMER_FIELDS if f not in data]
        if missing:
            needs = ", ".join(TRANSFORMER_FIELDS)
            raise ValueError(
                f"model is missing {', '.join(missing)} (a transformer needs {needs}; or start from a "
                'preset, {"preset": "llama3-8b", ...}, or give model.layers for another network)'
            )
    return _build("model", Model, data)


def gpu_from_dict(data: Mapping[str, Any] | str) -> GPU:
    if isinstance(data, str):
        return presets.gpu(data)
    allowed = _fields(GPU) | {"peak_tflops", "preset"}
    _check_keys("cluster.gpu", data, allowed)
    data = dict(data)
    preset = data.pop("preset", None)
    peaks = data.pop("peak_tflops", None) or {}
    if not isinstance(peaks, Mapping):
        raise ValueError(f"cluster.gpu.peak_tflops must be an object of dtype -> TFLOP/s, got {peaks!r}")
    for dtype, value in peaks.items():
        if dtype not in ("fp32", "tf32", "bf16", "fp16", "fp8"):
            raise ValueError(f"cluster.gpu.peak_tflops has unknown dtype {dtype!r}")
        data[f"peak_tflops_{dtype}"] = value
    if preset is not None:
        return dataclasses.replace(presets.gpu(str(preset)), **data)
    data.setdefault("name", "custom-gpu")
    bf16 = data.get("peak_tflops_bf16") or data.get("peak_tflops_fp16")
    if bf16 is not None:
        data.setdefault("peak_tflops_bf16", bf16)
        data.setdefault("peak_tflops_fp16", bf16)
        data.setdefault("peak_tflops_fp32", bf16 / 16)
        data.setdefault("peak_tflops_tf32", bf16 / 2)
    if "hbm_bandwidth_GBps" not in data:
        data["hbm_bandwidth_GBps"] = 2000.0
    missing = [f for f in ("peak_tflops_bf16", "memory_gib") if f not in data]
    if missing:
        raise ValueError(f"cluster.gpu needs {missing} (or a preset name such as 'A100-80GB')")
    return _build("cluster.gpu", GPU, data)


def cluster_from_dict(data: Mapping[str, Any], profile: Profile | None = None) -> Cluster:
    allowed = _fields(Cluster) | {"preset"}
    _check_keys("cluster", data, allowed)
    data = {k: v for k, v in dict(data).items() if v is not None}
    preset = data.pop("preset", None)
    if "gpu" in data:
        data["gpu"] = gpu_from_dict(data["gpu"])
    if "profile" in data:
        data["profile"] = profile_from_dict(data["profile"])
    if profile is not None:
        data["profile"] = profile
    if preset is not None:
        base = presets.cluster(str(preset))
        return _build("cluster", lambda **kw: dataclasses.replace(base, **kw), data)
    missing = [f for f in ("num_gpus", "gpus_per_node", "gpu", "intra_node_bandwidth_GBps",
                           "inter_node_bandwidth_GBps") if f not in data]
    if missing:
        raise ValueError(f"cluster needs {missing} (or a preset such as 'selene')")
    return _build("cluster", Cluster, data)


def training_from_dict(data: Mapping[str, Any]) -> Training:
    """Training from JSON. `stack` is a preset name, or an object `{"name": PRESET, OPTION: value...}`
    that changes options of that preset (`perfmodels.stacks.Stack` fields)."""
    _check_keys("training", data, _fields(Training))
    data = {k: v for k, v in data.items() if v is not None}
    stack = data.get("stack")
    if isinstance(stack, Mapping):
        options = dict(stack)
        name = options.pop("name", None)
        if not isinstance(name, str):
            raise ValueError(
                f"training.stack.name must name a stack preset ({sorted(stacks.STACK_PRESETS)}), got {name!r}"
            )
        for key in ("schedules", "zero_stages"):
            if isinstance(options.get(key), list):
                options[key] = tuple(options[key])
        data["stack"] = _build("training.stack", lambda **kw: stacks.preset(name, **kw), options)
    return _build("training", Training, data)


def training_to_dict(training: Training) -> dict[str, Any]:
    """JSON for a Training: the stack by name when it is a preset, else as an object of its options."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(Training):
        value = getattr(training, f.name)
        if value is None:
            continue
        if isinstance(value, stacks.Stack):
            preset = stacks.STACK_PRESETS.get(value.name)
            value = value.name if preset == value else {
                k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(value).items()
                if preset is None or getattr(preset, k) != v or k == "name"}
        out[f.name] = value
    return out


def plan_from_dict(data: Mapping[str, Any]) -> Plan:
    _check_keys("plan", data, _fields(Plan))
    data = {k: v for k, v in data.items() if v is not None}
    if "placement" in data:
        data["placement"] = tuple(data["placement"])
    return _build("plan", Plan, data)


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    out = dataclasses.asdict(plan)
    out["placement"] = list(plan.order)
    return out


def prediction_to_dict(pred: Prediction) -> dict[str, Any]:
    return dataclasses.asdict(pred)


def profile_to_dict(profile: Profile) -> dict[str, Any]:
    out = dataclasses.asdict(profile)
    out["corrections"] = dict(profile.corrections)
    out["constants"] = dict(profile.constants)
    return out


def profile_from_dict(data: Mapping[str, Any]) -> Profile:
    informational = ("provenance", "fits", "expected", "holdout_median_abs_error", "calibration")
    _check_keys("profile", data, _fields(Profile) | set(informational))
    data = dict(data)
    for extra in informational:
        data.pop(extra, None)
    fits = []
    for i, item in enumerate(data.pop("collectives", None) or ()):
        _check_keys(f"profile.collectives[{i}]", item, _fields(CollectiveFit))
        fits.append(_build(f"profile.collectives[{i}]", CollectiveFit, item))
    corrections = data.pop("corrections", None) or {}
    if isinstance(corrections, Mapping):
        corrections = tuple(sorted((str(k), float(v)) for k, v in corrections.items()))
    else:
        corrections = tuple((str(k), float(v)) for k, v in corrections)
    constants = data.pop("constants", None) or {}
    if isinstance(constants, Mapping):
        constants = constants.items()
    try:
        constants = tuple(sorted((str(k), float(v)) for k, v in constants))
    except (TypeError, ValueError):
        raise ValueError(f"profile.constants must map names to numbers, got {constants!r}") from None
    from perfmodels.constants import check_values  # constants reads the specs io builds

    check_values(dict(constants))
    return _build("profile", Profile, {**data, "collectives": tuple(fits), "corrections": corrections,
                                       "constants": constants})


def cluster_to_dict(cluster: Cluster) -> dict[str, Any]:
    out = dataclasses.asdict(cluster)
    out["gpu"] = dataclasses.asdict(cluster.gpu)
    out["profile"] = profile_to_dict(cluster.profile) if cluster.profile else None
    return out


def model_to_dict(model: Model) -> dict[str, Any]:
    out = dataclasses.asdict(model)
    if not model.layers:
        out.pop("layers")
    return out


def json_safe(value: Any) -> Any:
    """A copy that `json.dumps` writes as strict JSON: non-finite floats become None (JSON has no
    NaN or Infinity), tuples become lists, numpy scalars Python numbers, mapping keys strings.

    The one such helper: the service's responses, the store's documents, profiles on disk and the
    closed loop's records all go through it, so they agree on what an unknown number looks like.
    """
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
