"""`gridtune recommend`: rank every layout and print the best ones.

    gridtune recommend --model gpt3-175b --cluster selene --gpus 1024 --global-batch-size 1536 \\
        [--top 10] [--pin G_intra_c=1 --pin 'schedule=1f1b|interleaved-1f1b'] [--json] [--plot top.png] \\
        [--csv candidates.csv] [--emit megatron|nemo|deepspeed|torchtitan|fsdp|gridtune]

Pins: `--pin FIELD=V1,V2` (or `V1|V2`, quoted: `|` is a pipe to the shell) keeps only those values.
`--json` prints exactly one JSON object (best, candidates, num_evaluated, pruned, complete, launch, ...).
`--csv FILE` writes every ranked candidate (raise --top for more), one row each with the plan, step
time, throughput, MFU, memory and time breakdown. `--emit STACK` prints how to launch the best plan
with that stack: Megatron-LM pretrain_gpt.py arguments (megatron), NeMo 2 / Megatron-Bridge recipe
overrides (nemo), a DeepSpeed config and launcher (deepspeed), torchtitan.train overrides
(torchtitan), an LLM Foundry YAML (fsdp) or the gridtune engine's torchrun line (gridtune, alias
torchrun). Without --stack it ranks as the stack that emitter launches (--emit megatron ranks
megatron-core), so the printed launch is always the plan shown as best; `--json` carries the same
text under `launch`. Searches of more than 1,048,576 GPUs are refused (the service's default
bound too; `predict` takes up to 4,194,304).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

from cli.common import (
    HelpFormatter,
    add_spec_arguments,
    cluster_from_args,
    coerce,
    model_from_args,
    pin_field,
    training_from_args,
)
from perfmodels.specs import Plan
from perfmodels.stacks import DEFAULT_STACK
from tuner.launch import KINDS, all_launches, check_emit_stack, launch_for, stack_for_emit
from tuner.report import parallel_columns, recommendation_to_dict, write_candidates_csv
from tuner.search import MAX_GPUS, recommend
from tuner.types import Recommendation, SearchOptions

PINNABLE = {f.name for f in fields(SearchOptions)} - {
    "max_micro_batch_size",
    "time_budget_s",
    "examples_per_reason",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("recommend", help="rank every layout and show the best",
                       description=__doc__, formatter_class=HelpFormatter)
    add_spec_arguments(p, gpus_help=f"number of GPUs to plan for (at most {MAX_GPUS:,})")
    p.add_argument("--top", type=int, default=10, help="how many distinct layouts to show")
    p.add_argument("--pin", action="append", default=[], metavar="FIELD=V1,V2",
                   help=f"restrict a plan field to these values (comma- or '|'-separated); "
                        f"fields: {', '.join(sorted(PINNABLE))}")
    p.add_argument("--max-micro-batch-size", type=int, default=64, help="largest micro-batch searched")
    p.add_argument(
        "--time-budget", type=float, default=30.0, metavar="S", help="stop searching after S seconds"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--exhaustive", action="store_true",
                   help="score every plan instead of skipping those a lower bound proves unable to enter the "
                        "top list (the same answer, slower; for checking)")
    p.add_argument(
        "--plot", metavar="FILE.png", help="picture of the top layouts: step time, breakdown, memory"
    )
    p.add_argument("--csv", metavar="FILE.csv", help="write every ranked candidate as CSV")
    p.add_argument("--emit", choices=KINDS, metavar="STACK",
                   help=f"print how to launch the best plan with this stack ({', '.join(KINDS)}); without "
                        "--stack, rank as the stack it launches")
    p.add_argument("--suggest-trials", type=int, default=0, metavar="N",
                   help="when the leaders are closer than the prediction's band, name the N layouts whose "
                   "measurement best separates them (tuner.trials)")
    # stack None: --stack not given (then the --emit target's stack, or the default)
    p.set_defaults(handler=run, stack=None)


def search_options(pins: list[str], max_mb: int, budget: float, exhaustive: bool = False) -> SearchOptions:
    values: dict[str, object] = {}
    for pin in pins:
        if "=" not in pin:
            raise ValueError(f"--pin expects FIELD=V1,V2, got {pin!r}")
        name, text = (x.strip() for x in pin.split("=", 1))
        field = pin_field(name, PINNABLE)  # Megatron's names (tp, pp, ...) too
        values[field] = tuple(
            coerce(field, v.strip()) for v in text.replace("|", ",").split(",") if v.strip()
        )
    if max_mb < 1:
        raise ValueError(f"--max-micro-batch-size must be >= 1, got {max_mb}")
    if budget <= 0:
        raise ValueError(f"--time-budget must be > 0, got {budget}")
    return SearchOptions(**values, max_micro_batch_size=max_mb, time_budget_s=budget,  # type: ignore[arg-type]
                         exhaustive=exhaustive)


def check_gpus(num_gpus: int) -> None:
    """One bound for searches, here and in the service (GRIDTUNE_MAX_GPUS defaults to it)."""
    if num_gpus > MAX_GPUS:
        raise ValueError(
            f"cluster.num_gpus={num_gpus:,} is more than a search covers ({MAX_GPUS:,} GPUs at most; "
            "`gridtune predict` takes up to 4,194,304)"
        )


def run(args: argparse.Namespace) -> int:
    if args.top < 1:
        raise ValueError(f"--top must be >= 1, got {args.top}")
    if args.stack is None:
        args.stack = stack_for_emit(args.emit) if args.emit else DEFAULT_STACK
        if args.emit:
            print(f"gridtune: --emit {args.emit} without --stack: ranking layouts the {args.stack} stack can "
                  "launch", file=sys.stderr)
    elif args.emit:
        check_emit_stack(args.emit, args.stack)
    model, cluster, training = model_from_args(args), cluster_from_args(args), training_from_args(args)
    check_gpus(cluster.num_gpus)
    options = search_options(args.pin, args.max_micro_batch_size, args.time_budget, args.exhaustive)
    if args.json:
        rec = recommend(model, cluster, training, top_k=args.top, search=options)
    else:
        from rich.console import Console

        with Console(stderr=True).status(f"ranking layouts for {model.name} on {cluster.num_gpus} GPUs..."):
            rec = recommend(model, cluster, training, top_k=args.top, search=options)
    from tuner.trials import advice_json, advise

    if args.suggest_trials < 0:
        raise ValueError(f"--suggest-trials must be >= 0, got {args.suggest_trials}")
    advice = advise(model, cluster, training, rec.candidates, args.suggest_trials)
    title = f"{model.name} on {cluster.num_gpus} x {cluster.gpu.name}"
    if args.plot and rec.candidates:
        from tuner.plot import plot_candidates

        path = plot_candidates(rec, args.plot, title=f"{title}, global batch {training.global_batch_size}")
        print(f"gridtune: wrote the plot to {Path(path).resolve()}", file=sys.stderr)
    if args.csv:
        path = write_candidates_csv(rec, args.csv)
        print(f"gridtune: wrote {len(rec.candidates)} candidates to {Path(path).resolve()}", file=sys.stderr)
    if args.json:
        out = recommendation_to_dict(rec)
        if rec.best is not None:
            out["launch"] = all_launches(model, cluster, training, rec.best.plan)
        out["uncertainty"] = advice_json(advice)
        json.dump(out, sys.stdout)
        sys.stdout.write("\n")
    else:
        print_recommendation(
            rec, title=f"{title} ({cluster.name}), global batch {training.global_batch_size}"
        )
        if advice is not None:
            print(advice.message)
            for t in advice.trials:
                print(f"  measure #{t.rank}: {t.plan.grid_string()} "
                      f"micro_batch_size={t.plan.micro_batch_size} (predicted {t.predicted_s:.3f} s)")
        if args.emit and rec.best is not None:
            launch = launch_for(args.emit, model, cluster, training, rec.best.plan)
            print(f"\n# launch the best plan (#1 above) with {launch.kind} ({launch.stack} stack):")
            print(launch.text)
            for line in launch.notes:
                print(f"# note: {line}")
    return 0 if rec.best is not None else 1


def innermost_axis(plan: Plan) -> str:
    """The axis whose ranks are consecutive: the first axis of the placement with more than one rank
    (an axis of degree 1 places nothing), "-" when every degree is 1."""
    from perfmodels.specs import AXIS_FIELDS

    return next((axis for axis in plan.order if getattr(plan, AXIS_FIELDS[axis], 1) > 1), "-")


def zero_label(c: object) -> str:
    """The row's ZeRO stage, with the stages merged into it ("1=2": same time and memory)."""
    return "=".join(str(z) for z in (c.plan.zero_stage, *c.equivalent_zero_stages))  # type: ignore[attr-defined]


def plan_label(plan: Plan) -> str:
    if plan.G_inter == 1:
        return "-"
    return plan.schedule + (f" v{plan.virtual_stages}" if plan.virtual_stages > 1 else "")


def print_recommendation(rec: Recommendation, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    if not rec.complete:
        console.print(
            f"[bold yellow]PARTIAL SEARCH[/]: the time budget ran out after {rec.num_evaluated:,} plans; "
            f"{rec.num_not_evaluated:,} were never scored, so a better layout may exist "
            "(raise --time-budget or --pin dimensions)"
        )
    table = Table(
        title=("PARTIAL: " if not rec.complete else "") + title,
        caption="grid = G_data x G_inter x G_intra_d x G_intra_r x G_intra_c (data x pipeline x depth x "
        "row x column; Megatron's DP x PP x - x TP x -); innermost = the axis whose ranks are consecutive "
        "(share a node first); +n = n other placements predict the same time (merged); SP = sequence "
        "parallelism; ZeRO 1=2: both stages predict the same time and memory (merged)",
    )
    for col in (
        "#",
        "grid",
        "mb",
        "schedule",
        "recomp",
        "ZeRO",
        "SP",
        "innermost",
        "step s",
        "MFU",
        "GiB",
        "bubble s",
        "exposed comm s",
    ):
        table.add_column(col, justify="right", no_wrap=True)
    extra = parallel_columns([c.plan for c in rec.candidates])  # CP / EP / ETP where used
    for name, _ in extra:
        table.add_column(name, justify="right", no_wrap=True)
    for c in rec.candidates:
        p, pr = c.plan, c.prediction
        b = pr.breakdown
        grid = f"{p.G_data}x{p.G_inter}x{p.G_intra_d}x{p.G_intra_r}x{p.G_intra_c}"
        inner = innermost_axis(p) + (f" +{len(c.equivalent_placements)}" if c.equivalent_placements else "")
        table.add_row(
            str(c.rank),
            grid,
            str(p.micro_batch_size),
            plan_label(p),
            p.recompute,
            zero_label(c),
            "yes" if p.sequence_parallel else "-",
            inner,
            f"{pr.iteration_time_s:.3f}",
            _mfu(pr.mfu),
            f"{pr.memory.per_gpu_gib:.1f}",
            f"{b.pp_bubble_s:.2f}",
            f"{b.exposed_comm_s:.2f}",
            *(show(p) for _, show in extra),
        )
    console.print(table)
    scope = "" if rec.complete else f" (PARTIAL: {rec.num_not_evaluated:,} not evaluated)"
    proved = (f", proved {rec.num_proved_slower:,} more unable to enter the top list (lower bounds)"
              if rec.num_proved_slower else "")
    console.print(
        f"evaluated {rec.num_evaluated:,} plans ({rec.num_valid:,} valid, scored){proved}, in "
        f"{rec.search_time_s:.2f} s{scope}; constants: {rec.constants_source}"
    )
    if rec.explanation:
        console.print(rec.explanation)
    if rec.pruned:
        console.print("rejected:")
        for reason, count in sorted(rec.pruned.items(), key=lambda kv: -kv[1]):
            example = rec.pruned_examples.get(reason, [])
            console.print(f"  {count:>10,}  {reason}" + (f"  (e.g. {example[0]})" if example else ""))


def _mfu(value: float) -> str:
    return f"{value:.1%}" if value <= 1.0 else f">100% ({value:.0%}: check the GPU peak)"
