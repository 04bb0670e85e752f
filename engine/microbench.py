"""Collective, GEMM and memory-bandwidth microbenchmarks on torch.distributed (gloo/CPU or NCCL/GPU).

Why: `gridtune profile` fits the performance model's constants to what the user's cluster really
does. This module measures; `perfmodels.fitting` fits; `tuner.profiles` stores.

What is measured, on every rank at once (as in training, where every group talks concurrently):
- collectives (all-reduce, all-gather, reduce-scatter, all-to-all, send/recv, optionally broadcast)
  over geometric message sizes, for every group size dividing the world and every placement the
  layouts use: inside a node, and across nodes with q = 1..gpus_per_node members of each node
  (groups built with `perfmodels.layout.all_groups`, so levels follow the model's definition);
- GEMMs over shapes that vary one dimension at a time (so the efficiency curve is identifiable);
- a large copy (memory bandwidth; bytes counted = read + written).

How: warm-up, then `trials` timed trials of `iters` back-to-back operations each (iters chosen
from the warm-up so a trial lasts about `target_trial_s`, agreed by all ranks); each trial is
fenced by a barrier and its time is the average over ranks (as nccl-tests reports it; a maximum
over ranks mostly adds the scheduler noise of the unluckiest rank).
Rank 0 returns tidy rows (one per trial); the fit takes medians.

    from engine.launch import launch
    from engine.microbench import SweepConfig, run_profile
    out = launch(run_profile, 4, args=(SweepConfig.make(quick=True),))[0]   # rows + provenance

Under torchrun/srun call `run_in_place(config)` on every rank instead.
"""

from __future__ import annotations

import datetime
import os
import platform
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from perfmodels.fitting import COPY_OP, GEMM_OP, message_sizes
from perfmodels.layout import all_groups

DEFAULT_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
ALL_OPS = (*DEFAULT_OPS, "broadcast")


def default_gemm_shapes(scale: int = 1, quick: bool = False) -> tuple[tuple[int, int, int], ...]:
    """Cubes plus skinny shapes (one small dimension at a time), times `scale` (8 on GPUs)."""
    cubes = (64, 128, 256, 512) if quick else (64, 128, 256, 512, 1024)
    big = 512 if quick else 1024
    shapes = [(c, c, c) for c in cubes]
    for small in (16, 64):
        shapes += [(small, big, big), (big, small, big), (big, big, small)]
    shapes.append((4 * big, big // 4, big // 2))
    return tuple((m * scale, n * scale, k * scale) for m, n, k in shapes)


def model_gemm_shapes(model: Any, *, tokens: int | None = None,
                      splits: Sequence[int] = (1, 2, 4, 8)) -> tuple[tuple[int, int, int], ...]:
    """(m, n, k) GEMMs of a transformer's Linear layers as tensor parallelism shards them.

    For every split t that divides a layer's features: the forward GEMM with the output features
    split (column-parallel) or the input features split (row-parallel), m = `tokens` (default: the
    model's sequence length, one micro-batch), and the weight-gradient GEMM of the same shard
    (m, n, k) = (out, in, tokens). Fused QKV (with GQA's smaller K/V) and SwiGLU's fused up/gate
    projection are single GEMMs, as most frameworks run them.
    """
    h, f = int(model.hidden_size), int(model.ffn_hidden_size)
    kv = int(model.kv_hidden_size)
    tokens = int(tokens or model.seq_length)
    if tokens < 1:
        raise ValueError(f"tokens must be >= 1, got {tokens}")
    layers = [(h + 2 * kv, h), (h, h), ((2 if model.gated_mlp else 1) * f, h), (h, f)]  # (out, in)
    shapes: set[tuple[int, int, int]] = set()
    for t in splits:
        for n_out, k_in in layers:
            for n, k, ok in ((n_out // t, k_in, n_out % t == 0), (n_out, k_in // t, k_in % t == 0)):
                if ok and n > 0 and k > 0:
                    shapes.add((tokens, n, k))
                    shapes.add((n, k, tokens))
    return tuple(sorted(shapes))


@dataclass(frozen=True, kw_only=True)
class SweepConfig:
    """What to measure. `SweepConfig.make(quick=..., max_bytes=..., device=...)` picks defaults."""

    ops: tuple[str, ...] = DEFAULT_OPS
    min_bytes: int = 4096
    max_bytes: int = 4 << 20
    size_factor: float = 2.0
    group_sizes: tuple[int, ...] | None = None
    warmup: int = 3
    trials: int = 7
    target_trial_s: float = 0.01
    max_iters: int = 64
    gemm_shapes: tuple[tuple[int, int, int], ...] = field(default_factory=default_gemm_shapes)
    gemm_dtype: str = "float32"
    copy_bytes: tuple[int, ...] = (4 << 20, 16 << 20, 64 << 20)
    gpus_per_node: int | None = None
    pin_cpus: bool = False
    """Pin rank r to core r (gloo). Off by default: on this 2-core machine pinned ranks waited a
    scheduler tick (~4 ms) on 33-39% of small collectives against 3-7% unpinned."""
    progress: bool = True

    @staticmethod
    def make(*, quick: bool = False, max_bytes: int | None = None, device: str = "cpu",
             gpus_per_node: int | None = None, ops: Sequence[str] | None = None,
             gemm_shapes: Sequence[tuple[int, int, int]] | None = None, progress: bool = True) -> SweepConfig:
        gpu = device.startswith("cuda")
        if gpu:
            cfg = SweepConfig(min_bytes=8 << 10, max_bytes=(256 << 20) if quick else (1 << 30),
                              gemm_shapes=default_gemm_shapes(8, quick), gemm_dtype="bfloat16",
                              copy_bytes=(256 << 20, 1 << 30), trials=5 if quick else 10,
                              target_trial_s=0.005)
        elif quick:
            cfg = SweepConfig(max_bytes=4 << 20, trials=7, warmup=2, gemm_shapes=default_gemm_shapes(1, True),
                              copy_bytes=(4 << 20, 16 << 20), target_trial_s=0.01, max_iters=32)
        else:
            cfg = SweepConfig(max_bytes=16 << 20)
        if max_bytes is not None:
            if max_bytes < cfg.min_bytes:
                raise ValueError(f"--max-bytes={max_bytes} is below the smallest message ({cfg.min_bytes} B)")
            cfg = replace(cfg, max_bytes=int(max_bytes))
        if ops is not None:
            bad = sorted(set(ops) - set(ALL_OPS))
            if bad:
                raise ValueError(f"unknown collective(s) {bad}; known: {list(ALL_OPS)}")
            cfg = replace(cfg, ops=tuple(ops))
        if gemm_shapes is not None:
            cfg = replace(cfg, gemm_shapes=tuple(tuple(int(d) for d in s) for s in gemm_shapes))
        return replace(cfg, gpus_per_node=gpus_per_node, progress=progress)


# --------------------------------------------------------------------------------------------
# Which groups to measure (pure; tested without processes)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class GroupSpec:
    """Groups of `size` ranks at rank stride `stride` covering the world, and their link level."""

    size: int
    stride: int
    level: str
    members_per_node: int
    groups: tuple[tuple[int, ...], ...]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def group_level(members: Sequence[int], node_of_rank: Sequence[int]) -> tuple[str, int]:
    """("intra", p) when all members share a node, else ("inter", fewest members on one node)."""
    counts: dict[int, int] = {}
    for r in members:
        counts[node_of_rank[r]] = counts.get(node_of_rank[r], 0) + 1
    if len(counts) == 1:
        return "intra", len(members)
    return "inter", min(counts.values())


def plan_groups(world: int, node_of_rank: Sequence[int],
                group_sizes: Sequence[int] | None = None) -> list[GroupSpec]:
    """One spec per distinct (size, level, members per node), smallest stride first.

    Sizes default to every divisor of the world above 1. For each size, strides 1, 2, ... (that
    divide the rest of the world) place the groups inside a node or across nodes with fewer
    members per node; only the first stride giving a new (level, q) is kept.
    """
    sizes = sorted(set(group_sizes)) if group_sizes else [d for d in _divisors(world) if d > 1]
    specs: list[GroupSpec] = []
    for p in sizes:
        if p < 2 or world % p:
            continue
        seen: set[tuple[str, int]] = set()
        for s in _divisors(world // p):
            degrees = {"col": s, "row": p, "depth": world // (s * p), "inter": 1, "data": 1}
            groups = [tuple(g) for g in all_groups("row", degrees)]
            levels = {group_level(g, node_of_rank) for g in groups}
            key = min(levels, key=lambda lv: (lv[0] == "intra", lv[1]))  # the slowest placement present
            if key in seen:
                continue
            seen.add(key)
            specs.append(GroupSpec(size=p, stride=s, level=key[0], members_per_node=key[1],
                                   groups=tuple(groups)))
    return specs


# --------------------------------------------------------------------------------------------
# Timing on torch.distributed
# --------------------------------------------------------------------------------------------


def _torch_dtype(name: str) -> Any:
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _sync(device: Any) -> None:
    import torch

    if getattr(device, "type", "cpu") == "cuda":
        torch.cuda.synchronize(device)


def _collective_fn(op: str, numel: int, group: Any, members: Sequence[int], rank: int, device: Any,
                   dtype: Any) -> Callable[[], None]:
    """A closure that runs one `op` on `numel` elements of full buffer in `group`."""
    import torch
    import torch.distributed as dist

    p = len(members)
    full = torch.zeros(numel, dtype=dtype, device=device)  # zeros: repeated sums never overflow
    if op == "all_reduce":
        return lambda: dist.all_reduce(full, group=group)
    if op == "all_gather":  # *_single are the 2.13 names of *_into_tensor / *_tensor
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        shard = torch.zeros(numel // p, dtype=dtype, device=device)
        return lambda: gather(full, shard, group=group)
    if op == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        shard = torch.empty(numel // p, dtype=dtype, device=device)
        return lambda: scatter(shard, full, group=group)
    if op == "all_to_all":
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full, group=group)
    if op == "broadcast":
        return lambda: dist.broadcast(full, src=members[0], group=group)
    if op == "send_recv":
        peer = members[1] if rank == members[0] else members[0]
        recv = torch.empty_like(full)

        def exchange() -> None:
            reqs = [dist.isend(full, dst=peer, group=group), dist.irecv(recv, src=peer, group=group)]
            for req in reqs:
                req.wait()

        return exchange
    raise ValueError(f"unknown collective {op!r}")


def _time_sweep(fns: Sequence[Callable[[], None]], config: SweepConfig, device: Any) -> list[list[float]]:
    """Time each closure `config.trials` times; returns [closure][trial] seconds (mean over ranks).

    Trials are interleaved (trial 0 of every size, then trial 1, ...) in a shuffled order shared by
    all ranks, so a slow spell of the machine spreads over all sizes instead of bending the curve
    of a few neighbouring ones. Iterations per trial come from the warm-up (so a trial lasts about
    `target_trial_s`), agreed by all ranks. On GPUs a trial is `iters` back-to-back launches
    divided by `iters` (as nccl-tests does). On CPUs (gloo) each operation is timed on its own and
    the trial keeps the median: with more ranks than cores, some operations wait a scheduler tick
    (~4 ms), and a mean would measure the scheduler rather than the collective.
    """
    import random
    import statistics

    import torch
    import torch.distributed as dist

    on_gpu = getattr(device, "type", "cpu") == "cuda"
    iters = []
    for fn in fns:
        dist.barrier()
        warm = []
        for _ in range(max(config.warmup, 1)):
            t0 = time.perf_counter()
            fn()
            _sync(device)
            warm.append(time.perf_counter() - t0)
        per_call = max(statistics.median(warm), 1e-7)
        iters.append(max(1, min(config.max_iters, int(config.target_trial_s / per_call))))
    agreed = torch.tensor(iters, dtype=torch.int64, device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)  # every rank must run the same number of ops
    iters = [int(v) for v in agreed.cpu().tolist()]
    times = [[0.0] * config.trials for _ in fns]
    order = list(range(len(fns)))
    rng = random.Random(len(fns) * 7919 + config.trials)  # same seed on every rank
    for trial in range(config.trials):
        rng.shuffle(order)
        for i in order:
            fn, n = fns[i], iters[i]
            dist.barrier()
            if on_gpu:
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                _sync(device)
                times[i][trial] = (time.perf_counter() - t0) / n
                continue
            each = []
            for _ in range(n):
                t0 = time.perf_counter()
                fn()
                each.append(time.perf_counter() - t0)
            times[i][trial] = statistics.median(each)
    mean = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(mean, op=dist.ReduceOp.SUM)  # the ranks' average, as nccl-tests reports it
    mean /= dist.get_world_size()
    return [[float(v) for v in row] for row in mean.cpu().tolist()]


def _versions(backend: str) -> tuple[str, str]:
    import torch

    nccl = ""
    if backend == "nccl":
        try:
            nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:  # pragma: no cover - depends on the build
            nccl = "unknown"
    return str(torch.__version__), nccl


def _device_name(device: Any) -> str:
    import torch

    if getattr(device, "type", "cpu") == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def _load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


class _Progress:
    """A rich progress bar on rank 0 (stderr), a no-op elsewhere."""

    def __init__(self, enabled: bool, total: int):
        self._bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("[bold]profile[/] {task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), console=Console(stderr=True),
                                 transient=True)
            self._bar.start()
            self._task = self._bar.add_task("", total=total)

    def step(self, description: str, advance: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(self._task, advance=advance, description=description)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def run_profile(rank: int, world_size: int, config: SweepConfig) -> dict[str, Any] | None:
    """Measure everything on an initialized default process group; rank 0 returns the results.

    Returns {"rows": [dict, ...], "provenance": {...}} on rank 0, None on the others.
    """
    import torch
    import torch.distributed as dist

    backend = dist.get_backend()
    device = _profile_device(rank, backend, config)
    torch_version, nccl_version = _versions(backend)
    load_before = _load_average()
    host = socket.gethostname()
    hosts: list[Any] = [None] * world_size
    dist.all_gather_object(hosts, host)
    unique_hosts = list(dict.fromkeys(hosts))
    emulated = False
    if config.gpus_per_node:
        node_of_rank = [r // config.gpus_per_node for r in range(world_size)]
        emulated = len(unique_hosts) == 1 and config.gpus_per_node < world_size
    else:
        node_of_rank = [unique_hosts.index(h) for h in hosts]
    specs = plan_groups(world_size, node_of_rank, config.group_sizes)
    sizes = message_sizes(config.min_bytes, config.max_bytes, config.size_factor)
    jobs = [(spec, op) for spec in specs for op in config.ops if op != "send_recv" or spec.size == 2]
    total = len(jobs) * len(sizes) + len(config.gemm_shapes) + len(config.copy_bytes)
    bar = _Progress(config.progress and rank == 0, total)
    base = {"host": host, "torch_version": torch_version, "backend": backend, "nccl_version": nccl_version}
    try:
        dtype = torch.float32 if backend != "nccl" else torch.bfloat16
        rows = _collective_rows(rank, specs, jobs, sizes, config, device, dtype, base, bar)
        gemm_dtype = _torch_dtype(config.gemm_dtype) if backend == "nccl" else torch.float32
        rows += _gemm_rows(config, device, gemm_dtype, base, bar)
        rows += _copy_rows(config, device, base, bar)
    finally:
        bar.close()
    if rank != 0:
        return None
    provenance = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hosts": unique_hosts, "torch_version": torch_version, "nccl_version": nccl_version,
        "backend": backend,
        "world_size": world_size, "device": _device_name(device),
        "gpus_per_node": config.gpus_per_node or max(hosts.count(h) for h in unique_hosts),
        "emulated_nodes": emulated, "source": "gridtune profile",
        "load_average_1m": [load_before, _load_average()],  # a busy machine explains noisy fits
    }
    return {"rows": rows, "provenance": provenance}


def _profile_device(rank: int, backend: str, config: SweepConfig) -> Any:
    """This rank's device: its GPU on NCCL; on gloo the CPU, pinned to one core when asked."""
    import torch

    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", rank % max(torch.cuda.device_count(), 1)))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    if config.pin_cpus and hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})  # ranks stop migrating between cores
    return torch.device("cpu")


def _row(op: str, nbytes: int, trial: int, seconds: float, base: dict[str, Any], *, group_size: int = 1,
         level: str = "device", members_per_node: int = 1, m: Any = "", n: Any = "", k: Any = "",
         dtype: Any = "float32") -> dict[str, Any]:
    """One measurement row of the profile (the columns `gridtune profile` writes)."""
    return {"op": op, "bytes": nbytes, "group_size": group_size, "level": level,
            "members_per_node": members_per_node, "trial": trial, "seconds": seconds, **base,
            "m": m, "n": n, "k": k, "dtype": str(dtype).replace("torch.", "")}


def _collective_rows(rank: int, specs: list[GroupSpec], jobs: list[tuple[GroupSpec, str]], sizes: list[int],
                     config: SweepConfig, device: Any, dtype: Any, base: dict[str, Any],
                     bar: _Progress) -> list[dict[str, Any]]:
    """Every collective of `jobs` over every message size, in its group of the plan."""
    import torch
    import torch.distributed as dist

    elem = torch.tensor([], dtype=dtype).element_size()
    rows: list[dict[str, Any]] = []
    groups_of = {}
    for spec in specs:  # every rank creates every subgroup, in the same order
        mine, _ = dist.new_subgroups_by_enumeration([list(g) for g in spec.groups])
        members = next(g for g in spec.groups if rank in g)
        groups_of[(spec.size, spec.stride)] = (mine, members)
    for spec, op in jobs:
        group, members = groups_of[(spec.size, spec.stride)]
        numels = [max(nbytes // (elem * spec.size), 1) * spec.size for nbytes in sizes]
        fns = [_collective_fn(op, numel, group, members, rank, device, dtype) for numel in numels]
        for numel, times in zip(numels, _time_sweep(fns, config, device)):
            rows += [_row(op, numel * elem, trial, secs, base, group_size=spec.size, level=spec.level,
                          members_per_node=spec.members_per_node, dtype=dtype)
                     for trial, secs in enumerate(times)]
        bar.step(f"{op} p={spec.size} {spec.level}", len(sizes))
    return rows


def _gemm_rows(config: SweepConfig, device: Any, dtype: Any, base: dict[str, Any],
               bar: _Progress) -> list[dict[str, Any]]:
    """One matmul per shape of `config.gemm_shapes` (bytes: both inputs and the output)."""
    import torch

    rows: list[dict[str, Any]] = []
    mats = []
    for m, n, k in config.gemm_shapes:
        a = torch.randn(m, k, dtype=dtype, device=device)
        b = torch.randn(k, n, dtype=dtype, device=device)
        mats.append((a, b, torch.empty(m, n, dtype=dtype, device=device)))
    if not mats:
        return rows
    fns = [lambda a=a, b=b, c=c: torch.matmul(a, b, out=c) for a, b, c in mats]
    for (m, n, k), (a, _, _), times in zip(config.gemm_shapes, mats, _time_sweep(fns, config, device)):
        nb = (m * k + k * n + m * n) * a.element_size()
        rows += [_row(GEMM_OP, nb, trial, secs, base, m=m, n=n, k=k, dtype=dtype)
                 for trial, secs in enumerate(times)]
    del mats
    bar.step("gemm", len(config.gemm_shapes))
    return rows


def _copy_rows(config: SweepConfig, device: Any, base: dict[str, Any],
               bar: _Progress) -> list[dict[str, Any]]:
    """Device-memory copies of `config.copy_bytes` (bytes: read plus write)."""
    import torch

    rows: list[dict[str, Any]] = []
    for nbytes in config.copy_bytes:  # one at a time: the buffers are the largest allocations here
        src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
        times = _time_sweep([lambda s=src, d=dst: d.copy_(s)], config, device)[0]
        rows += [_row(COPY_OP, 2 * nbytes, trial, secs, base) for trial, secs in enumerate(times)]
        del src, dst
        bar.step(f"copy {nbytes} B")
    return rows


# --------------------------------------------------------------------------------------------
# Entry points for the CLI
# --------------------------------------------------------------------------------------------


def launched_externally() -> bool:
    """True under torchrun (RANK/WORLD_SIZE) or srun (SLURM_PROCID/SLURM_NTASKS)."""
    env = os.environ
    return ("RANK" in env and "WORLD_SIZE" in env) or ("SLURM_PROCID" in env and "SLURM_NTASKS" in env)


def default_backend() -> str:
    """nccl when GPUs are visible. Asked through NVML, so this process can still fork ranks that use
    CUDA (torch.cuda.is_available() otherwise initializes the driver and poisons fork)."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    import torch

    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() > 0 else "gloo"


def run_forked(nproc: int, config: SweepConfig, *, backend: str | None = None,
               timeout_s: float = 300.0) -> dict[str, Any]:
    """Fork `nproc` ranks on this machine (engine.launch) and return rank 0's results."""
    from engine.launch import launch

    if nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {nproc}")
    backend = backend or default_backend()
    if backend == "nccl":
        import torch

        if nproc > torch.cuda.device_count():
            raise ValueError(f"--nproc={nproc} but only {torch.cuda.device_count()} GPU(s) are visible")
    return launch(run_profile, nproc, args=(config,), backend=backend, timeout_s=timeout_s)[0]


def run_in_place(config: SweepConfig, *, timeout_s: float = 600.0) -> dict[str, Any] | None:
    """Run on the world that torchrun/srun started; rank 0 gets the results, the others None."""
    import torch.distributed as dist

    env = os.environ
    if not dist.is_initialized():
        if "RANK" not in env:
            env["RANK"], env["WORLD_SIZE"] = env["SLURM_PROCID"], env["SLURM_NTASKS"]
            env.setdefault("LOCAL_RANK", env.get("SLURM_LOCALID", "0"))
        if "MASTER_ADDR" not in env:
            raise ValueError("MASTER_ADDR is not set: export MASTER_ADDR=<first node> and MASTER_PORT "
                             "under srun")
        env.setdefault("MASTER_PORT", "29500")
        dist.init_process_group(default_backend(), timeout=datetime.timedelta(seconds=timeout_s))
    try:
        return run_profile(dist.get_rank(), dist.get_world_size(), config)
    finally:
        dist.destroy_process_group()
