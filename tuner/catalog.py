"""What presets exist, by name, with their main numbers: `gridtune presets` and `GET /v1/presets`.

Why: a new user cannot guess names like `gpt3-175b`, `selene` or `A100-80GB`, and `--help` cannot list
them all readably. Also the defaults a cluster given by flags takes from its GPU (`node_defaults`).

    from tuner.catalog import preset_catalog
    print(sorted(preset_catalog()["gpus"]))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import perfmodels
from perfmodels import presets
from perfmodels.specs import GPU, Cluster


def _numbers(obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, (int, float, str, bool)) or value is None:
            out[f.name] = value
        elif isinstance(value, GPU):
            out[f.name] = value.name
        elif isinstance(value, (tuple, list)) and all(isinstance(v, (int, float, str, bool)) for v in value):
            out[f.name] = list(value)
    return out


def stack_presets() -> dict[str, Any]:
    """Training stacks (`Training.stack`) where perfmodels provides them, else none."""
    # perfmodels.stacks (STACK_PRESETS: name -> frozen dataclass) arrives with the model's stack
    # support; until then there is nothing to list, and nothing here breaks.
    stacks = getattr(perfmodels, "stacks", None)
    if stacks is None:
        try:
            import importlib

            stacks = importlib.import_module("perfmodels.stacks")
        except ImportError:
            return {}
    return dict(getattr(stacks, "STACK_PRESETS", {}) or {})


def preset_catalog() -> dict[str, dict[str, dict[str, Any]]]:
    """{"models": {name: fields}, "clusters": {...}, "gpus": {...}, "stacks": {...}} (JSON-ready)."""
    stacks = {}
    for name, spec in stack_presets().items():
        stacks[str(name)] = _numbers(spec) if dataclasses.is_dataclass(spec) else {"value": str(spec)}
    return {
        "models": {n: _numbers(presets.model(n)) for n in presets.model_names()},
        "clusters": {n: _numbers(presets.cluster(n)) for n in presets.cluster_names()},
        "gpus": {n: _numbers(presets.gpu(n)) for n in presets.gpu_names()},
        "stacks": stacks,
    }


def resolve_gpu_name(name: str) -> tuple[str, str | None]:
    """(the preset's own name, a note when `name` was an alias such as "H100" for "H100-SXM")."""
    gpu = presets.gpu(name)
    if gpu.name.lower() == str(name).strip().lower():
        return gpu.name, None
    variants = [
        g for g in presets.gpu_names() if g.lower().startswith(str(name).strip().lower().split("-")[0])
    ]
    others = (
        f" (other variants: {', '.join(v for v in variants if v != gpu.name)})" if len(variants) > 1 else ""
    )
    return gpu.name, f"GPU {name!r} is taken as the {gpu.name} preset{others}"


def node_defaults(gpu_name: str) -> tuple[Cluster | None, str]:
    """The cluster preset whose nodes carry this GPU (gpus per node, link bandwidths, latencies, backend),
    so a cluster given by `--gpu` alone gets plausible links; (None, "") when no preset has it."""
    gpu = presets.gpu(gpu_name)
    for name in presets.cluster_names():
        c = presets.cluster(name)
        if c.gpu.name == gpu.name:
            return c, name
    return None, ""


NODE_FIELDS = ("gpus_per_node", "intra_node_bandwidth_GBps", "inter_node_bandwidth_GBps")


def with_node_defaults(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A cluster's JSON given by a GPU name and a count (`{"gpu": "H100", "num_gpus": 64}`), completed
    as the CLI's `--gpu H100 --gpus 64` is: node size, links, latencies and backend from the cluster
    preset built from that GPU (`node_defaults`), each field the JSON gives kept. Returns the completed
    JSON and notes for the user; JSON with a preset, a profile id, a GPU object or every node field
    comes back as it was. ValueError when no preset has that GPU and a node field is missing."""
    from dataclasses import replace

    from perfmodels.io import cluster_to_dict

    out = dict(data)
    gpu = out.get("gpu")
    if out.get("preset") is not None or out.get("profile_id") is not None or not isinstance(gpu, str):
        return out, []
    missing = [f for f in NODE_FIELDS if out.get(f) is None]
    if not missing:
        return out, []
    gpu_name, alias_note = resolve_gpu_name(gpu)
    base, base_name = node_defaults(gpu_name)
    if base is None:
        raise ValueError(f"cluster: no cluster preset has {gpu_name} GPUs to take {missing} from; give them")
    base = replace(base, name=f"{gpu_name}-cluster", profile=None, profile_id=None)
    merged = {k: v for k, v in cluster_to_dict(base).items() if v is not None}
    merged.update({k: v for k, v in out.items() if v is not None})
    merged["gpu"] = gpu_name
    taken = ", ".join(f"{k}={getattr(base, k):g}" for k in missing)
    notes = [n for n in (alias_note, f"{taken} taken from the {base_name!r} preset ({gpu_name} nodes)") if n]
    return merged, notes


PLAUSIBLE: dict[str, tuple[float, float, str]] = {
    "bandwidth_GBps": (1e-3, 1e5, "GB/s per GPU per direction"),
    "latency_us": (0.0, 1e6, "microseconds"),
    "peak_tflops": (1e-4, 1e5, "TFLOP/s"),
    "memory_gib": (1e-2, 1e5, "GiB"),
    "hbm_bandwidth_GBps": (0.1, 1e6, "GB/s"),
    "alpha_us": (0.0, 1e6, "microseconds"),
}
"""Plausible ranges of physical constants (bounds included), shared by the REST schemas (a 422 quotes
them) and the CLI's flags: wide enough for any hardware of the next decade and a CPU test box, narrow
enough that a typo such as 1e-300 GB/s cannot produce a 5e301 s step."""


def plausible_range(field: str) -> tuple[float, float, str] | None:
    """The plausible range of a field by its name (e.g. `inter_node_bandwidth_GBps`), if it has one."""
    if field.endswith("hbm_bandwidth_GBps"):
        return PLAUSIBLE["hbm_bandwidth_GBps"]
    for suffix in ("bandwidth_GBps", "latency_us", "memory_gib", "alpha_us"):
        if field.endswith(suffix):
            return PLAUSIBLE[suffix]
    if field == "busbw_GBps":
        return PLAUSIBLE["bandwidth_GBps"]
    if (
        field.startswith("peak_tflops")
        or field == "gemm_tflops_max"
        or field in ("fp32", "tf32", "bf16", "fp16", "fp8")
    ):
        return PLAUSIBLE["peak_tflops"]
    return None


def check_plausible(field: str, value: float, where: str = "") -> None:
    """ValueError naming the field, the value and the plausible range when `value` is outside it."""
    found = plausible_range(field)
    if found is None:
        return
    lo, hi, unit = found
    if not lo <= value <= hi:
        raise ValueError(f"{where or field}={value:g} is outside the plausible range {lo:g} to {hi:g} {unit}")
