"""Measure what the performance model assumes of a GPU: sustained GEMM efficiency (bf16 and, where
the card has it, FP8) at the shapes of real training steps, and fused causal attention forward and
backward efficiency. Prints fractions of the card's dense peak; compare with the GPU preset.

    python bench/hopper_kernels.py [--peak-bf16 989] [--peak-fp8 1979] [--seconds 3]

Needs torch with CUDA (no gridtune install): run on the GPU machine. Each kernel runs for
`--seconds` of sustained work first, so clocks settle where a training run holds them.
"""

from __future__ import annotations

import argparse
import statistics

import torch


def timed(fn, seconds: float) -> float:
    """Median seconds per call after `seconds` of warm-up load (CUDA events)."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    n = 0
    while True:
        fn()
        n += 1
        end.record()
        end.synchronize()
        if start.elapsed_time(end) > seconds * 1e3:
            break
    times = []
    for _ in range(7):
        start.record()
        for _ in range(max(1, n // 20)):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / max(1, n // 20))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peak-bf16", type=float, default=989.0)
    ap.add_argument("--peak-fp8", type=float, default=1979.0)
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    # (tokens, out, in) of training GEMMs: GPT-3 175B TP4/TP8, Llama 70B TP4, 8B TP1, a square 8192
    shapes = [(2048, 9216, 12288), (2048, 12288, 12288 // 4 * 4 // 4), (2048, 49152 // 4, 12288),
              (4096, 14336 * 2 // 4, 8192), (4096, 8192, 28672 // 4), (4096, 6144, 4096), (4096, 28672, 4096),
              (8192, 8192, 8192)]
    print("GEMM (m=tokens, n=out, k=in): bf16 TFLOP/s, fraction of peak; fp8 (torch._scaled_mm)")
    bf16_fr, fp8_fr = [], []
    for m, n, k in shapes:
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        t = timed(lambda a=a, b=b: a @ b.t(), args.seconds)
        tf = 2 * m * n * k / t / 1e12
        bf16_fr.append(tf / args.peak_bf16)
        line = f"  {m:5d} x {n:5d} x {k:5d}: bf16 {tf:6.0f} ({tf / args.peak_bf16:.2f})"
        try:
            a8 = a.to(torch.float8_e4m3fn)
            b8 = b.to(torch.float8_e4m3fn)
            one = torch.ones((), device=dev)
            t8 = timed(lambda a8=a8, b8=b8, one=one: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one,
                                                               out_dtype=torch.bfloat16), args.seconds)
            tf8 = 2 * m * n * k / t8 / 1e12
            fp8_fr.append(tf8 / args.peak_fp8)
            line += f"   fp8 {tf8:6.0f} ({tf8 / args.peak_fp8:.2f})"
        except Exception as exc:  # no FP8 units or no _scaled_mm
            line += f"   fp8 n/a ({type(exc).__name__})"
        print(line)
    print(f"GEMM median fraction of peak: bf16 {statistics.median(bf16_fr):.3f}"
          + (f", fp8 {statistics.median(fp8_fr):.3f}" if fp8_fr else ""))
    print("causal attention (SDPA), head dim 128: forward / backward TFLOP/s and fraction of bf16 peak")
    fw, bw = [], []
    for b, h, s in [(1, 32, 4096), (1, 64, 8192), (2, 24, 2048), (1, 96 // 8, 4096)]:
        q, k, v = (
            torch.randn(b, h, s, 128, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
        )
        flops = 4.0 * b * h * s * s * 128 * 0.5
        fwd = timed(
            lambda q=q, k=k, v=v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
            args.seconds,
        )
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        g = torch.randn_like(out)

        def both(q=q, k=k, v=v, g=g):
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.autograd.grad(o, (q, k, v), g)

        tot = timed(both, args.seconds)
        bwd = max(tot - fwd, 1e-9)
        fw.append(flops / fwd / 1e12 / args.peak_bf16)
        bw.append(2.5 * flops / bwd / 1e12 / args.peak_bf16)
        print(f"  b={b} heads={h} s={s}: fwd {flops / fwd / 1e12:5.0f} ({fw[-1]:.2f})  "
              f"bwd {2.5 * flops / bwd / 1e12:5.0f} ({bw[-1]:.2f})")
    print(
        f"attention median fraction of peak: fwd {statistics.median(fw):.3f}, bwd {statistics.median(bw):.3f}"
    )


if __name__ == "__main__":
    main()
