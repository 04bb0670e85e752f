"""Measure the experts' grouped GEMMs on a GPU against what `perfmodels.experts` predicts for them.

A mixture-of-experts layer runs each rank's local experts as one grouped GEMM per projection at
m = tokens per expert (`perfmodels/experts.py`, `layer_compute`). The model prices it as L calls of
the dense GEMM curve at (m, n, k) less L - 1 launch overheads, never faster than reading the weights
(`perfmodels.experts.grouped_gemm_s`). How small per-expert token counts lose efficiency is what
this script measures, for the expert shapes of
published MoE models (hidden, expert FFN width, gated), at several local expert counts L and
tokens per expert m:

  grouped   `torch._grouped_mm` (one kernel for all L experts, as Transformer Engine's GroupedLinear
            and Megatron's `grouped_gemm` do), falling back to `torch.bmm` where torch lacks it;
  loop      L separate `torch.mm` calls (the sequential-MLP path);

each forward fc1 (T x h -> up) and fc2 (T x f -> h), bf16. Prints per case the achieved TFLOP/s,
its fraction of the card's bf16 peak, and measured / predicted for the grouped kernel; writes every
row to OUT/moe_grouped_gemm.json.

    python bench/moe_grouped_gemm.py [--out DIR] [--gpu H200] [--seconds 0.05]

Needs torch with CUDA and numpy (no service dependencies): run it on the GPU machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch

# (name, hidden, expert ffn width, gated): from each model's published config (perfmodels presets)
SHAPES = (
    ("deepseek-v3", 7168, 2048, True),
    ("qwen3-235b-a22b", 4096, 1536, True),
    ("qwen3-30b-a3b", 2048, 768, True),
    ("mixtral-8x7b", 4096, 14336, True),
    ("gpt-oss-120b", 2880, 2880, True),
)
LOCAL_EXPERTS = (4, 8, 32)
TOKENS_PER_EXPERT = (32, 64, 128, 256, 512, 1024, 2048, 4096)


def timed(fn, seconds: float) -> float:
    """Median seconds per call over 5 windows of about `seconds` each (CUDA events)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    one = max(start.elapsed_time(end) / 1e3, 1e-6)
    reps = max(1, min(200, int(seconds / one)))
    times = []
    for _ in range(5):
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / reps)
    return statistics.median(times)


def grouped_fn(L: int, m: int, k: int, n: int):
    """One grouped GEMM of L experts, m tokens each: [L*m, k] x [L, k, n]."""
    x = torch.randn(L * m, k, device="cuda", dtype=torch.bfloat16)
    if hasattr(torch, "_grouped_mm"):
        w = torch.randn(L, n, k, device="cuda", dtype=torch.bfloat16).transpose(-2, -1)
        offs = torch.arange(m, L * m + 1, m, device="cuda", dtype=torch.int32)
        try:
            torch._grouped_mm(x, w, offs=offs)
            return (lambda: torch._grouped_mm(x, w, offs=offs)), "_grouped_mm"
        except Exception as exc:  # any failure: fall back, and say so
            print(f"torch._grouped_mm unavailable here ({type(exc).__name__}: {exc}); using bmm")
    xb = x.view(L, m, k)
    wb = torch.randn(L, k, n, device="cuda", dtype=torch.bfloat16)
    return (lambda: torch.bmm(xb, wb)), "bmm"


def loop_fn(L: int, m: int, k: int, n: int):
    xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(L)]
    ws = [torch.randn(k, n, device="cuda", dtype=torch.bfloat16) for _ in range(L)]

    def run() -> None:
        for a, b in zip(xs, ws):
            torch.mm(a, b)
    return run


def predicted_s(L: int, m: int, k: int, n: int, gpu_name: str) -> float:
    """`perfmodels.experts.grouped_gemm_s`, the price `layer_compute` puts on one projection."""
    import dataclasses

    from perfmodels import presets
    from perfmodels.compute import gemm_curve, hbm_rate
    from perfmodels.experts import grouped_gemm_s
    from perfmodels.specs import Training

    base = presets.cluster("eos")
    cluster = dataclasses.replace(base, gpu=presets.gpu(gpu_name))
    curve = gemm_curve(cluster, Training(global_batch_size=1, dtype="bf16"))
    return float(grouped_gemm_s(m, n, k, L, curve, hbm_rate(cluster), 2.0, 2.0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--gpu", default="H200", help="perfmodels GPU preset to predict with")
    ap.add_argument("--seconds", type=float, default=0.05)
    args = ap.parse_args()
    from perfmodels import presets

    peak = presets.gpu(args.gpu).peak_tflops("bf16")
    # settle clocks on sustained work first, as a training run holds them
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    timed(lambda: a @ a, 2.0)
    rows = []
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"bf16 peak {peak:.0f} TFLOP/s ({args.gpu})")
    print(f"{'model':16} {'proj':4} {'L':>3} {'m':>5}  {'grouped TF/s':>12} {'frac':>5} {'meas/pred':>9}"
          f"  {'loop TF/s':>9} {'frac':>5}")
    for name, h, f, gated in SHAPES:
        up = 2 * f if gated else f
        for L in LOCAL_EXPERTS:
            for m in TOKENS_PER_EXPERT:
                if L * m * max(h, up) * 2 > 2 << 30:
                    continue
                for proj, k, n in (("fc1", h, up), ("fc2", f, h)):
                    flops = 2.0 * L * m * k * n
                    g, kind = grouped_fn(L, m, k, n)
                    tg = timed(g, args.seconds)
                    tl = timed(loop_fn(L, m, k, n), args.seconds)
                    pred = predicted_s(L, m, k, n, args.gpu)
                    row = dict(model=name, proj=proj, local_experts=L, tokens_per_expert=m, k=k, n=n,
                               kernel=kind, grouped_s=tg, loop_s=tl, predicted_s=pred,
                               grouped_tflops=flops / tg / 1e12, loop_tflops=flops / tl / 1e12)
                    rows.append(row)
                    print(f"{name:16} {proj:4} {L:3d} {m:5d}  {row['grouped_tflops']:12.0f} "
                          f"{row['grouped_tflops'] / peak:5.2f} {tg / pred:9.2f}  {row['loop_tflops']:9.0f} "
                          f"{row['loop_tflops'] / peak:5.2f}")
                    torch.cuda.empty_cache()
    ratios = [r["grouped_s"] / r["predicted_s"] for r in rows]
    small = [r["grouped_s"] / r["predicted_s"] for r in rows if r["tokens_per_expert"] <= 256]
    print(f"grouped measured/predicted: median {statistics.median(ratios):.2f} over {len(rows)} cases; "
          f"m <= 256: median {statistics.median(small):.2f}, max {max(small):.2f}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "moe_grouped_gemm.json").write_text(json.dumps(
        dict(device=torch.cuda.get_device_name(), torch=torch.__version__, gpu_preset=args.gpu, rows=rows),
        indent=1))


if __name__ == "__main__":
    main()
