"""Train the built-in GPT on the Python standard library's own sources, with the layout gridtune picks.

Byte-level language modelling (vocab 256) on `Lib/*.py` of the running interpreter: real text that
every machine has offline. engine.train reads the model's shapes on the meta device, asks the
tuner for the best layout of `--nproc` ranks (or takes `--plan`), trains, and stores the measured
step time next to the prediction, so the next prediction for this machine can be calibrated.

    .venv/bin/python examples/train_gpt_stdlib.py --nproc 4 --steps 200
    .venv/bin/python examples/train_gpt_stdlib.py --nproc 2 --steps 60 --plan G_intra_r=2 --no-store

Prints the loss curve (it falls from ln(256) = 5.5 towards ~2.5 within a few hundred steps) and the
measured vs predicted step time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


def rank_main(rank: int, world: int, opts: dict[str, Any]) -> Any:
    import torch

    from engine.models.gpt import GPTConfig
    from engine.train import stdlib_text_dataset, train

    cfg = GPTConfig(num_layers=opts["layers"], hidden_size=opts["hidden"], num_attention_heads=opts["heads"],
                    seq_length=opts["seq"], vocab_size=256)
    dataset = stdlib_text_dataset(cfg.seq_length, max_bytes=opts["max_bytes"])
    lr = opts["lr"]
    report = train(cfg, dataset, opts["global_batch_size"], opts["steps"], plan=opts["plan"],
                   optimizer=lambda params: torch.optim.AdamW(params, lr=lr, weight_decay=0.01),
                   warmup_steps=min(3, opts["steps"] - 1), record=opts["record"], progress=opts["progress"],
                   database_url=opts["database"], max_grad_norm=1.0, seed=opts["seed"])
    return report if rank == 0 else None


def run(*, nproc: int = 2, steps: int = 100, global_batch_size: int = 16, layers: int = 2, hidden: int = 64,
        heads: int = 4, seq: int = 32, lr: float = 3e-3, plan: Any = None, record: bool = True,
        database: str | None = None, progress: bool = True, max_bytes: int = 2_000_000, seed: int = 0) -> Any:
    """Train on `nproc` forked ranks; return rank 0's engine.train.TrainReport."""
    from engine.launch import launch

    opts = dict(steps=steps, global_batch_size=global_batch_size, layers=layers, hidden=hidden, heads=heads,
                seq=seq, lr=lr, plan=plan, record=record, database=database, progress=progress,
                max_bytes=max_bytes, seed=seed)
    return launch(rank_main, nproc, args=(opts,), timeout_s=600)[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--global-batch-size", type=int, default=16)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--plan", default=None, help="FIELD=VALUE,... (default: the tuner picks)")
    p.add_argument("--database", default=None, help="SQLAlchemy URL of the store")
    p.add_argument("--no-store", action="store_true")
    args = p.parse_args(argv)
    plan = None
    if args.plan:
        from cli.train import parse_plan

        plan = parse_plan(args.plan)
    report = run(nproc=args.nproc, steps=args.steps, global_batch_size=args.global_batch_size,
                 layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.seq, lr=args.lr,
                 plan=plan, record=not args.no_store, database=args.database)
    print(report.summary())
    every = max(1, len(report.losses) // 10)
    for i in range(0, len(report.losses), every):
        window = report.losses[i:i + every]
        print(f"steps {i:4d}-{i + len(window) - 1:4d}  mean loss {sum(window) / len(window):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
