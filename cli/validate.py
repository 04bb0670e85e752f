"""`gridtune validate`: the local closed loop on this machine, end to end, with figures.

    gridtune validate --nproc 4 [--model tiny-gpt] [--json] [--plot pred_vs_meas.png]

1. profile quickly (engine.microbench on `--nproc` forked gloo ranks: the collectives the engine
   uses, GEMMs, memory bandwidth) unless `--profile FILE` gives constants;
2. predict every plan the engine can run on `--nproc` ranks (tuner.closed_loop.engine_search_options:
   one micro-batch size, 1F1B, no recomputation, ZeRO 0, default placement);
3. run each plan with engine.train (a fresh fork per run, `--warmup` + `--steps` steps, median of
   the steady steps: the statistic engine.train reports, so a later run compares like with like);
   `--rounds` rounds in alternating plan order, each plan keeping the median of its rounds' medians
   (a typical run, not the luckiest: a band fitted to the fastest round would be too fast for the
   next single run) and the run-to-run scatter the rounds measured (`run_scatter_rel`, pooled over
   every plan: the machine's noise, `round_statistics`), and store every measurement
   (GRIDTUNE_DATABASE_URL or the default SQLite file; `--no-store` keeps nothing);
4. print predicted vs measured, Spearman, MAPE and the measured-best plan's predicted rank;
5. calibrate from three measured plans (predicted fastest, median and slowest:
   tuner.closed_loop.spread_plans) and report the MAPE on the other plans before and after.
   Calibration (tuner.closed_loop.calibrate_records) refits the per-kernel overhead and the
   collective cost per group size from the measured step parts (of the collectives the stack runs
   synchronously: a background collective's wait is not its cost), then fits the physical constants
   of the stack on the machine (perfmodels.calibration.calibrate_runs, the path POST
   /v1/calibrations and `gridtune calibrate` take) and the leave-one-out uncertainty band.

`--json` prints one object with `spearman`, `measured_best_predicted_rank`, `mape_uncalibrated`,
`mape_calibrated`, `plans` (and more). torch is imported only inside the handler.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from perfmodels.stacks import STACK_PRESETS


def register(subparsers: Any) -> None:
    from cli.formatter import HelpFormatter

    p = subparsers.add_parser("validate", help="profile, predict, run and compare every plan on this machine",
                              description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--nproc", type=int, default=4, help="ranks to fork on this machine (default 4)")
    p.add_argument("--model", default="tiny-gpt", help="model preset the engine can build (default tiny-gpt)")
    p.add_argument("--global-batch-size", type=int, default=16)
    p.add_argument("--stack", default="gridtune", choices=sorted(STACK_PRESETS),
                   help="the stack the predictions assume (default gridtune: what the engine does)")
    p.add_argument(
        "--micro-batch-size", type=int, default=4, help="the one micro-batch size searched (default 4)"
    )
    p.add_argument("--steps", type=int, default=5, help="timed steady-state steps per plan (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed warm-up steps per plan (default 2)")
    p.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="measure every plan this many times, in alternating order, and keep the median of the "
        "rounds; their spread is the run-to-run scatter the band adds (default 2)",
    )
    p.add_argument("--profile", type=Path, default=None, help="use this profile JSON instead of profiling")
    p.add_argument(
        "--calibrate-on", type=int, default=3, help="measured plans used for calibration (default 3)"
    )
    p.add_argument(
        "--database", default=None, help="SQLAlchemy URL of the store (default GRIDTUNE_DATABASE_URL)"
    )
    p.add_argument(
        "--no-store", action="store_true", help="do not store measurements or the calibrated profile"
    )
    p.add_argument(
        "--cluster-id", default=None, help="id the measurements are filed under (default name@host/n)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--plot", type=Path, default=None, help="write predicted vs measured to this PNG")
    p.set_defaults(handler=handle)


def quick_profile(nproc: int) -> Any:
    """Measure this machine's constants on `nproc` forked ranks (a few seconds)."""
    import pandas as pd

    from engine import microbench
    from perfmodels.io import profile_from_dict
    from perfmodels.specs import Profile
    from tuner import profiles

    config = microbench.SweepConfig.make(quick=True, max_bytes=1 << 20, progress=False,
                                         ops=["all_reduce", "all_gather", "reduce_scatter", "send_recv"])
    result = microbench.run_forked(nproc, config, backend="gloo")
    doc = profiles.build_document(pd.DataFrame(result["rows"]), provenance=result["provenance"],
                                  name=f"validate-quick-{nproc}")
    known = {f.name for f in dataclasses.fields(Profile)}
    return profile_from_dict({k: v for k, v in doc.items() if k in known})


def _run_plan(rank: int, world: int, cfg: Any, plan: Any, global_batch_size: int, steps: int, warmup: int,
              profile: Any) -> Any:
    """One rank of one measured plan (engine.launch target)."""
    import torch

    from engine.train import TokenWindows, train

    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(
        0, cfg.vocab_size, (global_batch_size * (steps + warmup + 1) * cfg.seq_length + 1,), generator=g
    )
    report = train(cfg, TokenWindows(tokens, cfg.seq_length), global_batch_size, steps + warmup, plan=plan,
                   profile=profile, warmup_steps=warmup, record=False, progress=False, use_calibrated=False)
    return report.measured if rank == 0 else None


def _measure(args: argparse.Namespace, plans: list[Any], cfg: Any,
             profile: Any) -> tuple[list[list[dict[str, Any]]], dict[str, str]]:
    """Every plan's measured steps, over `--rounds` rounds in alternating order (load from other
    processes only adds time, so each plan keeps its fastest round), and the plans whose ranks failed."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from engine.launch import RankFailed, launch

    runs: list[list[dict[str, Any]]] = [[] for _ in plans]
    failed: dict[str, str] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=_console(args.json)) as bar:
        task = bar.add_task("measuring plans", total=len(plans) * max(1, args.rounds))
        for r in range(max(1, args.rounds)):
            order = range(len(plans)) if r % 2 == 0 else reversed(range(len(plans)))
            for i in order:
                plan = plans[i]
                bar.update(task, description=f"round {r + 1}: {plan.grid_string()}")
                try:
                    runs[i].append(launch(_run_plan, args.nproc, args=(cfg, plan, args.global_batch_size,
                                                                       args.steps, args.warmup, profile),
                                          timeout_s=120)[0])
                except RankFailed as exc:  # report it, keep measuring the others
                    failed[plan.grid_string()] = str(exc).strip().splitlines()[0][:300]
                bar.advance(task)
    return runs, failed


def round_statistics(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any] | None]:
    """Each plan's measured figures over its rounds: the round at the (lower) median of the rounds'
    step times (its measured parts), with `iteration_time_s` the median over rounds (the mean of
    two), `runs_measured` the rounds, and `run_scatter_rel` the relative run-to-run scatter pooled
    over every plan measured more than once (`perfmodels.calibration.pooled_run_scatter_rel`: one
    machine, one noise; a single plan's two rounds are one degree of freedom). None for a plan
    with no round."""
    import statistics

    from perfmodels.calibration import pooled_run_scatter_rel

    pooled = pooled_run_scatter_rel([[m["iteration_time_s"] for m in r] for r in rounds])
    out: list[dict[str, Any] | None] = []
    for r in rounds:
        if not r:
            out.append(None)
            continue
        median = float(statistics.median(m["iteration_time_s"] for m in r))
        nearest = sorted(r, key=lambda m: m["iteration_time_s"])[(len(r) - 1) // 2]  # the lower median
        row = dict(nearest, iteration_time_s=median, runs_measured=float(len(r)))
        if pooled is not None and len(r) >= 2:
            row["run_scatter_rel"] = pooled[0]
        if median > 0 and "tokens_per_s" in nearest:
            row["tokens_per_s"] = nearest["tokens_per_s"] * nearest["iteration_time_s"] / median
        out.append(row)
    return out


def _store(database: str | None, records: list[dict[str, Any]], cluster_id: str, say: Any) -> None:
    """File the measurements under `cluster_id` and store the calibration they give."""
    from tuner import closed_loop as cl
    from tuner.store import Store

    store = Store(database)
    try:
        for rec in records:
            store.add_measurement(cluster_id=cluster_id, **rec)
        result = cl.calibrate_cluster(store, cluster_id)
        if result is not None:
            say(f"stored {len(records)} measurements and profile {cl.calibrated_profile_name(cluster_id)!r} "
                f"in {store.url}")
    finally:
        store.close()


def handle(args: argparse.Namespace) -> int:
    from engine.models.gpt import GPTConfig
    from engine.train import engine_problems
    from perfmodels import presets
    from perfmodels.io import json_safe, profile_to_dict
    from tuner import closed_loop as cl
    from tuner.profiles import read_profile

    if args.nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {args.nproc}")
    if args.steps < 1 or args.warmup < 0:
        raise ValueError("--steps must be >= 1 and --warmup >= 0")
    t0 = time.perf_counter()
    spec = presets.model(args.model)
    if not spec.is_transformer:
        raise ValueError(f"--model {args.model} is not a transformer the built-in GPT can build")
    cfg = GPTConfig(num_layers=spec.num_layers, hidden_size=spec.hidden_size,
                    num_attention_heads=spec.num_attention_heads, ffn_hidden_size=spec.ffn_hidden_size,
                    seq_length=spec.seq_length, vocab_size=spec.vocab_size)
    spec = cfg.to_spec(args.model)
    say = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    if args.profile is not None:
        profile = read_profile(args.profile)[0]
        say(f"profile: {args.profile}")
    else:
        say(f"profiling {args.nproc} ranks (quick) ...")
        profile = quick_profile(args.nproc)
    cluster = cl.local_cluster(args.nproc, profile)
    training = cl.engine_training(args.global_batch_size, stack=args.stack)
    options = cl.engine_search_options(micro_batch_size=args.micro_batch_size)
    candidates = [c for c in cl.candidate_plans(spec, cluster, training, options)
                  if not engine_problems(spec, c.plan, training)]
    if not candidates:
        raise ValueError(f"no plan of {args.nproc} ranks can run {args.model} with global batch "
                         f"{args.global_batch_size} and micro-batch {args.micro_batch_size}")
    say(
        f"{len(candidates)} valid plans for {args.nproc} ranks; running each for {args.warmup}+{args.steps} "
        "steps"
    )

    runs, failed = _measure(args, [c.plan for c in candidates], cfg, profile)
    measured = round_statistics(runs)
    records = [cl.measurement_record(model=spec, cluster=cluster, training=training, plan=c.plan,
                                     measured=measured[i], prediction=c.prediction)
               for i, c in enumerate(candidates) if measured[i] is not None]
    for grid, why in failed.items():
        say(f"[failed] {grid}: {why}")
    summary = cl.summarize(records, base=profile, calibrate_on=args.calibrate_on)
    cluster_id = args.cluster_id or cl.default_cluster_id(cl.local_cluster(args.nproc))
    if not args.no_store:
        _store(args.database, records, cluster_id, say)
    if args.plot is not None:
        _plot(summary, args.plot, f"{args.model} on {args.nproc} gloo ranks")
    wall = time.perf_counter() - t0
    if args.json:
        out = cl.summary_json(summary)
        out.update(wall_time_s=wall, failed=failed, nproc=args.nproc, model=args.model, cluster_id=cluster_id,
                   profile=json_safe(profile_to_dict(profile)))
        print(json.dumps(out))
    else:
        _print(summary, wall)
    return 0


def _console(to_stderr: bool) -> Any:
    from rich.console import Console

    return Console(stderr=to_stderr)


def _print(summary: Any, wall_s: float) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 110))
    order = sorted(range(len(summary.plans)), key=lambda i: summary.plans[i].predicted_s)
    table = Table(title="predicted vs measured step time (ms), in predicted order")
    for col in ("#", "plan", "predicted", "measured", "error", "calibrated", "error", "cal."):
        table.add_column(col, justify="left" if col == "plan" else "right", no_wrap=True)
    for rank, i in enumerate(order, 1):
        p = summary.plans[i]
        table.add_row(str(rank), p.plan.grid_string().replace("G_", ""), f"{p.predicted_s * 1e3:.1f}",
                      f"{p.measured_s * 1e3:.1f}", f"{(p.predicted_s - p.measured_s) / p.measured_s:+.0%}",
                      f"{(p.calibrated_s or 0) * 1e3:.1f}",
                      f"{((p.calibrated_s or 0) - p.measured_s) / p.measured_s:+.0%}",
                      "yes" if p.used_for_calibration else "")
    console.print(table)
    console.print(
        f"Spearman {summary.spearman:.3f}; measured-best plan is #{summary.measured_best_predicted_rank} "
        f"in predicted order; MAPE {summary.mape_uncalibrated:.1%} (all plans)"
    )
    factors = ", ".join(
        f"p={k}: x{v:.2f}" for k, v in sorted(summary.collective_factor_by_group_size.items())
    )
    overhead = summary.kernel_overhead_us
    console.print(
        f"calibrated from {sum(p.used_for_calibration for p in summary.plans)} plans: kernel overhead "
        f"{overhead if overhead is not None else float('nan'):.0f} us, collective cost {factors or '-'}, "
        f"constants {', '.join(f'{k}={v:.4g}' for k, v in summary.constants.items()) or 'at their priors'}:\n"
        f"MAPE on the other plans {summary.mape_uncalibrated_holdout:.1%} -> {summary.mape_calibrated:.1%}, "
        f"Spearman {summary.spearman_calibrated:.3f}"
    )
    console.print(f"wall time {wall_s:.0f} s")


def _plot(summary: Any, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meas = [p.measured_s * 1e3 for p in summary.plans]
    fig, ax = plt.subplots(figsize=(6, 5.5))
    ax.scatter(meas, [p.predicted_s * 1e3 for p in summary.plans], label="uncalibrated", marker="o")
    ax.scatter(meas, [(p.calibrated_s or 0) * 1e3 for p in summary.plans], label="calibrated", marker="x")
    lo, hi = min(meas) * 0.5, max(meas) * 1.5
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured ms/step")
    ax.set_ylabel("predicted ms/step")
    ax.set_title(f"{title}\nSpearman {summary.spearman:.2f}, MAPE {summary.mape_uncalibrated_holdout:.0%} -> "
                 f"{summary.mape_calibrated:.0%} after calibration")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
