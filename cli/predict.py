"""`gridtune predict`: time, memory and traffic of one layout.

    gridtune predict --model gpt3-175b --cluster selene --gpus 1024 --global-batch-size 1536 \\
        --plan G_data=8,G_inter=16,G_intra_r=8,micro_batch_size=1,schedule=1f1b [--json]
    gridtune predict ... --plan tp=8,pp=16,dp=8,mbs=1       # the same plan in Megatron's names

Fields left out of --plan take their defaults (degrees 1, micro-batch 1, 1f1b, no recompute, ZeRO 0).
Megatron's names mean gridtune's fields: tp=G_intra_r, pp=G_inter, dp=G_data, cp=G_cp, ep=G_ep,
etp=G_etp, vpp=virtual_stages, mbs=micro_batch_size.

`--json` prints the prediction as `POST /v1/predict` answers it (iteration_time_s, memory, breakdown,
...), plus the plan under "plan". Exit status: 0 when the layout fits in memory, 1 when it does not
(the prediction is still printed), 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys

from cli.common import (
    HelpFormatter,
    add_spec_arguments,
    cluster_from_args,
    model_from_args,
    plan_from_text,
    training_from_args,
)
from perfmodels.io import json_safe, plan_from_dict, plan_to_dict, prediction_to_dict
from perfmodels.steptime import predict
from tuner.report import MEMORY_PARTS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="predict one layout's step time, memory and traffic",
                       description=__doc__, formatter_class=HelpFormatter)
    add_spec_arguments(p)
    p.add_argument("--plan", required=True, metavar="FIELD=VALUE,...",
                   help="e.g. G_data=8,G_inter=4,G_intra_r=8,micro_batch_size=2,schedule=1f1b, or in "
                        "Megatron's names dp=8,pp=4,tp=8,mbs=2 (also cp, ep, etp, vpp)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    model, cluster, training = model_from_args(args), cluster_from_args(args), training_from_args(args)
    plan = plan_from_dict(plan_from_text(args.plan))
    pred = predict(model, cluster, training, plan)
    fits = 0 if pred.memory.fits else 1
    if args.json:  # as POST /v1/predict answers (not nested), with the plan it predicted
        json.dump({**json_safe(prediction_to_dict(pred)), "plan": plan_to_dict(plan)}, sys.stdout)
        sys.stdout.write("\n")
        return fits
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
    return fits
