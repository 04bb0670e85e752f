"""Arguments shared by `gridtune recommend` and `gridtune predict`: what is trained, on what, how.

Model: `--model PRESET` or `--model-file model.json` (DESIGN.md's Model fields, or {"preset": ...}).
Cluster: `--cluster PRESET` or `--cluster-file cluster.json`, adjusted by `--gpus`,
`--gpus-per-node`, `--gpu`, `--intra-node-bandwidth`, `--inter-node-bandwidth`; `--profile
profile.json` (from `gridtune profile`) supplies measured constants.
Every bad value becomes a ValueError naming the flag or field, which the CLI prints as one line.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from perfmodels import presets
from perfmodels.io import (
    cluster_from_dict,
    gpu_from_dict,
    model_from_dict,
    profile_from_dict,
    training_from_dict,
)
from perfmodels.specs import Cluster, Model, Training


def add_spec_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", help=f"model preset ({', '.join(presets.model_names()[:6])}, ...)")
    g.add_argument("--model-file", type=Path, help="JSON file with the model's fields")
    g = p.add_argument_group("cluster")
    g.add_argument("--cluster", help=f"cluster preset ({', '.join(presets.cluster_names())})")
    g.add_argument("--cluster-file", type=Path, help="JSON file with the cluster's fields")
    g.add_argument("--gpus", type=int, help="number of GPUs to plan for")
    g.add_argument("--gpus-per-node", type=int)
    g.add_argument("--gpu", help=f"GPU preset ({', '.join(presets.gpu_names())})")
    g.add_argument("--intra-node-bandwidth", type=float, metavar="GBPS", help="NVLink GB/s per GPU per direction")
    g.add_argument("--inter-node-bandwidth", type=float, metavar="GBPS", help="network GB/s per GPU per direction")
    g.add_argument("--profile", type=Path, help="profile JSON written by `gridtune profile`")
    g = p.add_argument_group("training")
    g.add_argument("--global-batch-size", type=int, required=True)
    g.add_argument("--dtype", default="bf16", choices=["fp32", "tf32", "bf16", "fp16", "fp8"])
    g.add_argument("--no-flash-attention", action="store_true", help="attention materialises the s x s scores")
    g.add_argument("--no-overlap-grad-reduce", action="store_true",
                   help="the data-parallel gradient reduction runs after backward")
    g.add_argument("--overlap-tp-comm", action="store_true", help="tensor-parallel comm overlaps GEMMs")
    g.add_argument("--zero3-gather", default="layer", choices=["layer", "tensor"],
                   help="ZeRO-3 collectives per block (FSDP) or per parameter tensor (DeepSpeed 2021)")
    g.add_argument("--no-overlap-param-gather", action="store_true",
                   help="ZeRO-3 fetches parameters on demand instead of prefetching")


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"{what} file {str(path)!r} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} file {str(path)!r} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what} file {str(path)!r} must hold a JSON object")
    return data


def model_from_args(args: argparse.Namespace) -> Model:
    if args.model and args.model_file:
        raise ValueError("give either --model or --model-file, not both")
    if args.model_file:
        return model_from_dict(_read_json(args.model_file, "--model-file"))
    if args.model:
        return presets.model(args.model)
    raise ValueError("--model or --model-file is required")


def cluster_from_args(args: argparse.Namespace) -> Cluster:
    if args.cluster and args.cluster_file:
        raise ValueError("give either --cluster or --cluster-file, not both")
    profile = None
    if args.profile:
        profile = profile_from_dict(_read_json(args.profile, "--profile"))
    if args.cluster_file:
        cluster = cluster_from_dict(_read_json(args.cluster_file, "--cluster-file"))
    elif args.cluster:
        cluster = presets.cluster(args.cluster)
    elif args.gpu and args.gpus and args.gpus_per_node and args.intra_node_bandwidth and args.inter_node_bandwidth:
        cluster = Cluster(num_gpus=args.gpus, gpus_per_node=args.gpus_per_node, gpu=gpu_from_dict(args.gpu),
                          intra_node_bandwidth_GBps=args.intra_node_bandwidth,
                          inter_node_bandwidth_GBps=args.inter_node_bandwidth)
    else:
        raise ValueError("--cluster or --cluster-file is required (or all of --gpu, --gpus, --gpus-per-node, "
                         "--intra-node-bandwidth, --inter-node-bandwidth)")
    changes: dict[str, Any] = {}
    if args.gpus is not None:
        changes["num_gpus"] = args.gpus
    if args.gpus_per_node is not None:
        changes["gpus_per_node"] = args.gpus_per_node
    if args.gpu is not None:
        changes["gpu"] = gpu_from_dict(args.gpu)
    if args.intra_node_bandwidth is not None:
        changes["intra_node_bandwidth_GBps"] = args.intra_node_bandwidth
    if args.inter_node_bandwidth is not None:
        changes["inter_node_bandwidth_GBps"] = args.inter_node_bandwidth
    if profile is not None:
        changes["profile"] = profile
        changes["profile_id"] = profile.profile_id or str(args.profile)
    return replace(cluster, **changes) if changes else cluster


def training_from_args(args: argparse.Namespace) -> Training:
    return training_from_dict({
        "global_batch_size": args.global_batch_size,
        "dtype": args.dtype,
        "flash_attention": not args.no_flash_attention,
        "overlap_grad_reduce": not args.no_overlap_grad_reduce,
        "overlap_tp_comm": args.overlap_tp_comm,
        "zero3_gather": args.zero3_gather,
        "overlap_param_gather": not args.no_overlap_param_gather,
    })


def parse_assignments(text: str, what: str) -> dict[str, str]:
    """'a=1,b=x' -> {'a': '1', 'b': 'x'}; ValueError naming `what` on malformed input."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise ValueError(f"{what}: expected FIELD=VALUE, got {part!r}")
        key, value = (x.strip() for x in part.split("=", 1))
        out[key] = value
    return out


def coerce(field: str, value: str) -> Any:
    """Plan field values from text: ints, booleans, axis orders ('col/row/depth/inter/data')."""
    if field == "placement":
        return tuple(value.replace("/", " ").split())
    if field == "sequence_parallel":
        if value.lower() in ("true", "1", "yes"):
            return True
        if value.lower() in ("false", "0", "no"):
            return False
        raise ValueError(f"{field} must be true or false, got {value!r}")
    if field in ("schedule", "recompute"):
        return value
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{field} must be an integer, got {value!r}") from None
