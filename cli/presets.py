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


def register(sub: argparse._SubParsersAction) -> None:
    from cli.common import HelpFormatter

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
        columns = KIND_COLUMNS.get(kind) or tuple(next(iter(items.values())).keys())[:8]
        table = Table(title=f"{kind} ({len(items)})")
        table.add_column("name", no_wrap=True)
        for col in columns:
            table.add_column(col, justify="right")
        for name, fields in items.items():
            table.add_row(name, *("" if fields.get(c) is None else str(fields.get(c)) for c in columns))
        console.print(table)
    return 0
