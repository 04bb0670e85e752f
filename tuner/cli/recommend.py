"""`gridtune recommend`: rank every layout and print the best ones.

    gridtune recommend --model gpt3-175b --cluster selene --gpus 1024 --global-batch-size 1536 \\
        [--top 10] [--pin G_intra_c=1 --pin schedule=1f1b|interleaved-1f1b] [--json] [--plot top.png]

`--json` prints exactly one JSON object (best, candidates, num_evaluated, pruned, ...).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields

from perfmodels.specs import Plan
from tuner.cli.common import (
    add_spec_arguments,
    cluster_from_args,
    coerce,
    model_from_args,
    training_from_args,
)
from tuner.report import recommendation_to_dict
from tuner.search import recommend
from tuner.types import Recommendation, SearchOptions

PINNABLE = {f.name for f in fields(SearchOptions)} - {"max_micro_batch_size", "time_budget_s", "examples_per_reason"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("recommend", help="rank every layout and show the best",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_spec_arguments(p)
    p.add_argument("--top", type=int, default=10, help="how many candidates to show (default 10)")
    p.add_argument("--pin", action="append", default=[], metavar="FIELD=V1|V2",
                   help=f"restrict a plan field to these values; fields: {', '.join(sorted(PINNABLE))}")
    p.add_argument("--max-micro-batch-size", type=int, default=64)
    p.add_argument("--time-budget", type=float, default=30.0, metavar="S", help="stop searching after S seconds")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--plot", metavar="FILE.png", help="bar chart of the top candidates' time and memory")
    p.set_defaults(handler=run)


def search_options(pins: list[str], max_mb: int, budget: float) -> SearchOptions:
    values: dict[str, object] = {}
    for pin in pins:
        if "=" not in pin:
            raise ValueError(f"--pin expects FIELD=V1|V2, got {pin!r}")
        field, text = (x.strip() for x in pin.split("=", 1))
        if field not in PINNABLE:
            raise ValueError(f"--pin: unknown field {field!r}; pinnable: {sorted(PINNABLE)}")
        values[field] = tuple(coerce(field, v) for v in text.split("|") if v)
    if max_mb < 1:
        raise ValueError(f"--max-micro-batch-size must be >= 1, got {max_mb}")
    if budget <= 0:
        raise ValueError(f"--time-budget must be > 0, got {budget}")
    return SearchOptions(**values, max_micro_batch_size=max_mb, time_budget_s=budget)  # type: ignore[arg-type]


def run(args: argparse.Namespace) -> int:
    model, cluster, training = model_from_args(args), cluster_from_args(args), training_from_args(args)
    options = search_options(args.pin, args.max_micro_batch_size, args.time_budget)
    if args.json:
        rec = recommend(model, cluster, training, top_k=args.top, search=options)
    else:
        from rich.console import Console

        with Console(stderr=True).status(f"ranking layouts for {model.name} on {cluster.num_gpus} GPUs..."):
            rec = recommend(model, cluster, training, top_k=args.top, search=options)
    if args.plot:
        from tuner.plot import plot_candidates

        plot_candidates(rec, args.plot, title=f"{model.name} on {cluster.num_gpus} x {cluster.gpu.name}")
    if args.json:
        json.dump(recommendation_to_dict(rec), sys.stdout)
        sys.stdout.write("\n")
    else:
        print_recommendation(rec, title=f"{model.name} on {cluster.num_gpus} x {cluster.gpu.name} "
                                        f"({cluster.name}), global batch {training.global_batch_size}")
    return 0 if rec.best is not None else 1


def plan_label(plan: Plan) -> str:
    if plan.G_inter == 1:
        return "-"
    return plan.schedule + (f" v{plan.virtual_stages}" if plan.virtual_stages > 1 else "")


def print_recommendation(rec: Recommendation, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=150)
    table = Table(title=title, caption="grid = G_data x G_inter x G_intra_d x G_intra_r x G_intra_c")
    for col in ("#", "grid", "mb", "schedule", "recomp", "ZeRO", "inner", "step s", "MFU", "GiB", "bubble s",
                "exposed comm s"):
        table.add_column(col, justify="right", no_wrap=True)
    for c in rec.candidates:
        p, pr = c.plan, c.prediction
        b = pr.breakdown
        grid = f"{p.G_data}x{p.G_inter}x{p.G_intra_d}x{p.G_intra_r}x{p.G_intra_c}"
        table.add_row(str(c.rank), grid, str(p.micro_batch_size), plan_label(p), p.recompute, str(p.zero_stage),
                      p.order[0], f"{pr.iteration_time_s:.3f}", f"{pr.mfu:.1%}", f"{pr.memory.per_gpu_gib:.1f}",
                      f"{b.pp_bubble_s:.2f}", f"{b.exposed_comm_s:.2f}")
    console.print(table)
    console.print(f"evaluated {rec.num_evaluated:,} plans ({rec.num_valid:,} valid) in {rec.search_time_s:.2f} s; "
                  f"constants: {rec.constants_source}")
    if rec.explanation:
        console.print(rec.explanation)
    if rec.pruned:
        console.print("rejected:")
        for reason, count in sorted(rec.pruned.items(), key=lambda kv: -kv[1]):
            example = rec.pruned_examples.get(reason, [])
            console.print(f"  {count:>10,}  {reason}" + (f"  (e.g. {example[0]})" if example else ""))
