"""Arguments shared by `gridtune recommend`, `predict` and `sweep`: what is trained, on what, how.

Model: `--model PRESET` (`gridtune presets` lists them) or `--model-file model.json`, a JSON object
with the transformer's shape (what `--model-file` takes, and the REST API's "model"):

    {"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "ffn_hidden_size": 14336,
     "seq_length": 8192, "vocab_size": 128256, "num_query_groups": 8, "gated_mlp": true}

or a preset with overrides, `{"preset": "llama3-8b", "seq_length": 4096}`, or an explicit list of
layers, `{"layers": [{"kind": "linear", "in_features": 4096, "out_features": 4096}, ...]}`.

Cluster: `--cluster PRESET` or `--cluster-file cluster.json`, adjusted by `--gpus`,
`--gpus-per-node`, `--gpu`, `--intra-node-bandwidth`, `--inter-node-bandwidth`; or, without a
preset, `--gpu NAME --gpus N` alone: node size and links default from the first cluster preset
built from that GPU (said on stderr). `--profile profile.json` (from `gridtune profile`) supplies
measured constants; when its GEMMs beat the preset's peak, the peak follows the measurement.
Every bad value becomes a ValueError naming the flag or field, which the CLI prints as one line.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from cli.formatter import HelpFormatter  # noqa: F401 - re-exported: recommend, predict, sweep, calibrate
from perfmodels import presets
from perfmodels.io import (
    cluster_from_dict,
    gpu_from_dict,
    model_from_dict,
    training_from_dict,
)
from perfmodels.specs import Cluster, Model, Training
from perfmodels.stacks import DEFAULT_STACK, FLASH_KERNEL_VALUES, STACK_PRESETS, TORCH_COMPILE_VALUES


def add_spec_arguments(p: argparse.ArgumentParser, *, gpus_help: str = "number of GPUs to plan for") -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", metavar="PRESET",
                   help=f"model preset: {', '.join(presets.model_names())} (details: gridtune presets)")
    g.add_argument("--model-file", type=Path, metavar="FILE.json",
                   help='JSON with the model\'s shape, e.g. {"num_layers": 32, "hidden_size": 4096, '
                        '"num_attention_heads": 32, "ffn_hidden_size": 14336, "seq_length": 8192, '
                        '"vocab_size": 128256}, or {"preset": "llama3-8b", "seq_length": 4096}')
    g = p.add_argument_group("cluster")
    g.add_argument(
        "--cluster", metavar="PRESET", help=f"cluster preset: {', '.join(presets.cluster_names())}"
    )
    g.add_argument(
        "--cluster-file", type=Path, metavar="FILE.json", help="JSON file with the cluster's fields"
    )
    g.add_argument("--gpus", type=int, help=gpus_help)
    g.add_argument(
        "--gpus-per-node", type=int, help="default: the cluster preset's, else the GPU's usual node"
    )
    g.add_argument("--gpu", metavar="NAME", help=f"GPU preset: {', '.join(presets.gpu_names())}")
    g.add_argument("--intra-node-bandwidth", type=float, metavar="GBPS",
                   help="NVLink GB/s per GPU per direction (default: from the cluster or GPU preset)")
    g.add_argument("--inter-node-bandwidth", type=float, metavar="GBPS",
                   help="network GB/s per GPU per direction (default: from the cluster or GPU preset)")
    g.add_argument(
        "--profile", type=Path, metavar="NAME|FILE.json",
        help="constants measured on the cluster: a JSON file written by `gridtune profile` or "
        "`gridtune calibrate --out`, or the name or id of one in the service store (`gridtune calibrate "
        "--name`, POST /v1/calibrations)",
    )
    g = p.add_argument_group("training")
    g.add_argument("--global-batch-size", type=int, required=True, help="samples per optimizer step")
    g.add_argument("--dtype", default="bf16", choices=["fp32", "tf32", "bf16", "fp16", "fp8"],
                   help="training precision")
    g.add_argument(
        "--stack",
        default=DEFAULT_STACK,
        choices=sorted(STACK_PRESETS),
        help="the software that runs the layout: what it holds in memory, what it overlaps, what "
        "it can run (`gridtune presets --kind stacks`); the flags below override one behaviour each",
    )
    g.add_argument(
        "--no-flash-attention", action="store_true", help="attention materialises the s x s scores"
    )
    g.add_argument("--no-overlap-grad-reduce", action="store_true",
                   help="the data-parallel gradient reduction runs after backward")
    g.add_argument("--overlap-tp-comm", action="store_true", help="tensor-parallel comm overlaps GEMMs")
    g.add_argument("--no-overlap-depth-comm", action="store_true",
                   help="depth all-gathers and reduce-scatters run when used, not prefetched/asynchronous")
    g.add_argument(
        "--zero3-gather",
        choices=["layer", "tensor"],
        help="ZeRO-3 collectives per block (FSDP) or per parameter tensor (DeepSpeed) (default: the stack's)",
    )
    g.add_argument("--no-overlap-param-gather", action="store_true",
                   help="ZeRO-3 fetches parameters on demand instead of prefetching")
    g.add_argument("--torch-compile", choices=TORCH_COMPILE_VALUES,
                   help="what torch.compile covers: fused element-wise traffic in compiled blocks, a "
                   "4-byte-per-logit loss when the loss is compiled (default: the stack's, eager)")
    g.add_argument("--flash-kernel", choices=FLASH_KERNEL_VALUES,
                   help="the fused attention kernel: native to the GPU (cuDNN, FlashAttention-3) or "
                   "pre-hopper (FlashAttention-2, PyTorch SDPA's flash backend; slower on H100/H200) "
                   "(default: the stack's)")
    g.add_argument("--moe-token-dispatcher", choices=("alltoall", "flex"),
                   help="mixture-of-experts token dispatch: alltoall (every token-expert pair travels) or "
                   "flex (DeepEP/HybridEP: once per remote node) (default: alltoall)")
    g.add_argument("--expert-load-imbalance", type=float, metavar="X",
                   help="busiest expert-parallel rank's tokens over the mean (default 1.15; 1 where "
                   "routing is forced balanced, as in Megatron-Bridge's MoE benchmarks)")
    g.add_argument("--cuda-graph-scope", metavar="SCOPES",
                   help="parts of each layer replayed from CUDA graphs, comma-separated, Megatron's names: "
                   "attn, mlp, moe_router, moe_preprocess (each costs the host one launch instead of "
                   "its ops) (default: none, eager)")


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


def note(text: str) -> None:
    """A line for the user on stderr (stdout stays clean for --json)."""
    print(f"gridtune: note: {text}", file=sys.stderr)


def _gpu(name: str) -> Any:
    from tuner.catalog import resolve_gpu_name

    resolved, alias_note = resolve_gpu_name(name)
    if alias_note:
        note(alias_note)
    return gpu_from_dict(resolved)


def cluster_from_args(args: argparse.Namespace) -> Cluster:
    from tuner.catalog import check_plausible

    for flag, field in (("--intra-node-bandwidth", "intra_node_bandwidth_GBps"),
                        ("--inter-node-bandwidth", "inter_node_bandwidth_GBps")):
        value = getattr(args, field.removesuffix("_GBps"), None)
        if value is not None:
            check_plausible(field, value, where=flag)
    if args.cluster and args.cluster_file:
        raise ValueError("give either --cluster or --cluster-file, not both")
    profile, profile_doc = None, {}
    if args.profile:
        from tuner.profiles import load_profile

        profile, profile_doc = load_profile(args.profile)
    calibrated_on = (profile_doc.get("calibration") or {}).get("cluster")
    if args.cluster_file:
        from tuner.catalog import with_node_defaults

        # {"gpu": "H100", "num_gpus": 64}: node size and links from that GPU's preset node, as --gpu
        data, notes = with_node_defaults(_read_json(args.cluster_file, "--cluster-file"))
        for line in notes:
            note(line)
        cluster = cluster_from_dict(data)
    elif args.cluster:
        cluster = presets.cluster(args.cluster)
    elif args.gpu and args.gpus:
        cluster = _cluster_from_gpu(args)
    elif calibrated_on:  # a calibration knows the cluster it was fitted on
        cluster = cluster_from_dict(calibrated_on)
    else:
        raise ValueError("--cluster PRESET, --cluster-file FILE, or --gpu NAME with --gpus N is required "
                         "(gridtune presets lists the names)")
    changes: dict[str, Any] = {}
    if args.gpus is not None:
        changes["num_gpus"] = args.gpus
    if args.gpus_per_node is not None:
        changes["gpus_per_node"] = args.gpus_per_node
    if args.gpu is not None:
        changes["gpu"] = _gpu(args.gpu)
    if args.intra_node_bandwidth is not None:
        changes["intra_node_bandwidth_GBps"] = args.intra_node_bandwidth
    if args.inter_node_bandwidth is not None:
        changes["inter_node_bandwidth_GBps"] = args.inter_node_bandwidth
    if profile is not None:
        changes["profile_id"] = profile.profile_id or str(args.profile)
    cluster = replace(cluster, **changes) if changes else cluster
    if profile is not None:
        from tuner.profiles import apply_profile

        cluster, notes = apply_profile(cluster, profile)
        for line in notes:
            note(line)
    return cluster


def _cluster_from_gpu(args: argparse.Namespace) -> Cluster:
    """A cluster from `--gpu` and `--gpus`: node size and links from the GPU's usual node (a cluster
    preset with that GPU), each overridable by its flag; the rest must be given when no preset has it."""
    from tuner.catalog import node_defaults, resolve_gpu_name

    gpu_name, _ = resolve_gpu_name(args.gpu)
    base, base_name = node_defaults(gpu_name)
    given = {"gpus_per_node": args.gpus_per_node, "intra_node_bandwidth_GBps": args.intra_node_bandwidth,
             "inter_node_bandwidth_GBps": args.inter_node_bandwidth}
    if base is None:
        missing = [f"--{k.removesuffix('_GBps').replace('_', '-')}" for k, v in given.items() if v is None]
        if missing:
            raise ValueError(
                f"no cluster preset has {gpu_name} GPUs to take defaults from: give {', '.join(missing)}"
            )
        return Cluster(name="custom", num_gpus=args.gpus, gpu=gpu_from_dict(gpu_name), **given)  # type: ignore[arg-type]
    taken = [k for k, v in given.items() if v is None]
    if taken:
        note(
            f"{', '.join(f'{k}={getattr(base, k):g}' for k in taken)} taken from the {base_name!r} preset "
            f"({gpu_name} nodes); override with --gpus-per-node / --intra-node-bandwidth / "
            "--inter-node-bandwidth"
        )
    return replace(base, name=f"{gpu_name}-cluster", num_gpus=args.gpus, profile=None, profile_id=None)


def training_from_args(args: argparse.Namespace) -> Training:
    """Training from the flags: the stack's behaviour, with each given flag overriding one option."""
    return training_from_dict({
        "global_batch_size": args.global_batch_size,
        "dtype": args.dtype,
        "stack": getattr(args, "stack", DEFAULT_STACK),
        "flash_attention": False if args.no_flash_attention else None,
        "overlap_grad_reduce": False if args.no_overlap_grad_reduce else None,
        "overlap_tp_comm": True if args.overlap_tp_comm else None,
        "overlap_depth_comm": False if getattr(args, "no_overlap_depth_comm", False) else None,
        "zero3_gather": args.zero3_gather,
        "overlap_param_gather": False if args.no_overlap_param_gather else None,
        "torch_compile": getattr(args, "torch_compile", None),
        "flash_kernel": getattr(args, "flash_kernel", None),
        "moe_token_dispatcher": getattr(args, "moe_token_dispatcher", None),
        "expert_load_imbalance": getattr(args, "expert_load_imbalance", None),
        "cuda_graph_scope": _scopes(getattr(args, "cuda_graph_scope", None)),
    })


def _scopes(text: str | None) -> tuple[str, ...] | None:
    """'attn,moe_router' -> ("attn", "moe_router"); None when the flag is not given."""
    if text is None:
        return None
    return tuple(filter(None, (part.strip() for part in text.split(","))))


def parse_assignments(text: str, what: str) -> dict[str, str]:
    """'a=1,b=x' -> {'a': '1', 'b': 'x'}; ValueError naming `what` on malformed input."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise ValueError(f"{what}: expected FIELD=VALUE, got {part!r}")
        key, value = (x.strip() for x in part.split("=", 1))
        out[key] = value
    return out


def plan_fields() -> set[str]:
    from dataclasses import fields

    from perfmodels.specs import Plan

    return {f.name for f in fields(Plan)}


def plan_from_text(text: str, what: str = "--plan") -> dict[str, Any]:
    """'tp=8,pp=4,dp=2,mbs=1' or 'G_intra_r=8,...' -> the plan's fields, typed. Megatron's names
    (tp, pp, dp, cp, ep, etp, vpp, mbs; `tuner.aliases`) mean the fields they name."""
    from tuner.aliases import rename_aliases

    raw = rename_aliases(parse_assignments(text, what), plan_fields(), where=what)
    return {k: coerce(k, v) for k, v in raw.items()}


def pin_field(name: str, pinnable: set[str]) -> str:
    """The search field a `--pin NAME=...` restricts: a field name or Megatron's name for it."""
    from tuner.aliases import canonical_name

    field = canonical_name(name, pinnable, where="--pin")
    if field not in pinnable:
        import difflib

        close = difflib.get_close_matches(field, sorted(pinnable), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"--pin: unknown field {name!r}{hint} (pinnable: {', '.join(sorted(pinnable))}; "
                         "or Megatron's tp, pp, dp, cp, ep, etp, vpp, mbs)")
    return field


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
    if field == "G_etp" and value.lower() in ("none", "null", "default"):
        return None  # Megatron-Core's default: the tensor-parallel size
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{field} must be an integer, got {value!r}") from None
