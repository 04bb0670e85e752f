"""How much the engine costs over plain PyTorch on this machine (figures for issue 5).

1. one process: engine step time / plain PyTorch step time for the same GPT (target <= 1.05);
2. four ranks, G_data=4: engine step time / torch DDP step time (target <= 1.10);
3. four ranks, G_data=4: the engine with its data all-reduce overlapped with backward (buckets of
   2 MiB launched from post-accumulate-grad hooks) / the same engine reducing the same 2 MiB
   buckets after backward (target <= 1.0: overlap must not be slower; on a GPU it must be faster).
   On a 2-core machine with 4 ranks there is no idle core for gloo's threads, so this figure
   swings with the machine's load (see docs/engine.md).
4. four ranks, G_intra_d=2 x G_intra_r=2: the engine with depth prefetch (each layer launches the
   next layer's weight all-gather asynchronously; engine.prefetch_depth) / the same engine gathering
   each weight when it is used (printed, no target: on a 2-core CPU machine gloo's threads have no
   idle core to run on, so the overlap shows on GPUs).

A step is zero_grad + forward + backward + gradient sync + AdamW step. Both sides of a ratio run in
the same processes, alternating step by step (and which goes first) so that load from other work
on the machine hits them alike; each figure is the ratio of medians over the timed steps (after
warm-up). The one-process figure is also given in process CPU time, which other jobs on a shared
machine disturb far less than wall time.
Run:

    OMP_NUM_THREADS=1 .venv/bin/python bench/engine_overhead.py [--steps 30] [--only 1|2|3|4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist

from engine.launch import launch
from engine.models.gpt import GPT, GPTConfig

SINGLE = GPTConfig(num_layers=4, hidden_size=256, num_attention_heads=8, seq_length=128, vocab_size=1024)
SINGLE_BATCH = 8
DATA4 = GPTConfig(num_layers=2, hidden_size=128, num_attention_heads=4, seq_length=64, vocab_size=512)
DATA4_BATCH = 16  # global: 4 samples per rank


def _data(cfg: GPTConfig, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, cfg.vocab_size, (batch, cfg.seq_length), generator=g),
            torch.randint(0, cfg.vocab_size, (batch, cfg.seq_length), generator=g))


def _timed(fn: Any, barrier: bool, clock: Any = time.perf_counter) -> float:
    if barrier:
        dist.barrier()
    t0 = clock()
    fn()
    return clock() - t0


def _single(rank: int, world: int, steps: int, warmup: int) -> dict[str, float]:
    import engine

    grid = engine.init()
    torch.manual_seed(0)
    plain = GPT(SINGLE)
    torch.manual_seed(0)
    model = engine.ParallelGPT.from_serial(GPT(SINGLE), grid)
    opt_p = torch.optim.AdamW(plain.parameters(), lr=1e-4)
    opt_e = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = _data(SINGLE, SINGLE_BATCH)

    def plain_step() -> None:
        opt_p.zero_grad()
        plain(x, y).backward()
        opt_p.step()

    def engine_step() -> None:
        opt_e.zero_grad()
        engine.forward_backward(model, x, y)
        engine.sync_gradients(model, grid=grid)
        opt_e.step()

    out = {}
    for label, clock in (("", time.perf_counter), ("cpu_", time.process_time)):
        t_plain, t_engine = [], []
        for i in range(warmup + steps):
            if i % 2:  # alternate which side goes first, so order effects cancel
                b, a = _timed(engine_step, False, clock), _timed(plain_step, False, clock)
            else:
                a, b = _timed(plain_step, False, clock), _timed(engine_step, False, clock)
            if i >= warmup:
                t_plain.append(a)
                t_engine.append(b)
        out[f"{label}plain_s"] = statistics.median(t_plain)
        out[f"{label}engine_s"] = statistics.median(t_engine)
    return out


def _data4(rank: int, world: int, steps: int, warmup: int) -> dict[str, float]:
    from torch.nn.parallel import DistributedDataParallel

    import engine

    grid = engine.init(G_data=world)
    torch.manual_seed(0)
    ddp = DistributedDataParallel(GPT(DATA4))
    torch.manual_seed(0)
    model = engine.ParallelGPT.from_serial(GPT(DATA4), grid)
    opt_d = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    opt_e = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = _data(DATA4, DATA4_BATCH)
    local = DATA4_BATCH // world
    x, y = x[rank * local:(rank + 1) * local], y[rank * local:(rank + 1) * local]

    def ddp_step() -> None:
        opt_d.zero_grad()
        ddp(x, y).backward()
        opt_d.step()

    def engine_step() -> None:
        opt_e.zero_grad()
        engine.forward_backward(model, x, y)
        engine.sync_gradients(model, grid=grid)
        opt_e.step()

    t_ddp, t_engine = [], []
    for i in range(warmup + steps):
        if i % 2:
            b, a = _timed(engine_step, True), _timed(ddp_step, True)
        else:
            a, b = _timed(ddp_step, True), _timed(engine_step, True)
        if i >= warmup:
            t_ddp.append(a)
            t_engine.append(b)
    return {"ddp_s": statistics.median(t_ddp), "engine_s": statistics.median(t_engine)}


OVERLAP4 = GPTConfig(num_layers=4, hidden_size=256, num_attention_heads=8, seq_length=64, vocab_size=1024)
OVERLAP_BUCKET_BYTES = 2 * 1024 * 1024


def _overlap4(rank: int, world: int, steps: int, warmup: int) -> dict[str, float]:
    import engine
    from engine.grads import install_overlap

    grid = engine.init(G_data=world)
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(engine.ParallelGPT.from_serial(GPT(OVERLAP4), grid))
    overlapped, after = models
    install_overlap(overlapped, grid, bucket_bytes=OVERLAP_BUCKET_BYTES)
    engine.overlap_grad_reduce(after, False)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-4) for m in models]
    x, y = _data(OVERLAP4, DATA4_BATCH)
    local = DATA4_BATCH // world
    x, y = x[rank * local:(rank + 1) * local], y[rank * local:(rank + 1) * local]

    def step_of(model: Any, opt: Any) -> Any:
        def run() -> None:  # the same 2 MiB buckets on both sides: only the launch time differs
            opt.zero_grad()
            engine.forward_backward(model, x, y)
            engine.sync_gradients(model, grid=grid, bucket_bytes=OVERLAP_BUCKET_BYTES)
            opt.step()
        return run

    after_s, overlap_s = _alternating_medians(step_of(after, opts[1]), step_of(overlapped, opts[0]),
                                              steps, warmup)
    return {"after_s": after_s, "overlap_s": overlap_s}


def _alternating_medians(base: Any, other: Any, steps: int, warmup: int) -> tuple[float, float]:
    """Median seconds of two step functions run in alternating order (so that neither always runs
    first after the other's collectives), after `warmup` untimed pairs."""
    t_base, t_other = [], []
    for i in range(warmup + steps):
        if i % 2:
            b, a = _timed(other, True), _timed(base, True)
        else:
            a, b = _timed(base, True), _timed(other, True)
        if i >= warmup:
            t_base.append(a)
            t_other.append(b)
    return statistics.median(t_base), statistics.median(t_other)


def _depth4(rank: int, world: int, steps: int, warmup: int) -> dict[str, float]:
    import engine

    grid = engine.init(G_intra_d=2, G_intra_r=2)
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(engine.ParallelGPT.from_serial(GPT(OVERLAP4), grid))
    prefetched, plain = models
    engine.prefetch_depth(plain, False)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-4) for m in models]
    x, y = _data(OVERLAP4, DATA4_BATCH)
    local = DATA4_BATCH // grid.batch_shards
    shard = grid.coord("depth")
    x, y = x[shard * local:(shard + 1) * local], y[shard * local:(shard + 1) * local]

    def step_of(model: Any, opt: Any) -> Any:
        def run() -> None:
            opt.zero_grad()
            engine.forward_backward(model, x, y)
            engine.sync_gradients(model, grid=grid)
            opt.step()
        return run

    plain_s, prefetch_s = _alternating_medians(step_of(plain, opts[1]), step_of(prefetched, opts[0]),
                                               steps, warmup)
    return {"plain_s": plain_s, "prefetch_s": prefetch_s}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--only", type=int, choices=(1, 2, 3, 4), help="run only this figure")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.only in (None, 1):
        _print_single(args)
    if args.only in (None, 2):
        _print_data4(args)
    if args.only in (None, 3):
        _print_overlap4(args)
    if args.only in (None, 4):
        _print_depth4(args)


def _print_single(args: argparse.Namespace) -> None:
    one = launch(_single, world_size=1, args=(args.steps, args.warmup), timeout_s=600)[0]
    print(f"1 process, GPT {SINGLE.num_layers}x{SINGLE.hidden_size} seq {SINGLE.seq_length} "
          f"batch {SINGLE_BATCH}: plain {one['plain_s'] * 1e3:.1f} ms, "
          f"engine {one['engine_s'] * 1e3:.1f} ms, "
          f"engine/plain = {one['engine_s'] / one['plain_s']:.3f} (target <= 1.05); process CPU time: plain "
          f"{one['cpu_plain_s'] * 1e3:.1f} ms, engine {one['cpu_engine_s'] * 1e3:.1f} ms, "
          f"engine/plain = {one['cpu_engine_s'] / one['cpu_plain_s']:.3f}")


def _four_ranks(fn: Callable[[int, int, int, int], dict[str, float]], args: argparse.Namespace, num: str,
                den: str) -> tuple[dict[str, float], float]:
    """Run `fn` on 4 ranks: (rank 0's timings, median over ranks of timing `num` / timing `den`)."""
    rows = launch(fn, world_size=4, args=(args.steps, args.warmup), timeout_s=600)
    return rows[0], statistics.median(r[num] / r[den] for r in rows)


def _print_data4(args: argparse.Namespace) -> None:
    r0, ratio = _four_ranks(_data4, args, "engine_s", "ddp_s")
    print(f"4 ranks G_data=4, GPT {DATA4.num_layers}x{DATA4.hidden_size} seq {DATA4.seq_length} global batch "
          f"{DATA4_BATCH}: DDP {r0['ddp_s'] * 1e3:.1f} ms, engine {r0['engine_s'] * 1e3:.1f} ms (rank 0), "
          f"engine/DDP = {ratio:.3f} (median over ranks; target <= 1.10)")


def _print_overlap4(args: argparse.Namespace) -> None:
    r0, ratio = _four_ranks(_overlap4, args, "overlap_s", "after_s")
    print(f"4 ranks G_data=4, GPT {OVERLAP4.num_layers}x{OVERLAP4.hidden_size} seq {OVERLAP4.seq_length} "
          f"global batch {DATA4_BATCH}, {OVERLAP_BUCKET_BYTES >> 20} MiB buckets: reduce after backward "
          f"{r0['after_s'] * 1e3:.1f} ms, overlapped {r0['overlap_s'] * 1e3:.1f} ms (rank 0), "
          f"overlapped/after = {ratio:.3f} (median over ranks; target <= 1.0)")


def _print_depth4(args: argparse.Namespace) -> None:
    r0, ratio = _four_ranks(_depth4, args, "prefetch_s", "plain_s")
    print(f"4 ranks G_intra_d=2 x G_intra_r=2, GPT {OVERLAP4.num_layers}x{OVERLAP4.hidden_size} seq "
          f"{OVERLAP4.seq_length} global batch {DATA4_BATCH}: depth gathers on use "
          f"{r0['plain_s'] * 1e3:.1f} ms, "
          f"prefetched {r0['prefetch_s'] * 1e3:.1f} ms (rank 0), prefetch/no prefetch = "
          f"{ratio:.3f} (median over ranks)")


if __name__ == "__main__":
    main()
