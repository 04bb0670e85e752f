"""`gridtune sweep`: the best layout at each GPU count or global batch size, and the scaling picture.

    gridtune sweep --model gpt3-175b --cluster selene --gpus 256,512,1024,2048 --global-batch-size 1536 \\
        --plot scaling.png
    gridtune sweep --model llama3-8b --cluster eos --gpus 64 --global-batch-size 256,512,1024 --json

Exactly one of --gpus / --global-batch-size takes a comma list. Each point runs a full search
(`--time-budget` each) and reports the best layout's step time, tokens/s (total and per GPU), MFU
and memory per GPU; `--plot` draws throughput (over GPU counts against ideal linear scaling from the
smallest count; over batch sizes, at one GPU count, the predictions alone) and memory per GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from cli.common import (
    HelpFormatter,
    add_spec_arguments,
    cluster_from_args,
    model_from_args,
    training_from_args,
)
from cli.recommend import check_gpus, search_options
from tuner.plot import plan_text
from tuner.search import recommend


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise ValueError(f"{flag} must be integers separated by commas, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise ValueError(f"{flag} must be positive integers, got {text!r}")
    return sorted(dict.fromkeys(values))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="best layout over GPU counts or batch sizes, with a scaling plot",
                       description=__doc__, formatter_class=HelpFormatter)
    add_spec_arguments(p, gpus_help="GPU count, or a comma list to sweep (e.g. 256,512,1024)")
    for action in p._actions:
        if action.dest in ("gpus", "global_batch_size"):
            action.type = str
            if action.dest == "global_batch_size":
                action.help = "samples per optimizer step, or a comma list to sweep"
    p.add_argument("--pin", action="append", default=[], metavar="FIELD=V1,V2", help="as in recommend")
    p.add_argument("--max-micro-batch-size", type=int, default=64, help="largest micro-batch searched")
    p.add_argument("--time-budget", type=float, default=10.0, metavar="S", help="search time per point")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="FILE.png", help="throughput and memory per GPU against the swept value")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    gpus = _ints(args.gpus, "--gpus") if args.gpus else []
    batches = _ints(args.global_batch_size, "--global-batch-size")
    if len(gpus) > 1 and len(batches) > 1:
        raise ValueError("sweep one thing: give a comma list to --gpus or to --global-batch-size, not both")
    swept, values = ("gpus", gpus) if len(gpus) > 1 else ("global_batch_size", batches)
    model = model_from_args(args)
    base_args = argparse.Namespace(**{**vars(args), "gpus": gpus[0] if gpus else None,
                                      "global_batch_size": batches[0]})
    cluster = cluster_from_args(base_args)
    options = search_options(args.pin, args.max_micro_batch_size, args.time_budget)
    points: list[dict[str, Any]] = []
    for value in values:
        c = replace(cluster, num_gpus=value) if swept == "gpus" else cluster
        check_gpus(c.num_gpus)
        t = training_from_args(argparse.Namespace(**{**vars(base_args), "global_batch_size":
                                                     value if swept == "global_batch_size" else batches[0]}))
        if not args.json:
            print(f"gridtune: searching {swept}={value:,} ...", file=sys.stderr)
        rec = recommend(model, c, t, top_k=1, search=options)
        point: dict[str, Any] = {"x": value, "num_gpus": c.num_gpus, "global_batch_size": t.global_batch_size,
                                 "complete": rec.complete, "plan": None, "iteration_time_s": None,
                                 "tokens_per_s": None, "tokens_per_s_per_gpu": None, "mfu": None,
                                 "per_gpu_gib": None, "capacity_gib": None}
        if rec.best is not None:
            pr = rec.best.prediction
            from perfmodels.io import plan_to_dict

            point.update(plan=plan_to_dict(rec.best.plan), plan_text=plan_text(rec.best.plan),
                         iteration_time_s=pr.iteration_time_s, tokens_per_s=pr.tokens_per_s,
                         tokens_per_s_per_gpu=pr.tokens_per_s / c.num_gpus, mfu=pr.mfu,
                         per_gpu_gib=pr.memory.per_gpu_gib, capacity_gib=pr.memory.capacity_gib)
        points.append(point)
    label = "GPUs" if swept == "gpus" else "global batch size"
    if args.plot:
        from tuner.plot import plot_sweep

        path = plot_sweep(
            points,
            args.plot,
            x_label=label,
            title=f"{model.name} on {cluster.gpu.name}: best layout per {label}"
                  + ("" if swept == "gpus" else f" ({cluster.num_gpus:,} GPUs)"),
            swept=swept,
        )
        print(f"gridtune: wrote the plot to {Path(path).resolve()}", file=sys.stderr)
    if args.json:
        json.dump({"swept": swept, "points": points}, sys.stdout)
        sys.stdout.write("\n")
        return 0 if any(p["plan"] for p in points) else 1
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{model.name} on {cluster.gpu.name} ({cluster.name}): best layout per {label}")
    for col in (label, "step s", "tokens/s", "tokens/s/GPU", "MFU", "GiB/GPU", "best layout"):
        table.add_column(col, justify="left" if col == "best layout" else "right")
    for p in points:
        if p["plan"] is None:
            table.add_row(f"{p['x']:,}", "-", "-", "-", "-", "-", "nothing fits")
            continue
        table.add_row(f"{p['x']:,}", f"{p['iteration_time_s']:.3f}", f"{p['tokens_per_s']:,.0f}",
                      f"{p['tokens_per_s_per_gpu']:,.0f}", f"{p['mfu']:.1%}", f"{p['per_gpu_gib']:.1f}",
                      p["plan_text"] + ("" if p["complete"] else " (PARTIAL search)"))
    console = Console()
    (console if console.is_terminal else Console(width=170)).print(table)
    return 0 if any(p["plan"] for p in points) else 1
