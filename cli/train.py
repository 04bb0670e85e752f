"""`gridtune train`: train a built-in example on forked ranks with engine.train, auto or a given plan.

    gridtune train --example gpt --nproc 4 --steps 50 --auto
    gridtune train --example gpt --nproc 4 --steps 50 --plan G_data=2,G_intra_r=2,micro_batch_size=2
    gridtune train --example gpt --nproc 2 --steps 20 --profile local.json --json
    gridtune train --example moe --nproc 2 --steps 30 --ep 2      # the GPT with MoE MLPs (engine.moe)

The GPT example is byte-level language modelling on the Python standard library's own sources
(offline everywhere). With --auto the tuner picks the layout (using the newest calibrated profile
of this machine when one is stored); every run stores one measurement (GRIDTUNE_DATABASE_URL or the
default SQLite file, or POST to --service-url / GRIDTUNE_URL). `--calibrate` then refits this
machine's corrections from all its stored measurements. torch is imported only in the handler.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

EXAMPLES = ("gpt", "moe")


def register(subparsers: Any) -> None:
    from cli.formatter import HelpFormatter

    p = subparsers.add_parser("train", help="train a built-in example with engine.train (auto or --plan)",
                              description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--example", choices=EXAMPLES, default="gpt")
    p.add_argument("--nproc", type=int, default=2, help="ranks to fork on this machine (default 2)")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=3, help="steps before the timed ones (default 3)")
    p.add_argument("--global-batch-size", type=int, default=16)
    p.add_argument("--micro-batch-size", type=int, default=None, help="pin the micro-batch size of --auto")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--experts", type=int, default=4, help="--example moe: experts per MoE layer (default 4)")
    p.add_argument("--topk", type=int, default=2, help="--example moe: experts per token (default 2)")
    p.add_argument("--ep", type=int, default=None,
                   help="--example moe: expert-parallel ranks G_ep (default: the plan's, else 1)")
    p.add_argument("--offload", choices=("none", "optimizer", "params"), default="none",
                   help="ZeRO's CPU offload: optimizer shards, gradients and state in host memory "
                        "(optimizer), parameter shards too (params, zero_stage=3 only); default none")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--auto", action="store_true", help="let the tuner pick the layout (the default)")
    mode.add_argument(
        "--plan", default=None, help="FIELD=VALUE,... e.g. G_data=2,G_intra_r=2,micro_batch_size=2"
    )
    p.add_argument("--profile", type=Path, default=None, help="profile JSON from `gridtune profile`")
    p.add_argument("--service-url", default=None, help="ask this service and post the measurement there")
    p.add_argument(
        "--database", default=None, help="SQLAlchemy URL of the store (default GRIDTUNE_DATABASE_URL)"
    )
    p.add_argument("--no-store", action="store_true", help="store no measurement")
    p.add_argument("--calibrate", action="store_true", help="afterwards, refit this machine's corrections")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=handle)


def parse_plan(text: str) -> Any:
    from cli.common import plan_from_text
    from perfmodels.io import plan_from_dict

    return plan_from_dict(plan_from_text(text))  # Megatron's names (tp, pp, dp, ...) too


def _rank_main(rank: int, world: int, opts: dict[str, Any]) -> Any:
    import torch

    from engine.models.gpt import GPTConfig
    from engine.train import stdlib_text_dataset, train

    moe = {}
    if opts["example"] == "moe":  # every MLP a mixture of experts (Megatron-Core's field names)
        moe = {"num_moe_experts": opts["experts"], "moe_router_topk": opts["topk"]}
    cfg = GPTConfig(num_layers=opts["layers"], hidden_size=opts["hidden"], num_attention_heads=opts["heads"],
                    seq_length=opts["seq"], vocab_size=256, **moe)
    lr = opts["lr"]
    report = train(cfg, stdlib_text_dataset(cfg.seq_length), opts["global_batch_size"], opts["steps"],
                   optimizer=lambda params: torch.optim.AdamW(params, lr=lr, weight_decay=0.01),
                   auto=opts["plan"] is None, plan=opts["plan"], profile=opts["profile"],
                   service_url=opts["service_url"], database_url=opts["database"],
                   micro_batch_size=opts["micro_batch_size"], warmup_steps=opts["warmup"],
                   record=not opts["no_store"], progress=not opts["json"],
                   max_grad_norm=1.0, G_ep=opts["ep"] if moe else None, offload=opts.get("offload", "none"))
    return report if rank == 0 else None


def handle(args: argparse.Namespace) -> int:
    from engine.launch import launch
    from perfmodels.io import plan_to_dict

    if args.nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {args.nproc}")
    if args.steps <= args.warmup:
        raise ValueError(f"--steps={args.steps} must be larger than --warmup={args.warmup}")
    plan = parse_plan(args.plan) if args.plan else None
    if plan is not None and plan.world_size != args.nproc:
        raise ValueError(f"--plan has G_data*G_inter*G_intra_d*G_intra_r*G_intra_c = {plan.world_size} "
                         f"but --nproc = {args.nproc}")
    if args.offload == "params" and plan is not None and plan.zero_stage != 3:
        raise ValueError(f"--offload params needs zero_stage=3 in --plan, got zero_stage={plan.zero_stage}")
    opts = {**vars(args), "plan": plan, "profile": str(args.profile) if args.profile else None}
    opts.pop("handler", None)
    from engine.launch import RankFailed

    try:
        report = launch(_rank_main, args.nproc, args=(opts,), timeout_s=300)[0]
    except RankFailed as exc:  # one line on the terminal, as for any bad input
        raise ValueError(str(exc).strip().splitlines()[0]) from None
    calibration = None
    if args.calibrate and not args.no_store and not args.service_url:
        from tuner import closed_loop as cl
        from tuner.store import Store

        store = Store(args.database)
        try:
            calibration = cl.calibrate_cluster(store, report.cluster_id)
        finally:
            store.close()
    if args.json:
        out = {
            "plan": plan_to_dict(report.plan),
            "losses": list(report.losses),
            "median_step_time_s": report.median_step_time_s,
            "predicted_step_time_s": report.predicted_step_time_s,
            "relative_error": report.relative_error,
            "constants_source": report.constants_source,
            "tokens_per_s": report.tokens_per_s,
            "measured": report.measured,
            "cluster_id": report.cluster_id,
            "measurement_id": report.measurement_id,
            "stored_in": report.stored_in,
            "ranks_per_core": report.ranks_per_core,
            "memory": [{**dataclasses.asdict(m), "peak_bytes": m.peak_bytes,
                        "training_rss_bytes": m.training_rss_bytes} for m in report.memory],
            "peak_memory_by_stage_gib": {str(k): v for k, v in report.peak_memory_by_stage_gib.items()},
        }
        if calibration is not None:
            out["calibration"] = {**dataclasses.asdict(calibration), "profile": None}
        print(json.dumps(out, default=str))
        return 0
    print(report.summary())
    losses = report.losses
    if losses:
        marks = sorted({0, len(losses) // 4, len(losses) // 2, 3 * len(losses) // 4, len(losses) - 1})
        print("loss: " + "  ".join(f"step {i}: {losses[i]:.3f}" for i in marks))
    if report.stored_in:
        print(
            f"measurement {report.measurement_id} stored in {report.stored_in} (cluster {report.cluster_id})"
        )
    if calibration is not None:
        corr = ", ".join(f"{k}={v:.4g}" for k, v in calibration.constants.items())
        corr = corr or "constants at their priors"
        print(f"calibrated from {calibration.num_measurements} measurements: {corr}; MAPE "
              f"{calibration.mape_before:.1%} -> {calibration.mape_after:.1%}, uncertainty "
              f"{calibration.uncertainty_rel:.0%}")
    return 0
