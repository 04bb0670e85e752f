"""`gridtune presets`: every model, cluster and GPU preset by name, with its main numbers.

    gridtune presets                 # tables
    gridtune presets --kind gpus     # one kind
    gridtune presets --json          # {"models": {...}, "clusters": {...}, "gpus": {...}, "stacks": {...}}

The same list is `GET /v1/presets` on the service.
"""

from __future__ import annotations

import argparse
import json
import sys

KIND_COLUMNS = {
    "models": (
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "ffn_hidden_size",
        "seq_length",
        "vocab_size",
        "num_query_groups",
        "gated_mlp",
        "dropout",
        "num_moe_experts",
    ),
    "clusters": (
        "gpu",
        "num_gpus",
        "gpus_per_node",
        "intra_node_bandwidth_GBps",
        "inter_node_bandwidth_GBps",
        "backend",
    ),
    "gpus": ("peak_tflops_bf16", "peak_tflops_fp8", "memory_gib", "hbm_bandwidth_GBps", "vendor"),
}


def _stack_runs(s: dict) -> str:
    """What layouts a stack can run, in a few words: its parallelisms, schedules and ZeRO stages."""
    named = (("tensor_parallel", "TP"), ("sequence_parallel", "SP"), ("pipeline_parallel", "PP"),
             ("tensor_parallel_3d", "3D-TP"))
    kinds = " ".join(name for key, name in named if s.get(key)) or "data only"
    schedules = "/".join(x.replace("interleaved-1f1b", "interleaved") for x in s.get("schedules") or ())
    zero = ",".join(str(z) for z in s.get("zero_stages") or ())
    return f"{kinds}; {schedules if s.get('pipeline_parallel') else '-'}; ZeRO {zero}"


def _stack_overlaps(s: dict) -> str:
    named = (("overlap_grad_reduce", "grad reduce"), ("overlap_param_gather", "param gather"),
             ("overlap_tp_comm", "TP comm"), ("overlap_depth_comm", "depth comm"))
    return ", ".join(name for key, name in named if s.get(key)) or "none"


STACK_COLUMNS = (  # (title, value, widest)
    ("runs (parallelism; schedules; ZeRO)", _stack_runs, 28),
    ("overlaps", _stack_overlaps, 16),
    ("attention", lambda s: "flash" if s.get("flash_attention") else "unfused", 9),
)


def _stacks_table(items: dict) -> object:
    from rich.table import Table

    table = Table(title=f"stacks ({len(items)})", show_lines=True)
    table.add_column("name", no_wrap=True)
    for title, _, widest in STACK_COLUMNS:
        table.add_column(title, max_width=widest)
    table.add_column("what it is", ratio=1, min_width=40)
    for name, fields in items.items():
        table.add_row(name, *(fn(fields) for _, fn, _ in STACK_COLUMNS), str(fields.get("summary") or ""))
    return table


def register(sub: argparse._SubParsersAction) -> None:
    from cli.formatter import HelpFormatter

    p = sub.add_parser("presets", help="list model, cluster, GPU (and stack) presets", description=__doc__,
                       formatter_class=HelpFormatter)
    p.add_argument(
        "--kind", choices=("models", "clusters", "gpus", "stacks"), help="only this kind (default: all)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tuner.catalog import preset_catalog

    catalog = preset_catalog()
    if args.kind:
        catalog = {args.kind: catalog[args.kind]}
    if args.json:
        json.dump(catalog, sys.stdout)
        sys.stdout.write("\n")
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    for kind, items in catalog.items():
        if not items:
            continue
        if kind == "stacks":
            console.print(_stacks_table(items))
            continue
        columns = KIND_COLUMNS.get(kind) or tuple(k for k in next(iter(items.values())) if k != "name")[:8]
        table = Table(title=f"{kind} ({len(items)})")
        table.add_column("name", no_wrap=True)
        for col in columns:
            table.add_column(col, justify="right")
        for name, fields in items.items():
            table.add_row(name, *("" if fields.get(c) is None else str(fields.get(c)) for c in columns))
        console.print(table)
    return 0
