"""Train the built-in GPT on a 4D grid with the engine's building blocks, by hand (no tuner).

Shows the whole public API in one place: engine.init, ParallelGPT, create_dataloader, Pipeline,
forward_backward, sync_gradients, engine.step (sync + global-norm clip + optimizer step),
CommRecorder, full_state_dict, checkpoints with the LR scheduler;
and compares the recorded bytes per group with perfmodels.traffic. Runs on CPU with forked gloo
ranks:

    OMP_NUM_THREADS=1 .venv/bin/python examples/engine_4d_gpt.py --data 2 --inter 2 --row 2 --steps 5
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch.utils.data import TensorDataset

from engine.launch import launch
from engine.models.gpt import GPTConfig

CFG = GPTConfig(num_layers=4, hidden_size=64, num_attention_heads=8, seq_length=16, vocab_size=100)


def worker(rank: int, world: int, args: argparse.Namespace, ckpt: str) -> dict[str, Any]:
    import engine
    from perfmodels.plans import from_plans
    from perfmodels.specs import Plan, Training
    from perfmodels.traffic import bytes_per_group

    grid = engine.init(G_data=args.data, G_inter=args.inter, G_intra_d=args.depth, G_intra_r=args.row,
                       G_intra_c=args.col)
    torch.manual_seed(0)
    model = engine.ParallelGPT(CFG, grid)  # only this rank's shards; the values GPT(CFG) would have
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 2))
    g = torch.Generator().manual_seed(0)
    # counting sequences (start, start+1, ...) mod vocab: the next token is learnable
    start = torch.randint(0, CFG.vocab_size, (args.steps * args.batch, 1), generator=g)
    seq = (start + torch.arange(CFG.seq_length + 1)) % CFG.vocab_size
    loader = engine.create_dataloader(TensorDataset(seq[:, :-1], seq[:, 1:]), args.batch, args.micro_batch)
    local = engine.local_batch_size(args.batch, grid, args.micro_batch)
    pipe = None
    if grid.size("inter") > 1:
        pipe = engine.Pipeline(model, grid, schedule=args.schedule, micro_batch_size=args.micro_batch,
                               local_batch_size=local)
    rec = engine.CommRecorder(grid)
    losses = []
    for x, y in loader:
        opt.zero_grad()
        rec.reset()
        with rec:
            loss = engine.forward_backward(model, x, y, micro_batch_size=args.micro_batch, pipeline=pipe)
            engine.sync_gradients(model)
        engine.step(model, opt, max_grad_norm=1.0)  # gradients already synced above: clip and step
        sched.step()
        losses.append(loss)
    engine.save_checkpoint(ckpt, model, opt, step=args.steps, scheduler=sched)
    plan = Plan(G_data=args.data, G_inter=args.inter, G_intra_d=args.depth, G_intra_r=args.row,
                G_intra_c=args.col, micro_batch_size=args.micro_batch, schedule=args.schedule)
    predicted = bytes_per_group(CFG.to_spec(), Training(global_batch_size=args.batch, dtype="fp32"),
                                from_plans([plan]), stage=grid.coord("inter"))
    full = engine.full_state_dict(model)
    return {"losses": losses, "recorded": rec.bytes_per_group(), "table": rec.table(),
            "predicted": {k: int(v[0]) for k, v in predicted.items()},
            "params": sum(t.numel() for t in full.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for axis in ("data", "inter", "depth", "row", "col"):
        parser.add_argument(f"--{axis}", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--schedule", default="1f1b", choices=["gpipe", "1f1b", "interleaved-1f1b"])
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    world = args.data * args.inter * args.depth * args.row * args.col
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as ckpt:
        results = launch(worker, world_size=world, args=(args, ckpt), timeout_s=120)
    last = results[-1]  # the last rank is on the last pipeline stage: it has the loss
    print(f"grid data={args.data} inter={args.inter} depth={args.depth} row={args.row} col={args.col}, "
          f"{last['params']:,} parameters")
    print("loss per step:", " ".join(f"{x:.4f}" for x in last["losses"]))
    print("last rank, bytes per group in the last step (recorded / perfmodels.traffic):")
    for axis, nbytes in last["recorded"].items():
        print(f"  {axis:6s} {nbytes:>10,} / {last['predicted'].get(axis, 0):>10,}")


if __name__ == "__main__":
    main()
