"""`gridtune predict`: time, memory and traffic of one layout.

    gridtune predict --model gpt3-175b --cluster selene --gpus 1024 --global-batch-size 1536 \\
        --plan G_data=8,G_inter=16,G_intra_r=8,micro_batch_size=1,schedule=1f1b [--json]

Fields left out of --plan take their defaults (degrees 1, micro-batch 1, 1f1b, no recompute, ZeRO 0).
"""

from __future__ import annotations

import argparse
import json
import sys

from cli.common import (
    HelpFormatter,
    add_spec_arguments,
    cluster_from_args,
    coerce,
    model_from_args,
    parse_assignments,
    training_from_args,
)
from perfmodels.io import plan_from_dict, plan_to_dict, prediction_to_dict
from perfmodels.steptime import predict
from tuner.report import MEMORY_PARTS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="predict one layout's step time, memory and traffic",
                       description=__doc__, formatter_class=HelpFormatter)
    add_spec_arguments(p)
    p.add_argument("--plan", required=True, metavar="FIELD=VALUE,...",
                   help="e.g. G_data=8,G_inter=4,G_intra_r=8,micro_batch_size=2,schedule=1f1b")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    model, cluster, training = model_from_args(args), cluster_from_args(args), training_from_args(args)
    raw = parse_assignments(args.plan, "--plan")
    plan = plan_from_dict({k: coerce(k, v) for k, v in raw.items()})
    pred = predict(model, cluster, training, plan)
    if args.json:  # exit 0: the prediction succeeded; "fits" says whether the layout does
        json.dump({"plan": plan_to_dict(plan), "prediction": prediction_to_dict(pred)}, sys.stdout)
        sys.stdout.write("\n")
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    mem = pred.memory
    if not mem.fits:
        console.print(
            f"[bold red]DOES NOT FIT[/]: {mem.per_gpu_gib:.1f} GiB per GPU needed, {mem.capacity_gib:g} GiB "
            "available; this layout would run out of memory, so its time and MFU below are hypothetical "
            "(try recompute, a higher ZeRO stage, a smaller micro-batch, or `gridtune recommend`)"
        )
    console.print(f"[bold]{model.name}[/] on {cluster.num_gpus} x {cluster.gpu.name}: {plan.grid_string()}, "
                  f"micro-batch {plan.micro_batch_size}, {plan.schedule}, recompute {plan.recompute}, "
                  f"ZeRO {plan.zero_stage}, placement {'/'.join(plan.order)}")
    hypothetical = "" if mem.fits else "if it fitted: "
    band = f"+/- {pred.uncertainty_rel:.0%}"
    measured_band = cluster.profile is not None and cluster.profile.uncertainty_rel is not None
    if pred.constants_source == "profile" and not measured_band:
        # a fresh profile's constants were never checked against measured steps: no band is known yet
        band = "band unknown until measured steps calibrate it (gridtune validate / engine.train)"
    mfu = f"{pred.mfu:.1%}" if pred.mfu <= 1.0 else f">100% ({pred.mfu:.0%}: the GPU peak is below what runs)"
    console.print(
        f"{hypothetical}step {pred.iteration_time_s:.3f} s  |  {pred.tokens_per_s:,.0f} tokens/s  |  "
        f"{pred.tflops_per_gpu:.3g} TFLOP/s per GPU  |  MFU {mfu}  |  constants: "
        f"{pred.constants_source} ({band})"
    )
    t = Table(title="time (s per step)")
    t.add_column("component")
    t.add_column("seconds", justify="right")
    for name, value in vars(pred.breakdown).items():
        t.add_row(name.removesuffix("_s"), f"{value:.4f}")
    console.print(t)
    m = Table(
        title=f"memory per GPU: {pred.memory.per_gpu_gib:.1f} of {pred.memory.capacity_gib:g} GiB "
        f"({'fits' if pred.memory.fits else 'DOES NOT FIT'})",
        title_style="bold" if mem.fits else "bold red",
    )
    m.add_column("part")
    m.add_column("GiB", justify="right")
    for name in MEMORY_PARTS:
        m.add_row(name.removesuffix("_gib"), f"{getattr(pred.memory, name):.2f}")
    console.print(m)
    g = Table(title="traffic per GPU per step")
    g.add_column("group")
    g.add_column("calls", justify="right")
    g.add_column("MB", justify="right")
    for axis, value in pred.bytes_per_group.items():
        g.add_row(axis, f"{pred.calls_per_group.get(axis, 0):,.0f}", f"{value / 1e6:,.1f}")
    console.print(g)
    return 0
