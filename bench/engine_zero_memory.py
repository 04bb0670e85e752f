"""Peak memory per rank under ZeRO-0/1/2/3 on 4 data ranks (issue 13 and issue 23 (5) figures).

Each ZeRO stage runs in its own 4 forked ranks (ru_maxrss is a per-process high-water mark), which
build the GPT shard by shard (ParallelGPT(cfg, grid, init="local"): no serial copy), train two steps
with AdamW (fp32, G_data=4, micro-batch 1) and report:
- peak RSS per rank, and the peak above the rank's own RSS right after engine.init (the process,
  torch, gloo: `baseline`), the part the model states, gradients and activations take;
- every rank fixes glibc's mmap threshold at 1 MiB first (engine.memory.return_freed_memory_to_os;
  `--dynamic-mmap-threshold` keeps glibc's default, under which freed heap holes inflate RSS);
- for ZeRO-0 and ZeRO-3 also the analytic model-state bytes (engine.model_state_bytes /
  Zero3.peak_model_state_bytes), the issue-13 figure (target ZeRO-3 <= 0.35 x ZeRO-0).
Targets (issue 23): ZeRO-1 <= ZeRO-0, ZeRO-2 <= ZeRO-1, ZeRO-3 <= 0.4 x ZeRO-0 (worst rank, peak RSS
above baseline) at GPT hidden 1024, 16 layers. Run:

    OMP_NUM_THREADS=1 .venv/bin/python bench/engine_zero_memory.py                 # hidden 1024, 4 layers
    OMP_NUM_THREADS=1 .venv/bin/python bench/engine_zero_memory.py --layers 16     # ~20 GiB of RAM in all
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from engine.launch import launch
from engine.models.gpt import GPTConfig

GLOBAL_BATCH = 8


def measure(rank: int, world: int, cfg: GPTConfig, stage: int, mmap_threshold: bool) -> dict[str, Any]:
    import engine
    from engine.memory import return_freed_memory_to_os
    from engine.train import current_rss_bytes, peak_rss_bytes

    if mmap_threshold:
        return_freed_memory_to_os()
    grid = engine.init(G_data=world)
    baseline = current_rss_bytes()
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, cfg.vocab_size, (GLOBAL_BATCH, cfg.seq_length), generator=g)
    y = torch.randint(0, cfg.vocab_size, (GLOBAL_BATCH, cfg.seq_length), generator=g)
    local = GLOBAL_BATCH // world
    x, y = x[rank * local:(rank + 1) * local], y[rank * local:(rank + 1) * local]
    torch.manual_seed(0)
    model = engine.ParallelGPT(cfg, grid, init="local")
    if stage == 3:
        opt = engine.Zero3(model, torch.optim.AdamW, lr=1e-3)
    elif stage in (1, 2):
        opt = engine.ZeroOptimizer(model, torch.optim.AdamW, lr=1e-3, stage=stage)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    state = 0
    for _ in range(2):
        opt.zero_grad()
        engine.forward_backward(model, x, y, micro_batch_size=1)
        engine.step(model, opt)
        if stage == 0:
            state = max(state, engine.model_state_bytes(model, opt))
    if stage == 3:
        state = opt.peak_model_state_bytes
    return {"peak": peak_rss_bytes(), "baseline": baseline, "state": state,
            "params": sum(p.numel() for p in model.parameters()) if stage == 0 else 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--dynamic-mmap-threshold", action="store_true",
                        help="keep glibc's dynamic mmap threshold (default: fixed 1 MiB, "
                             "engine.memory.return_freed_memory_to_os, in every stage's ranks)")
    args = parser.parse_args()
    cfg = GPTConfig(num_layers=args.layers, hidden_size=args.hidden, num_attention_heads=16, seq_length=32,
                    vocab_size=256)
    torch.set_num_threads(1)
    gib = 2**30
    above: dict[int, float] = {}
    per_stage: dict[int, list[dict[str, Any]]] = {}
    for stage in (0, 1, 2, 3):
        results = launch(measure, args.ranks, args=(cfg, stage, not args.dynamic_mmap_threshold),
                         timeout_s=1800)
        per_stage[stage] = results
        above[stage] = max(r["peak"] - r["baseline"] for r in results)
        print(f"ZeRO-{stage}: peak RSS per rank {max(r['peak'] for r in results) / gib:.2f} GiB "
              f"(baseline {max(r['baseline'] for r in results) / gib:.2f} GiB, above it "
              f"{above[stage] / gib:.2f} GiB, worst rank)", flush=True)
    params = per_stage[0][0]["params"]
    state_ratio = max(r["state"] for r in per_stage[3]) / per_stage[0][0]["state"]
    print(f"GPT {cfg.num_layers}x{cfg.hidden_size} ({params:,} parameters), {args.ranks} ranks G_data="
          f"{args.ranks}, AdamW fp32, micro-batch 1, glibc mmap threshold "
          f"{'dynamic' if args.dynamic_mmap_threshold else 'fixed 1 MiB'}:")
    print(f"  peak RSS above baseline: ZeRO-1/ZeRO-0 = {above[1] / above[0]:.3f} (target <= 1), "
          f"ZeRO-2/ZeRO-1 = {above[2] / above[1]:.3f} (target <= 1), "
          f"ZeRO-3/ZeRO-0 = {above[3] / above[0]:.3f} (target <= 0.4)")
    print(f"  model states: ZeRO-3 peak / ZeRO-0 = {state_ratio:.3f} (target <= 0.35)")


if __name__ == "__main__":
    main()
