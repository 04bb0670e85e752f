"""The GPU figures of scripts/gpu_check.sh; prints tables and writes JSON.

    PYTHONPATH=. python3 bench/gpu_check.py gpt1b   [--out DIR]   # ~1B GPT, bf16, engine.train on 1 GPU
    PYTHONPATH=. python3 bench/gpu_check.py layouts [--out DIR]   # one rank of >= 10 layouts, fake PG

Why: the engine's GPU path (NCCL, CUDA-event timing, bf16 autocast, memory stats) and the
performance model's memory and compute predictions need a GPU to be checked at all.

- `gpt1b`: the built-in GPT (20 layers, hidden 2048, seq 1024, vocab 50304: 1.1 B parameters)
  trained by engine.train on NCCL, one rank, bf16 autocast; step time (CUDA-synchronized), MFU
  against the GPU's bf16 peak, and the TrainReport's peak allocated/reserved memory.
- `layouts`: one rank of larger grids on this one GPU with torch's fake process group (its
  collectives are no-ops, so compute and memory are real and communication is not). For each
  layout (G_intra_r, G_intra_c, G_intra_d, micro-batch, recompute, G_data) it measures the peak
  memory (CUDA caching allocator, plus the context's memory outside it) and the forward+backward
  time, and compares them with `perfmodels.predict` under the engine's own Training options
  (`tuner.closed_loop.engine_training(dtype="bf16")`) on an H100 cluster preset. Targets:
  memory within 10%, compute within 15%. The same GPT in plain PyTorch (no engine) is timed too,
  so a gap can be told apart: the engine's own overhead (engine 1 rank vs plain) or the model's.
- `summary-gpt1b` / `summary-layouts`: the table rows gpu_check.sh prints from the JSON files.
(`gridtune profile` on the GPU is run by scripts/gpu_check.sh itself: `python3 -m cli profile`
imports none of the service stack.)

Needs only torch, numpy, scipy, pandas, rich (no fastapi/pydantic/sqlalchemy/httpx).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GIB = 2**30


@dataclass(frozen=True, kw_only=True)
class Layout:
    G_data: int = 1
    G_intra_d: int = 1
    G_intra_r: int = 1
    G_intra_c: int = 1
    micro_batch_size: int = 1
    recompute: str = "none"

    @property
    def world(self) -> int:
        return self.G_data * self.G_intra_d * self.G_intra_r * self.G_intra_c

    def label(self) -> str:
        return (f"d{self.G_data} z{self.G_intra_d} r{self.G_intra_r} c{self.G_intra_c} "
                f"mb{self.micro_batch_size} {self.recompute}")


LAYOUTS = (
    Layout(micro_batch_size=1),
    Layout(G_intra_r=2, micro_batch_size=2),
    Layout(G_intra_c=2, micro_batch_size=2),
    Layout(G_intra_r=2, G_intra_c=2, micro_batch_size=4),
    Layout(G_intra_r=4, micro_batch_size=4, recompute="full"),
    Layout(G_intra_c=4, micro_batch_size=2, recompute="full"),
    Layout(G_intra_d=2, G_intra_r=2, G_intra_c=2, micro_batch_size=2),
    Layout(G_intra_d=4, micro_batch_size=2),
    Layout(G_intra_r=4, G_intra_c=2, micro_batch_size=8, recompute="full"),
    Layout(G_intra_d=2, G_intra_r=2, G_intra_c=4, micro_batch_size=4),
    Layout(G_intra_r=8, micro_batch_size=8),
    Layout(G_data=4, G_intra_r=2, G_intra_c=2, micro_batch_size=4, recompute="full"),
)


def _gpt_layouts_config() -> Any:
    from engine.models.gpt import GPTConfig

    return GPTConfig(
        num_layers=4, hidden_size=4096, num_attention_heads=32, seq_length=2048, vocab_size=50304
    )


def _sync() -> None:
    import torch

    torch.cuda.synchronize()


def _measure_layout(layout: Layout, steps: int, warmup: int, trace: bool = False) -> dict[str, Any]:
    """One rank (rank 0) of `layout` on this GPU with the fake process group."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import engine

    cfg = _gpt_layouts_config()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=layout.world)
    try:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        grid = engine.init(G_data=layout.G_data, G_intra_d=layout.G_intra_d, G_intra_r=layout.G_intra_r,
                           G_intra_c=layout.G_intra_c, device="cuda")
        torch.manual_seed(0)
        model = engine.ParallelGPT(cfg, grid, recompute=layout.recompute == "full", init="local")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        mb = layout.micro_batch_size
        tokens = torch.randint(0, cfg.vocab_size, (mb, cfg.seq_length), device=grid.device)
        fwd_bwd, opt_s, host = [], [], []
        for i in range(warmup + steps):
            opt.zero_grad(set_to_none=True)
            _sync()
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                model(tokens, tokens).backward()  # one micro-batch; nothing reads the loss back
            t_issued = time.perf_counter()  # the host has issued every kernel
            _sync()
            t1 = time.perf_counter()
            if i >= warmup:
                host.append(t_issued - t0)
            engine.step(model, opt)
            _sync()
            t2 = time.perf_counter()
            if i >= warmup:
                fwd_bwd.append(t1 - t0)
                opt_s.append(t2 - t1)
        if trace:  # where one forward+backward's GPU time goes (kernels by total CUDA time)
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    engine.forward_backward(model, tokens, tokens)
                _sync()
            print(
                prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60)
            )
        free, total = torch.cuda.mem_get_info()
        outside = max(0, (total - free) - torch.cuda.memory_reserved())  # CUDA context, cuBLAS workspaces
        measured = {
            "peak_allocated_gib": (torch.cuda.max_memory_allocated() - base) / GIB,
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / GIB,
            "outside_allocator_gib": outside / GIB,
            "fwd_bwd_s": statistics.median(fwd_bwd),
            "host_issue_s": statistics.median(host),
            "optimizer_s": statistics.median(opt_s),
            "params_local": sum(p.numel() for p in model.parameters()),
        }
        del model, opt, tokens
    finally:
        dist.destroy_process_group()
        gc.collect()
        torch.cuda.empty_cache()
    return measured


def _measure_plain(steps: int, warmup: int) -> dict[str, float]:
    """The same GPT in plain PyTorch (engine.models.gpt.GPT, no grid, no engine), micro-batch 1: what
    the engine's one-rank layout costs on top of it, separately from what the model predicts."""
    import torch

    from engine.models.gpt import GPT

    cfg = _gpt_layouts_config()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    with torch.device("cuda"):
        model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    tokens = torch.randint(0, cfg.vocab_size, (1, cfg.seq_length), device="cuda")
    times = []
    for i in range(warmup + steps):
        opt.zero_grad(set_to_none=True)
        _sync()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            model(tokens, tokens).backward()
        _sync()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        opt.step()
    out = {
        "fwd_bwd_s": statistics.median(times),
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / GIB,
    }
    del model, opt
    gc.collect()
    torch.cuda.empty_cache()
    return out


def _predict_layout(layout: Layout) -> dict[str, float]:
    from perfmodels.specs import Plan
    from perfmodels.steptime import predict
    from tuner.closed_loop import engine_training

    cfg = _gpt_layouts_config()
    plan = Plan(
        G_data=layout.G_data,
        G_intra_d=layout.G_intra_d,
        G_intra_r=layout.G_intra_r,
        G_intra_c=layout.G_intra_c,
        micro_batch_size=layout.micro_batch_size,
        recompute=layout.recompute,
    )
    gbs = layout.G_data * layout.G_intra_d * layout.micro_batch_size
    pred = predict(cfg.to_spec(), h100_cluster(layout.world), engine_training(gbs, dtype="bf16"), plan)
    mem, br = pred.memory, pred.breakdown
    return {"memory_gib": mem.per_gpu_gib - mem.comm_buffers_gib,  # the fake group allocates no NCCL buffers
            "states_acts_gib": mem.params_gib + mem.grads_gib + mem.optimizer_gib + mem.activations_gib,
            "compute_s": br.compute_s + br.host_wait_s, "optimizer_s": br.optimizer_s}


def h100_cluster(world: int) -> Any:
    """DGX H100 nodes (the eos preset) holding `world` GPUs; only the GPU matters for these figures."""
    import dataclasses

    from perfmodels import presets

    base = presets.cluster("eos")
    per_node = min(base.gpus_per_node, world)
    return dataclasses.replace(base, num_gpus=world, gpus_per_node=per_node)


def layouts(out: Path, steps: int = 3, warmup: int = 2, trace: int | None = None) -> list[dict[str, Any]]:
    from rich.console import Console
    from rich.table import Table

    plain = _measure_plain(steps, warmup)
    print(
        f"plain PyTorch GPT (no engine), micro-batch 1: fwd+bwd {plain['fwd_bwd_s'] * 1e3:.1f} ms, peak "
        "allocated "
        f"{plain['peak_allocated_gib']:.2f} GiB",
        flush=True,
    )
    (out / "plain.json").write_text(json.dumps(plain))
    rows = []
    for i, layout in enumerate(LAYOUTS):
        meas = _measure_layout(layout, steps, warmup, trace=trace == i)
        pred = _predict_layout(layout)
        meas_mem = meas["peak_reserved_gib"] + meas["outside_allocator_gib"]
        row = {
            "layout": layout.label(),
            **asdict(layout),
            "measured": meas,
            "predicted": pred,
            "memory_ratio": pred["memory_gib"] / meas_mem,
            "compute_ratio": pred["compute_s"] / meas["fwd_bwd_s"],
        }
        rows.append(row)
        print(f"{layout.label():28s} memory pred {pred['memory_gib']:.2f} / meas {meas_mem:.2f} GiB "
              f"(allocated {meas['peak_allocated_gib']:.2f}); fwd+bwd pred {pred['compute_s'] * 1e3:.1f} / "
              f"meas {meas['fwd_bwd_s'] * 1e3:.1f} ms (host issued its last op at "
              f"{meas['host_issue_s'] * 1e3:.1f} ms)", flush=True)
    table = Table(title="one rank of each layout on this GPU (fake process group), GPT 4x4096 seq 2048, bf16")
    for col in (
        "layout",
        "mem pred GiB",
        "mem meas GiB",
        "pred/meas",
        "fwd+bwd pred ms",
        "meas ms",
        "pred/meas",
        "host issue ms",
    ):
        table.add_column(col, justify="left" if col == "layout" else "right")
    for r in rows:
        meas_mem = r["measured"]["peak_reserved_gib"] + r["measured"]["outside_allocator_gib"]
        table.add_row(
            r["layout"],
            f"{r['predicted']['memory_gib']:.2f}",
            f"{meas_mem:.2f}",
            f"{r['memory_ratio']:.2f}",
            f"{r['predicted']['compute_s'] * 1e3:.1f}",
            f"{r['measured']['fwd_bwd_s'] * 1e3:.1f}",
            f"{r['compute_ratio']:.2f}",
            f"{r['measured']['host_issue_s'] * 1e3:.1f}",
        )
    Console(width=140).print(table)
    (out / "layouts.json").write_text(json.dumps(rows, indent=1))
    return rows


def _train_1b(rank: int, world: int) -> Any:
    import torch

    from engine.models.gpt import GPTConfig
    from engine.train import TokenWindows, train
    from perfmodels.specs import Plan

    cfg = GPTConfig(
        num_layers=20, hidden_size=2048, num_attention_heads=16, seq_length=1024, vocab_size=50304
    )
    # counting runs (start, start+1, ...) mod vocab with random restarts: a learnable next token
    g = torch.Generator().manual_seed(0)
    starts = torch.randint(0, cfg.vocab_size, (200,), generator=g)
    runs = (starts[:, None] + torch.arange(1000)[None, :]) % cfg.vocab_size
    data = TokenWindows(runs.reshape(-1), cfg.seq_length)
    cluster = h100_cluster(1)
    report = train(
        cfg,
        data,
        8,
        12,
        plan=Plan(micro_batch_size=4),
        warmup_steps=4,
        cluster=cluster,
        record=False,
        use_calibrated=False,
        progress=False,
        dtype="bf16",
        init="local",
        max_grad_norm=1.0,
        optimizer=lambda params: torch.optim.AdamW(params, lr=3e-4, weight_decay=0.01),
    )
    return report, cfg


def gpt1b(out: Path) -> dict[str, Any]:
    from engine.launch import launch
    from perfmodels import presets
    from perfmodels.compute import model_flops_per_token

    report, cfg = launch(_train_1b, 1, backend="nccl", timeout_s=900)[0]
    spec = cfg.to_spec()
    params = spec.num_params
    tokens = 8 * cfg.seq_length
    flops = 3.0 * model_flops_per_token(spec) * tokens
    peak = presets.gpu("H100-SXM").peak_tflops("bf16") * 1e12
    mem = report.memory[0]
    result = {
        "params": params,
        "step_s": report.median_step_time_s,
        "mfu": flops / report.median_step_time_s / peak,
        "tokens_per_s": report.tokens_per_s,
        "peak_allocated_gib": mem.peak_allocated_bytes / GIB,
        "peak_reserved_gib": mem.peak_reserved_bytes / GIB,
        "loss_first": report.losses[0],
        "loss_last": report.losses[-1],
        "predicted_step_s": report.predicted_step_time_s,
        "predicted_memory_gib": report.prediction.memory.per_gpu_gib if report.prediction else None,
        "compute_s": report.measured["compute_s"],
    }
    print(
        f"GPT {cfg.num_layers}x{cfg.hidden_size} ({params / 1e9:.2f} B params), bf16, 1 GPU, batch "
        f"8x{cfg.seq_length}: "
        f"step {result['step_s'] * 1e3:.1f} ms (predicted {(result['predicted_step_s'] or 0) * 1e3:.1f}), "
        f"MFU {result['mfu']:.1%}, peak allocated {result['peak_allocated_gib']:.1f} GiB, reserved "
        f"{result['peak_reserved_gib']:.1f} GiB (predicted {result['predicted_memory_gib']:.1f}), loss "
        f"{result['loss_first']:.2f} -> {result['loss_last']:.2f}",
        flush=True,
    )
    (out / "gpt1b.json").write_text(json.dumps(result, indent=1))
    return result


def summary_rows(out: Path, what: str) -> list[str]:
    """The table rows "check|result|target|status" of scripts/gpu_check.sh for `what`'s JSON."""
    if what == "gpt1b":
        r = json.loads((out / "gpt1b.json").read_text())
        ok = r["loss_last"] < r["loss_first"] and r["mfu"] > 0.2
        return [
            f"GPT {r['params'] / 1e9:.2f}B bf16, 1 GPU (engine.train)|step {r['step_s'] * 1e3:.0f} ms, MFU "
            f"{r['mfu']:.1%}, peak alloc {r['peak_allocated_gib']:.1f} / reserved "
            f"{r['peak_reserved_gib']:.1f} GiB, "
            f"loss {r['loss_first']:.2f}->{r['loss_last']:.2f}|trains, MFU > 20%|{'ok' if ok else 'FAIL'}"
        ]
    rows = json.loads((out / "layouts.json").read_text())
    mem = [r["memory_ratio"] for r in rows]
    comp = [r["compute_ratio"] for r in rows]
    mi = sum(abs(x - 1) <= 0.10 for x in mem)
    ci = sum(abs(x - 1) <= 0.15 for x in comp)
    n = len(rows)
    plain = json.loads((out / "plain.json").read_text())
    one = rows[0]["measured"]
    ratio = one["fwd_bwd_s"] / plain["fwd_bwd_s"]
    return [
        f"memory pred/meas, {n} layouts|{mi}/{n} within 10% (ratios {min(mem):.2f}-{max(mem):.2f})|all "
        "within 10%|"
        + ("ok" if mi == n else "MISS"),
        f"fwd+bwd time pred/meas, {n} layouts|{ci}/{n} within 15% (ratios {min(comp):.2f}-{max(comp):.2f})|"
        "all within 15%|" + ("ok" if ci == n else "MISS"),
        f"engine 1 rank vs plain PyTorch (fwd+bwd)|{one['fwd_bwd_s'] * 1e3:.1f} / "
        f"{plain['fwd_bwd_s'] * 1e3:.1f} ms = "
        f"{ratio:.2f}; alloc {one['peak_allocated_gib']:.1f} / {plain['peak_allocated_gib']:.1f} GiB|<= 1.05|"
        + ("ok" if ratio <= 1.05 else "MISS"),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("gpt1b", "layouts", "summary-gpt1b", "summary-layouts"))
    parser.add_argument("--out", default=".")
    parser.add_argument(
        "--trace", type=int, default=None, help="layouts: print a kernel profile of layout #N"
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.what.startswith("summary-"):
        print("\n".join(summary_rows(out, args.what.removeprefix("summary-"))))
    elif args.what == "layouts":
        layouts(out, trace=args.trace)
    else:
        gpt1b(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
