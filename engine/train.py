"""`engine.train`: pick the layout, train with it, measure every step, feed the timings back.

Why: this closes gridtune's loop (DESIGN.md section 4). The same call that trains also tells the
performance model how fast the chosen layout really was, so the next prediction for this cluster
can be calibrated (tuner.closed_loop.calibrate_cluster).

Call it on every rank, like any torch.distributed script (torchrun, srun, or engine.launch):

    from engine.train import train
    report = train(GPTConfig(num_layers=4, hidden_size=64, ...), dataset, global_batch_size=16,
                   steps=50, auto=True)            # or plan=Plan(G_data=2, G_intra_r=2, ...)
    report.median_step_time_s, report.predicted_step_time_s, report.losses

What happens:
1. the model's shapes are read on the meta device (engine.extract) and turned into a perfmodels
   Model; the cluster is `cluster=` or this machine (tuner.closed_loop.local_cluster);
2. with auto=True rank 0 asks the tuner (in process, or the service at `service_url` /
   GRIDTUNE_URL) for the best plan the engine can run and broadcasts it; the newest calibrated
   profile of this cluster in the store is used when no `profile=` is given;
3. the grid is built, the built-in GPT is split (ParallelGPT, only this rank's shards, plus a
   Pipeline when G_inter > 1; full recomputation when the plan says so); other nets are built
   under engine.auto_parallelize when passed as a factory (replicated when passed built) and
   wrapped (engine.wrap); ZeRO-1 plans get an engine.ZeroOptimizer; dtype="bf16" runs under
   autocast;
4. every step is timed (engine.timing: wall time, collective wait per grid axis, pipeline wait;
   CUDA events and a synchronized clock on GPUs), with a progress bar on rank 0 (loss, step time,
   tokens/s), and each rank's peak memory is recorded (TrainReport.memory);
5. after the warm-up steps, rank 0 stores one measurement (plan, prediction, median measured
   times) in the store (GRIDTUNE_DATABASE_URL or the default SQLite file) or POSTs it to the
   service, and every rank returns the same TrainReport.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

from engine.extract import ModelLike, gpt_config_of, model_spec
from engine.models.gpt import GPT, GPTConfig
from engine.timing import CommTimer, StepClock, StepSample
from perfmodels import rules
from perfmodels.specs import Cluster, Model, Plan, Prediction, Profile, Training, plan_problems

OptimizerFactory = Callable[[Any], torch.optim.Optimizer]


@dataclass(frozen=True, kw_only=True)
class MemoryStats:
    """Peak memory of one rank over an engine.train call (bytes): on a GPU the CUDA caching
    allocator's peak allocated and reserved; on the CPU the process's peak resident set size."""

    rank: int
    device: str
    stage: int = 0
    """The rank's pipeline stage (its coordinate along "inter")."""
    peak_allocated_bytes: int = 0
    peak_reserved_bytes: int = 0
    peak_rss_bytes: int = 0
    baseline_rss_bytes: int = 0

    @property
    def peak_bytes(self) -> int:
        """The figure to compare with a memory prediction: allocated on GPU, RSS on CPU."""
        return self.peak_allocated_bytes if self.device.startswith("cuda") else self.peak_rss_bytes

    @property
    def training_rss_bytes(self) -> int:
        """Peak RSS above the process's own baseline (interpreter, torch, process groups) read when
        engine.train started: the part a model-state/activation prediction describes (CPU)."""
        return max(0, self.peak_rss_bytes - self.baseline_rss_bytes)


def current_rss_bytes() -> int:
    """This process's resident set size now (Linux /proc/self/statm; else the peak so far)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return peak_rss_bytes()


def peak_rss_bytes() -> int:
    """This process's peak resident set size (Linux reports ru_maxrss in KiB)."""
    import resource
    import sys

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def memory_stats(rank: int, device: torch.device, baseline_rss_bytes: int = 0, stage: int = 0) -> MemoryStats:
    if device.type == "cuda":
        return MemoryStats(rank=rank, device=str(device), stage=stage,
                           peak_allocated_bytes=torch.cuda.max_memory_allocated(device),
                           peak_reserved_bytes=torch.cuda.max_memory_reserved(device),
                           peak_rss_bytes=peak_rss_bytes(), baseline_rss_bytes=baseline_rss_bytes)
    return MemoryStats(rank=rank, device=str(device), stage=stage, peak_rss_bytes=peak_rss_bytes(),
                       baseline_rss_bytes=baseline_rss_bytes)


@dataclass(frozen=True, kw_only=True)
class TrainReport:
    """What one engine.train call did and measured (identical on every rank).

    `measured` holds the medians over the steady-state steps (seconds): iteration_time_s (slowest
    rank per step), compute_s, tp_comm_row_s / tp_comm_col_s / tp_comm_depth_s / dp_comm_s
    (collective wait per group, averaged over ranks), tp_comm_s (row + col), pp_bubble_s
    (pipeline wait for neighbouring stages) and tokens_per_s.
    """

    plan: Plan
    world_size: int
    steps: int
    warmup_steps: int
    losses: tuple[float, ...]
    step_times_s: tuple[float, ...]
    median_step_time_s: float
    tokens_per_s: float
    measured: dict[str, float] = field(default_factory=dict)
    prediction: Prediction | None = None
    predicted_step_time_s: float | None = None
    relative_error: float | None = None
    constants_source: str = "preset"
    cluster_id: str = ""
    measurement_id: int | None = None
    stored_in: str | None = None
    memory: tuple[MemoryStats, ...] = ()
    dtype: str = "fp32"
    ranks_per_core: float = 0.0  # CPU runs: ranks on this node / its cores (> 1: the ranks share cores)

    @property
    def peak_memory_gib(self) -> float:
        """The largest per-rank peak (allocated on GPU, RSS on CPU), GiB."""
        return max((m.peak_bytes for m in self.memory), default=0) / 2**30

    @property
    def peak_memory_by_stage_gib(self) -> dict[int, float]:
        """Each pipeline stage's largest per-rank peak, GiB: a pipeline's stages hold different
        layers, embedding and head, and the first keeps the most micro-batches in flight, so the
        stage that runs out of memory first is the one to look at (and to compare with
        `perfmodels.memory`'s first stage)."""
        out: dict[int, float] = {}
        for m in self.memory:
            out[m.stage] = max(out.get(m.stage, 0.0), m.peak_bytes / 2**30)
        return dict(sorted(out.items()))

    def summary(self) -> str:
        pred = f"{self.predicted_step_time_s:.4g} s" if self.predicted_step_time_s else "-"
        err = f" ({self.relative_error:+.0%})" if self.relative_error is not None else ""
        loss = f"loss {self.losses[0]:.3f} -> {self.losses[-1]:.3f}, " if self.losses else ""
        band = ""
        if self.prediction is not None:
            from perfmodels.calibration import measured_range_s

            lo, hi = measured_range_s(self.prediction.iteration_time_s, self.prediction.uncertainty_rel)
            # the band bounds the error relative to the measured time: say which times it admits
            band = (f" +/- {self.prediction.uncertainty_rel:.0%} (admits {lo:.4g}-"
                    + (f"{hi:.4g} s)" if hi != float("inf") else "inf s)"))
        return (f"{self.plan.grid_string()} mb={self.plan.micro_batch_size}: {loss}median step "
                f"{self.median_step_time_s:.4g} s measured vs {pred}{band} predicted{err} "
                f"[{self.constants_source} constants], {self.tokens_per_s:,.0f} tokens/s, "
                f"peak memory {self.peak_memory_gib:.2f} GiB/rank"
                + (" (by pipeline stage: " + ", ".join(f"{s}: {g:.2f}" for s, g in
                                                       self.peak_memory_by_stage_gib.items()) + ")"
                   if len(self.peak_memory_by_stage_gib) > 1 else "")
                + (f"; {self.ranks_per_core:.1f} ranks per CPU core" if self.ranks_per_core > 1 else ""))


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


class TokenWindows(Dataset):
    """Next-token samples from one long 1-D token tensor: (window, window shifted by one)."""

    def __init__(self, tokens: torch.Tensor, seq_length: int, stride: int | None = None) -> None:
        if tokens.dim() != 1 or len(tokens) <= seq_length:
            raise ValueError(f"need a 1-D token tensor longer than seq_length={seq_length}, "
                             f"got {tuple(tokens.shape)}")
        self.tokens, self.seq_length = tokens.long(), seq_length
        self.stride = stride or seq_length
        self.n = (len(tokens) - seq_length - 1) // self.stride + 1

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = i * self.stride
        chunk = self.tokens[s:s + self.seq_length + 1]
        return chunk[:-1], chunk[1:]


def stdlib_bytes(max_bytes: int = 2_000_000) -> bytes:
    """Text available offline everywhere: the Python standard library's own sources, in a fixed
    order (sorted paths), up to `max_bytes`."""
    root = Path(os.__file__).parent
    out = bytearray()
    for path in sorted(root.glob("*.py")):
        try:
            out += path.read_bytes()
        except OSError:
            continue
        if len(out) >= max_bytes:
            break
    return bytes(out[:max_bytes])


def stdlib_text_dataset(seq_length: int, max_bytes: int = 2_000_000) -> TokenWindows:
    """Byte-level language modelling data (vocab 256) from the stdlib sources."""
    data = torch.frombuffer(bytearray(stdlib_bytes(max_bytes)), dtype=torch.uint8).long()
    return TokenWindows(data, seq_length)


def _cycle(loader: Any) -> Iterator[Any]:
    while True:
        yield from loader


# --------------------------------------------------------------------------------------------
# Set-up helpers
# --------------------------------------------------------------------------------------------


def ensure_process_group(timeout_s: float = 600.0) -> None:
    """Initialize torch.distributed from torchrun/engine.launch variables, or as one process."""
    if dist.is_initialized():
        return
    env = os.environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        from engine.launch import free_port

        env.setdefault("MASTER_ADDR", "127.0.0.1")
        env.setdefault("MASTER_PORT", str(free_port()))
        env["RANK"], env["WORLD_SIZE"] = "0", "1"
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":  # every rank on its own GPU (LOCAL_RANK), before NCCL binds one
        from engine.grid import local_device_index

        torch.cuda.set_device(local_device_index(int(env["RANK"])))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))


def _broadcast(obj: Any) -> Any:
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _load_profile(profile: Profile | str | os.PathLike[str] | None) -> Profile | None:
    if profile is None or isinstance(profile, Profile):
        return profile
    from tuner.profiles import read_profile

    return read_profile(profile)[0]


def _open_store(database_url: str | None) -> Any:
    from tuner.store import Store

    return Store(database_url)


def _store_exists(database_url: str | None) -> bool:
    """False only for the default SQLite file when it has never been written (nothing to read,
    and reading must not create it)."""
    from tuner.store import default_database_path, default_database_url

    if database_url is not None or default_database_url() != f"sqlite:///{default_database_path()}":
        return True
    return default_database_path().exists()


@dataclass(frozen=True, kw_only=True)
class _Decision:
    plan: Plan
    cluster: Cluster
    training: Training
    spec: Model
    prediction: Prediction | None
    cluster_id: str


def _decide(*, spec: Model, cluster: Cluster, training: Training, plan: Plan | None, auto: bool,
            splittable: bool, micro_batch_size: int | None, url: str | None,
            database_url: str | None, cluster_id: str | None, use_calibrated: bool,
            extra: Callable[[Plan], list[str]] | None = None) -> _Decision:
    """Rank 0: the cluster's constants, the plan, and its prediction."""
    from perfmodels.steptime import predict
    from tuner import closed_loop as cl

    cid = cluster_id or cl.default_cluster_id(cluster)
    if use_calibrated and url is None and _store_exists(database_url):
        store = _open_store(database_url)
        try:
            calibrated = cl.latest_calibrated_profile(store, cid)
        finally:
            store.close()
        if calibrated is not None:
            cluster = dataclasses.replace(cluster, profile=calibrated, profile_id=calibrated.profile_id)
    if plan is None:
        if not auto:
            raise ValueError("engine.train needs plan=Plan(...) or auto=True")
        options = cl.engine_search_options(micro_batch_size=micro_batch_size,
                                           data_parallel_only=not splittable, pipeline=spec.is_transformer)
        if url is not None:
            plan = cl.service_recommend(url, spec, cluster, training, options)
        else:
            candidates = cl.candidate_plans(spec, cluster, training, options, top_k=50)
            plan = next((c.plan for c in candidates
                         if not engine_problems(spec, c.plan, training, splittable=splittable)
                         and not (extra and extra(c.plan))), None)
            if plan is None:
                raise ValueError(f"no layout of {cluster.num_gpus} ranks can train this model with "
                                 f"global_batch_size={training.global_batch_size}")
    prediction = predict(spec, cluster, training, plan)
    return _Decision(plan=plan, cluster=cluster, training=training, spec=spec, prediction=prediction,
                     cluster_id=cid)


def engine_problems(spec: Model, plan: Plan, training: Training, *, splittable: bool = True) -> list[str]:
    """Why engine.train cannot run `plan` (empty when it can).

    First every rule of perfmodels.rules that does not involve the cluster, in perfmodels' words
    (`perfmodels.specs.plan_problems`: batch split, heads, hidden sizes, layers per chunk, interleaving),
    then what the engine, not the model, lacks (`engine_limits`).
    `splittable=False`: a net passed already built (not as a factory); the automatic search keeps it
    data parallel, an explicit plan with tensor axes splits it with engine.parallelize."""
    return plan_problems(spec, training, plan) + engine_limits(spec, plan, training)


def engine_limits(spec: Model, plan: Plan, training: Training) -> list[str]:
    """What the engine cannot run yet (not a rule of the model): each message names the field and value."""
    problems = []
    if plan.zero_stage not in (0, 1, 2, 3):
        problems.append(f"zero_stage={plan.zero_stage}: the engine runs ZeRO stages 0 to 3")
    if plan.recompute not in ("none", "full") or (plan.recompute == "full" and not spec.is_transformer):
        problems.append(f"recompute={plan.recompute!r}: the engine recomputes whole blocks of the built-in "
                        "GPT (recompute='full') or nothing")
    if plan.sequence_parallel:
        problems.append("sequence_parallel=True: sequence parallelism is not in the engine")
    if not spec.is_transformer:
        if plan.G_inter > 1:
            problems.append(f"G_inter={plan.G_inter}: nets other than the built-in GPT have no pipeline "
                            "stages (G_inter must be 1)")
        return problems
    from engine.parallel_gpt import gpt_depth_problems

    cfg = GPTConfig(num_layers=spec.num_layers, hidden_size=spec.hidden_size,
                    num_attention_heads=spec.num_attention_heads, ffn_hidden_size=spec.ffn_hidden_size,
                    seq_length=spec.seq_length, vocab_size=spec.vocab_size)
    degrees = {"data": plan.G_data, "inter": plan.G_inter, "depth": plan.G_intra_d, "row": plan.G_intra_r,
               "col": plan.G_intra_c}
    problems += gpt_depth_problems(cfg, degrees)
    # torch.distributed.pipelining's 1F1B schedules refuse fewer micro-batches than stages
    microbatches = rules.num_microbatches(training.global_batch_size, plan.G_data, plan.G_intra_d,
                                          plan.micro_batch_size)
    one_f_one_b = plan.G_inter > 1 and plan.schedule != "gpipe"
    if one_f_one_b and not rules.enough_microbatches(microbatches, plan.G_inter):
        problems.append(f"schedule={plan.schedule!r} needs at least G_inter={plan.G_inter} micro-batches "
                        f"per step, got {microbatches}")
    return problems


def _make_optimizer(optimizer: OptimizerFactory | type | None, net: nn.Module, zero_stage: int,
                    grid: Any, offload: bool | str | None = False) -> torch.optim.Optimizer:
    """The optimizer over `net`'s trainable parameters; ZeRO-1/2 (engine.ZeroOptimizer) and ZeRO-3
    (engine.Zero3) wrap the same factory."""
    factory: Any = optimizer
    kwargs: dict[str, Any] = {}
    if factory is None:
        factory, kwargs = torch.optim.AdamW, {"lr": 1e-3, "weight_decay": 0.01}
    if zero_stage == 3:
        from engine.zero3 import Zero3

        return Zero3(net, factory, grid=grid, offload=offload, **kwargs)
    if zero_stage in (1, 2):
        from engine.zero import ZeroOptimizer

        return ZeroOptimizer(net, factory, grid=grid, stage=zero_stage, offload=offload, **kwargs)
    return factory([p for p in net.parameters() if p.requires_grad], **kwargs)


def _progress(enabled: bool, total: int, title: str) -> Any:
    if not enabled:
        return None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    # no refresh thread: on oversubscribed cores it slowed every step measurably; _ProgressLine
    # redraws at most twice a second from the training loop instead
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[info]}"), TimeRemainingColumn(), auto_refresh=False)
    bar.start()
    bar.add_task(title, total=total, info="")
    return _ProgressLine(bar)


class _ProgressLine:
    """A rich progress bar redrawn at most every `interval_s` seconds (and at the end)."""

    def __init__(self, bar: Any, interval_s: float = 0.5) -> None:
        self.bar, self.interval_s, self._last = bar, interval_s, 0.0

    def update(self, info: str) -> None:
        import time

        task = self.bar.task_ids[0]
        self.bar.update(task, advance=1, info=info)
        now = time.perf_counter()
        if now - self._last >= self.interval_s or self.bar.tasks[0].finished:
            self._last = now
            self.bar.refresh()

    def stop(self) -> None:
        self.bar.refresh()
        self.bar.stop()


class _WithLoss(nn.Module):
    """A plain net plus its loss, so the engine's forward_backward can call net(x, y)."""

    def __init__(self, inner: nn.Module, loss_fn: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.inner, self.loss_fn = inner, loss_fn

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = self.inner(x)
        if hasattr(out, "logits"):  # Hugging Face ModelOutput
            out = out.logits
        if isinstance(out, torch.Tensor) and out.dim() == y.dim() + 1 and out.dim() > 2:  # per-token logits
            out, y = out.reshape(-1, out.shape[-1]), y.reshape(-1)
        return self.loss_fn(out, y)


# --------------------------------------------------------------------------------------------
# train
# --------------------------------------------------------------------------------------------


DEFAULT_TIMED_STEPS = 10  # steps after warm-up when `steps` is not given: enough for a stable median


def default_global_batch_size(world_size: int) -> int:
    """engine.train's global batch when none is given: two samples per rank, which every layout of
    `world_size` ranks divides (G_data * G_intra_d divides the world size)."""
    return 2 * world_size


def train(model: ModelLike, dataset: Dataset, global_batch_size: int | None = None,
          steps: int | None = None, *,
          optimizer: OptimizerFactory | type | None = None, auto: bool = True, plan: Plan | None = None,
          profile: Profile | str | os.PathLike[str] | None = None, service_url: str | None = None,
          cluster: Cluster | None = None, cluster_id: str | None = None, database_url: str | None = None,
          micro_batch_size: int | None = None, warmup_steps: int = 2,
          loss_fn: Callable[..., torch.Tensor] | None = None, record: bool = True,
          use_calibrated: bool = True, progress: bool = True, seed: int = 0,
          max_grad_norm: float | None = None, dtype: str = "fp32", init: str = "serial",
          offload: bool | str | None = False, reduce_dtype: str = "fp32",
          G_ep: int | None = None) -> TrainReport:
    """Train `model` for `steps` optimizer steps with a plan the tuner picks (auto) or `plan`.

    `model`: a GPTConfig, a GPT, any nn.Module (e.g. a Hugging Face transformers model: its
    `.logits` are used), or a zero-argument factory returning one (built on the meta device first
    to read its shapes). `dataset` yields (input, target) pairs; nets other
    than the GPT compute `loss_fn(net(input), target)` (default cross entropy). `optimizer`: a
    callable taking the parameters (default AdamW lr 1e-3). `profile`: constants (a Profile or a
    `gridtune profile` JSON file) for this cluster. `record=False` stores nothing. `dtype="bf16"`
    or "fp16" runs forward and backward under autocast with fp32 master weights (parameters,
    gradients and optimizer in fp32; fp16 with dynamic loss scaling, engine.LossScaler, ZeRO stage
    0 only); `reduce_dtype` ("fp32", "bf16", "fp16") is the dtype of the data-parallel all-reduce
    (engine.MixedPrecision).
    `init="local"` draws each rank's shards of a GPTConfig's model on the device (fast, values
    differ from GPT(cfg)); the default draws GPT(cfg)'s exact values chunk by chunk.
    The plan may use zero_stage 1 or 2 (engine.ZeroOptimizer), 3 (engine.Zero3; under a pipeline
    each stage gathers once per step) and, for the GPT, recompute="full". `offload="optimizer"` keeps
    ZeRO's optimizer shards, their gradients and state in host memory (ZeRO stages 1-3);
    `offload="params"` also the parameter shards between uses (ZeRO-3 only); True is the most the
    plan's stage offloads (engine.zero.offload_mode); under zero_stage=0 nothing is sharded and
    nothing is offloaded.
    A GPTConfig with `num_moe_experts` trains MoE MLPs (engine.moe): experts over the plan's G_ep
    (or `G_ep=` where the Plan has no such field), the automatic search keeping to layouts the
    engine's MoE runs (G_intra_c = G_intra_d = 1; every ZeRO stage: experts sharded over the
    expert-data group). The plan's G_cp (when the Plan
    has it) splits the sequence (engine.context).
    Defaults: `global_batch_size` two samples per rank (default_global_batch_size), `steps`
    warmup_steps + DEFAULT_TIMED_STEPS, so `engine.train(model, dataset, auto=True)` runs as is.
    Each rank's MemoryStats carries its RSS when the call started (baseline_rss_bytes) beside the peak.
    """
    if steps is None:
        steps = warmup_steps + DEFAULT_TIMED_STEPS
    policy = _check_arguments(steps=steps, warmup_steps=warmup_steps, dtype=dtype, reduce_dtype=reduce_dtype,
                              offload=offload, plan=plan)
    from tuner import closed_loop as cl

    ensure_process_group()
    baseline_rss = current_rss_bytes()
    rank, world = dist.get_rank(), dist.get_world_size()
    if global_batch_size is None:
        global_batch_size = default_global_batch_size(world)
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int) or global_batch_size < 1:
        raise ValueError(f"global_batch_size must be a positive integer, got {global_batch_size!r}")
    cfg = gpt_config_of(model)
    spec = model_spec(model)
    # the GPT is split by ParallelGPT; another net only when we build it (engine.auto_parallelize)
    splittable = cfg is not None or not isinstance(model, nn.Module)
    url = cl.service_url(service_url)
    training = cl.engine_training(global_batch_size, dtype=dtype)
    base_cluster, prof = _base_cluster(cluster, world, profile)
    extra = (lambda p: moe_limits(p, G_ep)) if cfg is not None and cfg.num_moe_experts else None
    decision = _on_rank_zero(rank, lambda: _decide(
        spec=spec, cluster=base_cluster, training=training, plan=plan, auto=auto, splittable=splittable,
        micro_batch_size=micro_batch_size, url=url, database_url=database_url, cluster_id=cluster_id,
        use_calibrated=use_calibrated and prof is None, extra=extra))
    chosen = decision.plan
    _refuse_what_the_engine_cannot_run(spec, chosen, training, splittable=splittable, dtype=dtype,
                                       extra=extra)
    if chosen.zero_stage in (1, 2) and offload == "params":  # the same on every rank: all raise together
        raise ValueError("offload='params' needs zero_stage=3 but the plan has "
                         f"zero_stage={chosen.zero_stage} (give plan=Plan(..., zero_stage=3) or "
                         "offload='optimizer')")

    import engine

    grid = engine.init(G_data=chosen.G_data, G_inter=chosen.G_inter, G_intra_d=chosen.G_intra_d,
                       G_intra_r=chosen.G_intra_r, G_intra_c=chosen.G_intra_c, placement=chosen.placement,
                       G_cp=getattr(chosen, "G_cp", 1), G_ep=G_ep or getattr(chosen, "G_ep", 1),
                       G_etp=getattr(chosen, "G_etp", None))
    torch.manual_seed(seed)
    if grid.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(grid.device)
    net, pipe, tokens_per_sample = _build_net(model, cfg, chosen, grid, global_batch_size, init=init,
                                              loss_fn=loss_fn)
    opt = _make_optimizer(optimizer, net, chosen.zero_stage, grid, offload)
    policy.apply(net)
    # shuffled windows (same seed on every rank, so the batch split stays consistent): sequential
    # windows would walk the corpus file by file and the loss would follow the files, not training
    loader = engine.create_dataloader(dataset, global_batch_size, chosen.micro_batch_size, grid=grid,
                                      shuffle=True)
    run = _Run(net=net, opt=opt, pipe=pipe, grid=grid, plan=chosen, policy=policy,
               max_grad_norm=max_grad_norm, tokens_per_step=global_batch_size * tokens_per_sample)
    bar = _progress(progress and rank == 0, steps, f"train {chosen.grid_string()}")
    try:
        samples, losses = run.steps(_cycle(loader), steps, warmup_steps, progress=progress, bar=bar)
    finally:
        if bar is not None:
            bar.stop()

    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (samples, losses, memory_stats(rank, grid.device, baseline_rss,
                                                                    stage=grid.coord("inter"))))
    return _on_rank_zero(rank, lambda: _report(
        gathered, decision=decision, steps=steps, warmup_steps=warmup_steps,
        tokens_per_step=global_batch_size * tokens_per_sample, record=record, url=url,
        database_url=database_url, dtype=dtype))


def _check_arguments(*, steps: int, warmup_steps: int, dtype: str, reduce_dtype: str,
                     offload: bool | str | None, plan: Plan | None) -> Any:
    """engine.train's own arguments, checked before any collective; returns the MixedPrecision policy."""
    from engine.zero import offload_mode

    # a value no stage accepts; with a plan also the stage's own limit (offload="params": ZeRO-3)
    offload_mode(offload, zero3=True if plan is None else plan.zero_stage == 3)
    if steps <= warmup_steps:
        raise ValueError(f"steps={steps} must be larger than warmup_steps={warmup_steps}")
    if dtype not in ("fp32", "bf16", "fp16"):
        raise ValueError(f"dtype must be 'fp32', 'bf16' or 'fp16', got {dtype!r}")
    from engine.precision import MixedPrecision

    policy = MixedPrecision(compute_dtype=dtype, reduce_dtype=reduce_dtype)  # ValueError naming the field
    if dtype == "fp16" and plan is not None and plan.zero_stage:
        raise ValueError(f"dtype='fp16' (loss scaling) runs with zero_stage=0, "
                         f"got zero_stage={plan.zero_stage}")
    return policy


def moe_limits(plan: Plan, G_ep: int | None = None) -> list[str]:
    """What the engine's MoE layers (engine.moe) need of a plan, each message naming field and value."""
    problems = []
    if plan.G_intra_c != 1 or plan.G_intra_d != 1:
        problems.append(f"G_intra_c={plan.G_intra_c}, G_intra_d={plan.G_intra_d}: MoE layers need both 1")
    G_etp = getattr(plan, "G_etp", None)
    ep = G_ep or getattr(plan, "G_ep", 1)
    if (plan.world_size // plan.G_inter) % (ep * (G_etp or plan.G_intra_r)):
        problems.append(f"G_ep={ep}: G_etp*G_ep does not divide the ranks of a pipeline stage")
    return problems


def _refuse_what_the_engine_cannot_run(spec: Model, plan: Plan, training: Training, *, splittable: bool,
                                       dtype: str, extra: Callable[[Plan], list[str]] | None = None) -> None:
    """Raise ValueError (on every rank: all hold the broadcast plan) naming every problem of `plan`."""
    problems = engine_problems(spec, plan, training, splittable=splittable) + (extra(plan) if extra else [])
    if dtype == "fp16" and plan.zero_stage:
        problems.append(f"dtype='fp16' (loss scaling) runs with zero_stage=0, not {plan.zero_stage}")
    if problems:
        raise ValueError(f"engine.train cannot run {plan.grid_string()}: " + "; ".join(problems))


def _base_cluster(cluster: Cluster | None, world: int,
                  profile: Profile | str | os.PathLike[str] | None) -> tuple[Cluster, Profile | None]:
    """The cluster to plan for (`cluster=` or this machine) with `world` ranks and `profile`'s constants."""
    from tuner import closed_loop as cl

    base = cluster or cl.local_cluster(world)
    if base.num_gpus != world:
        base = dataclasses.replace(base, num_gpus=world)
    prof = _load_profile(profile)
    if prof is not None:
        base = dataclasses.replace(base, profile=prof, profile_id=prof.profile_id or None)
    return base, prof


def _on_rank_zero(rank: int, work: Callable[[], Any]) -> Any:
    """Run `work` on rank 0 and give its result to every rank; its error is raised on every rank.

    Rank 0 never raises before the broadcast: the other ranks wait in it, and would hang until the
    process-group timeout. A ValueError keeps its type (it names what the user passed)."""
    result: Any = None
    if rank == 0:
        try:
            result = work()
        except Exception as exc:
            result = exc if isinstance(exc, ValueError) else RuntimeError(f"{type(exc).__name__}: {exc}")
    result = _broadcast(result)
    if isinstance(result, BaseException):
        raise result
    return result


def _build_net(model: ModelLike, cfg: GPTConfig | None, plan: Plan, grid: Any, global_batch_size: int, *,
               init: str, loss_fn: Callable[..., torch.Tensor] | None) -> tuple[nn.Module, Any, int]:
    """This rank's part of the model on `grid`, its Pipeline (G_inter > 1) and the tokens per sample."""
    import engine

    if cfg is None:
        if isinstance(model, nn.Module):  # built: split its Linears when the plan has tensor axes
            inner = engine.parallelize(model, grid) if plan.world_size != plan.G_data else model
        else:
            with engine.auto_parallelize(grid):
                inner = model()
        net = engine.wrap(_WithLoss(inner.to(grid.device), loss_fn or nn.functional.cross_entropy), grid=grid)
        return net, None, 1
    recompute = plan.recompute == "full"
    if isinstance(model, GPTConfig):  # only this rank's shards are ever allocated
        net = engine.ParallelGPT(cfg, grid, virtual_stages=plan.virtual_stages, recompute=recompute,
                                 init=init)
    else:
        serial = model if isinstance(model, GPT) else model()
        net = engine.ParallelGPT.from_serial(serial, grid, virtual_stages=plan.virtual_stages,
                                             recompute=recompute)
        del serial
    pipe = None
    if plan.G_inter > 1:
        local = engine.local_batch_size(global_batch_size, grid, plan.micro_batch_size)
        pipe = engine.Pipeline(net, grid, schedule=plan.schedule, micro_batch_size=plan.micro_batch_size,
                               local_batch_size=local)
    return net, pipe, cfg.seq_length


@dataclass(kw_only=True)
class _Run:
    """The training loop of engine.train: one timed optimizer step at a time."""

    net: nn.Module
    opt: torch.optim.Optimizer
    pipe: Any
    grid: Any
    plan: Plan
    policy: Any
    max_grad_norm: float | None
    tokens_per_step: int

    def steps(self, batches: Iterator[Any], steps: int, warmup_steps: int, *, progress: bool,
              bar: _ProgressLine | None) -> tuple[list[StepSample], list[float | None]]:
        """Run `steps` steps; each rank's timings and losses (None on stages without the loss)."""
        from engine.precision import LossScaler

        device = self.grid.device
        scaler = LossScaler() if self.policy.compute_dtype == "fp16" else None
        timer = CommTimer(self.grid)
        clock = StepClock(timer)
        samples: list[StepSample] = []
        losses: list[float | None] = []
        dist.barrier()
        with timer:
            for _ in range(steps):
                tokens, targets = next(batches)
                tokens, targets = tokens.to(device), targets.to(device)
                clock.start()
                loss = self._step(tokens, targets, scaler)
                samples.append(clock.stop())
                losses.append(loss)
                if progress:  # every rank takes part: the bar shows what the summary will report
                    shown_loss = _global_loss(loss, device)
                    if bar is not None:
                        steady = samples[warmup_steps:] or samples  # as the summary: warm-up steps excluded
                        median_s = _median([x.wall_s for x in steady])
                        tok_s = self.tokens_per_step / max(median_s, 1e-9)
                        shown = f"loss {shown_loss:.3f}  " if shown_loss is not None else ""
                        bar.update(f"{shown}median {median_s * 1e3:.1f} ms/step  {tok_s:,.0f} tok/s")
        return samples, losses

    def _step(self, tokens: torch.Tensor, targets: torch.Tensor, scaler: Any) -> float | None:
        import engine

        self.opt.zero_grad(set_to_none=True)
        with self.policy.autocast(self.grid.device):
            loss = engine.forward_backward(self.net, tokens, targets,
                                           micro_batch_size=self.plan.micro_batch_size, pipeline=self.pipe,
                                           loss_scale=scaler.scale if scaler else 1.0)
        if scaler is None:
            engine.step(self.net, self.opt, max_grad_norm=self.max_grad_norm, grid=self.grid)
        else:  # fp16: unscale after the reduction; skip the step on inf/nan anywhere
            engine.sync_gradients(self.net, grid=self.grid)
            if scaler.unscale_and_check(self.net, self.grid.device):
                if self.max_grad_norm is not None:
                    engine.clip_grad_norm_(self.net, self.max_grad_norm, grid=self.grid)
                self.opt.step()
        return loss


def _global_loss(loss: float | None, device: torch.device) -> float | None:
    """The step's loss as the summary reports it: the mean over every rank that computed one (the
    last pipeline stage of every replica), not rank 0's own. One scalar all-reduce over the world,
    after the step's clock has stopped."""
    stat = torch.tensor([loss if loss is not None else 0.0, 0.0 if loss is None else 1.0],
                        dtype=torch.float64, device=device)
    dist.all_reduce(stat)
    return float(stat[0] / stat[1]) if stat[1] > 0 else None


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def _log_sd(values: Sequence[float]) -> float:
    """Sample standard deviation of log(values) (ddof 1): the relative scatter of step times, 0 with
    fewer than two."""
    logs = [math.log(v) for v in values if v > 0]
    return float(statistics.stdev(logs)) if len(logs) >= 2 else 0.0


def _report(gathered: list[Any], *, decision: _Decision, steps: int, warmup_steps: int, tokens_per_step: int,
            record: bool, url: str | None, database_url: str | None, dtype: str = "fp32") -> TrainReport:
    from tuner import closed_loop as cl

    per_rank = [g[0] for g in gathered]
    wall = [max(s[i].wall_s for s in per_rank) for i in range(steps)]
    steady = range(warmup_steps, steps)
    median_step = _median([wall[i] for i in steady])

    def part(fn: Callable[[StepSample], float]) -> float:
        return statistics.fmean(_median([fn(s[i]) for i in steady]) for s in per_rank)

    measured = {
        "iteration_time_s": median_step,
        "compute_s": part(lambda s: s.compute_s),
        "tp_comm_row_s": part(lambda s: s.comm_s.get("row", 0.0)),
        "tp_comm_col_s": part(lambda s: s.comm_s.get("col", 0.0)),
        "tp_comm_depth_s": part(lambda s: s.comm_s.get("depth", 0.0)),
        "dp_comm_s": part(lambda s: s.comm_s.get("data", 0.0)),
        # pipeline sends, the cp ring and the MoE groups have no field of their own in the record yet
        "other_comm_s": part(lambda s: sum(s.comm_s.get(a, 0.0) for a in ("other", "inter", "cp", "ep", "etp",
                                                                              "edp"))),
        "pp_bubble_s": part(lambda s: s.pp_wait_s),
        "tokens_per_s": tokens_per_step / median_step if median_step > 0 else 0.0,
        "steps_measured": float(len(steady)),
        # how much this run's steps scatter about each other (relative sd of log step time): what one
        # run says about the machine's noise (tuner.closed_loop.measured_run_scatter)
        "step_scatter_rel": _log_sd([wall[i] for i in steady]),
    }
    measured["tp_comm_s"] = measured["tp_comm_row_s"] + measured["tp_comm_col_s"]
    losses = []
    for i in range(steps):
        vals = [g[1][i] for g in gathered if g[1][i] is not None]
        if vals:
            losses.append(float(statistics.fmean(vals)))
    pred = decision.prediction
    predicted = pred.iteration_time_s if pred is not None else None
    measurement_id: int | None = None
    stored_in: str | None = None
    if record:
        body = cl.measurement_record(model=decision.spec, cluster=decision.cluster,
                                     training=decision.training, plan=decision.plan, measured=measured,
                                     prediction=pred)
        if url is not None:
            out = cl.post_measurement(url, body, cluster_id=decision.cluster_id)
            measurement_id, stored_in = out.get("id"), url
        else:
            store = _open_store(database_url)
            try:
                m = store.add_measurement(cluster_id=decision.cluster_id, **body)
            finally:
                store.close()
            measurement_id, stored_in = m.id, store.url
    return TrainReport(
        plan=decision.plan, world_size=len(gathered), steps=steps, warmup_steps=warmup_steps,
        losses=tuple(losses), step_times_s=tuple(wall), median_step_time_s=median_step,
        tokens_per_s=measured["tokens_per_s"], measured=measured, prediction=pred,
        predicted_step_time_s=predicted,
        relative_error=(predicted - median_step) / median_step if predicted and median_step > 0 else None,
        constants_source=pred.constants_source if pred is not None else "preset",
        cluster_id=decision.cluster_id, measurement_id=measurement_id, stored_in=stored_in,
        memory=tuple(g[2] for g in gathered), dtype=dtype,
        ranks_per_core=_ranks_per_core(len(gathered), gathered[0][2].device),
    )


def _ranks_per_core(world: int, device: str) -> float:
    """On the CPU: this node's ranks (LOCAL_WORLD_SIZE, else the world) per core they may use
    (the affinity mask, else os.cpu_count()); 0 on GPUs."""
    if device.startswith("cuda"):
        return 0.0
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return local / max(1, cores)
