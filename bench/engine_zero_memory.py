"""Model-state memory per rank under ZeRO-3 on 4 data ranks against ZeRO-0 (issue 13 figure).

Both train the same GPT for two steps on 4 ranks with G_data=4 (AdamW, fp32). ZeRO-0's figure is
this rank's parameters + gradients + AdamW state after a step (engine.model_state_bytes); ZeRO-3's
is engine.Zero3's peak over the two steps (shards, their gradients and AdamW state, plus the units
gathered and their unreduced gradients at every gather and reduce). Target: ZeRO-3 <= 0.35 x ZeRO-0.
Run:

    OMP_NUM_THREADS=1 .venv/bin/python bench/engine_zero_memory.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from engine.launch import launch
from engine.models.gpt import GPT, GPTConfig

CFG = GPTConfig(num_layers=8, hidden_size=128, num_attention_heads=4, seq_length=32, vocab_size=256)
GLOBAL_BATCH = 8


def measure(rank: int, world: int, cfg: GPTConfig = CFG) -> dict[str, Any]:
    import engine

    grid = engine.init(G_data=world)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, cfg.vocab_size, (GLOBAL_BATCH, cfg.seq_length), generator=g)
    y = torch.randint(0, cfg.vocab_size, (GLOBAL_BATCH, cfg.seq_length), generator=g)
    local = GLOBAL_BATCH // world
    x, y = x[rank * local:(rank + 1) * local], y[rank * local:(rank + 1) * local]
    out: dict[str, Any] = {}
    for stage in (0, 3):
        torch.manual_seed(0)
        model = engine.ParallelGPT.from_serial(GPT(cfg), grid)
        opt = engine.Zero3(model, torch.optim.AdamW, lr=1e-3) if stage == 3 else \
            torch.optim.AdamW(model.parameters(), lr=1e-3)
        peak = 0
        for _ in range(2):
            opt.zero_grad()
            engine.forward_backward(model, x, y, micro_batch_size=1)
            engine.step(model, opt)
            if stage == 0:
                peak = max(peak, engine.model_state_bytes(model, opt))
        out[stage] = opt.peak_model_state_bytes if stage == 3 else peak
    out["params"] = sum(p.numel() for p in GPT(cfg).parameters())
    return out


def main() -> None:
    torch.set_num_threads(1)
    results = launch(measure, 4, timeout_s=600)
    ratios = [r[3] / r[0] for r in results]
    r0 = results[0]
    print(f"GPT {CFG.num_layers}x{CFG.hidden_size} ({r0['params']:,} parameters), 4 ranks G_data=4, "
          f"AdamW fp32: model states per rank ZeRO-0 {r0[0] / 2**20:.2f} MiB, "
          f"ZeRO-3 peak {r0[3] / 2**20:.2f} MiB, "
          f"ZeRO-3/ZeRO-0 = {max(ratios):.3f} (worst rank; target <= 0.35)")


if __name__ == "__main__":
    main()
