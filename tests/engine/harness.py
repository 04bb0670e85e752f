"""Shared helpers of the engine tests: the tiny GPT, its data, the single-process reference, and
the per-rank training function launched with engine.launch (fork).

Sizes are tiny on purpose (hidden 32, 8 heads, seq 8, vocab 60 so the LM head needs padding): the
machine has two cores shared by up to 8 ranks.

On a GPU machine scripts/gpu_check.sh sets GRIDTUNE_TEST_BACKEND=nccl and GRIDTUNE_TEST_MAX_WORLD
(the number of GPUs): `run_grid` then launches NCCL ranks, one GPU each (cuda:LOCAL_RANK), and
skips grids with more ranks than GPUs. The single-process reference stays on the CPU.
"""

from __future__ import annotations

import functools
import itertools
import os
from typing import Any

import pytest
import torch

from engine.models.gpt import GPT, GPTConfig

AXES5 = ("data", "inter", "depth", "row", "col")
FIELDS = {"data": "G_data", "inter": "G_inter", "depth": "G_intra_d", "row": "G_intra_r", "col": "G_intra_c"}
GLOBAL_BATCH = 8
STEPS = 3
LR = 1e-3
BACKEND = os.environ.get("GRIDTUNE_TEST_BACKEND", "gloo")
MAX_WORLD = int(os.environ.get("GRIDTUNE_TEST_MAX_WORLD", "1024"))


def factorizations(world: int, axes: tuple[str, ...]) -> list[dict[str, int]]:
    """Every assignment of degrees to `axes` whose product is `world` (others 1)."""
    divisors = [d for d in range(1, world + 1) if world % d == 0]
    out = []
    for combo in itertools.product(divisors, repeat=len(axes)):
        prod = 1
        for c in combo:
            prod *= c
        if prod == world:
            degrees = dict.fromkeys(AXES5, 1)
            degrees.update(zip(axes, combo))
            out.append(degrees)
    return out


def grid_id(degrees: dict[str, int]) -> str:
    return "x".join(f"{a[0]}{degrees[a]}" for a in AXES5)


def config(num_layers: int = 2) -> GPTConfig:
    return GPTConfig(num_layers=num_layers, hidden_size=32, num_attention_heads=8, seq_length=8,
                     vocab_size=60)


def batches(cfg: GPTConfig, steps: int = STEPS,
            global_batch: int = GLOBAL_BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    tokens = torch.randint(0, cfg.vocab_size, (steps * global_batch, cfg.seq_length), generator=g)
    targets = torch.randint(0, cfg.vocab_size, (steps * global_batch, cfg.seq_length), generator=g)
    return tokens, targets


def make_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=LR, eps=1e-5, weight_decay=0.01)


def _call(rank: int, world: int, fn: Any, args: tuple) -> Any:
    return fn(*args)


def isolated(fn: Any, *args: Any) -> Any:
    """`fn(*args)` in a forked process: the test process itself never runs autograd. On CUDA builds
    of torch the first backward starts autograd's device threads, after which forked ranks cannot
    run backward ("Unable to handle autograd's threading in combination with fork-based
    multiprocessing"), so single-process references run in a child too."""
    from engine.launch import launch

    return launch(_call, 1, args=(fn, args), timeout_s=120)[0]


@functools.lru_cache(maxsize=8)
def reference(num_layers: int = 2, steps: int = STEPS) -> tuple[list[float], dict[str, torch.Tensor], float]:
    """Single-process training: losses per step, the final state_dict, the first step's gradient norm."""
    return isolated(_reference, num_layers, steps)


def _reference(num_layers: int, steps: int) -> tuple[list[float], dict[str, torch.Tensor], float]:
    torch.set_num_threads(1)
    cfg = config(num_layers)
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = make_optimizer(model.parameters())
    tokens, targets = batches(cfg, steps)
    losses = []
    for s in range(steps):
        sl = slice(s * GLOBAL_BATCH, (s + 1) * GLOBAL_BATCH)
        opt.zero_grad()
        loss = model(tokens[sl], targets[sl])
        loss.backward()
        if s == 0:
            norm = float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))
        opt.step()
        losses.append(float(loss.detach()))
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}, norm


def train_gpt(rank: int, world: int, degrees: dict[str, int], options: dict[str, Any]) -> dict[str, Any]:
    """Per-rank body: build the parallel GPT from the seeded serial one, train STEPS steps on the
    data loader's shard, record the last step's traffic; return losses, traffic and (rank 0) the
    full state dict."""
    from torch.utils.data import TensorDataset

    import engine

    grid = engine.init(**{FIELDS[a]: degrees[a] for a in AXES5})
    num_layers = options.get("num_layers", 2)
    steps = options.get("steps", STEPS)
    cfg = config(num_layers)
    torch.manual_seed(0)
    serial = GPT(cfg)
    v = options.get("virtual_stages", 1)
    model = engine.ParallelGPT.from_serial(serial, grid, virtual_stages=v,
                                           recompute=options.get("recompute") == "full")
    del serial
    chained = engine.prefetch_depth(model, options.get("prefetch_depth", True))  # wrap chained it already
    stage = options.get("zero_stage", 0)
    zero = stage >= 1
    if stage == 3:
        opt = engine.Zero3(model, torch.optim.AdamW, lr=LR, eps=1e-5, weight_decay=0.01,
                           offload=options.get("offload", False), hybrid_shard=options.get("hybrid_shard"))
    elif zero:
        opt = engine.ZeroOptimizer(model, torch.optim.AdamW, lr=LR, eps=1e-5, weight_decay=0.01, stage=stage,
                                   offload=options.get("offload", False))
    else:
        opt = make_optimizer(model.parameters())
    tokens, targets = batches(cfg, steps)
    mb = options.get("micro_batch_size")
    loader = engine.create_dataloader(TensorDataset(tokens, targets), GLOBAL_BATCH, mb)
    local = GLOBAL_BATCH // grid.batch_shards
    pipe = None
    if grid.size("inter") > 1:
        pipe = engine.Pipeline(model, grid, schedule=options.get("schedule", "1f1b"),
                               micro_batch_size=mb or local, local_batch_size=local)
    rec = engine.CommRecorder(grid)
    losses = []
    norm = None
    for s, (tok, tgt) in enumerate(loader):
        opt.zero_grad()
        if s == steps - 1:
            with rec:
                loss = engine.forward_backward(model, tok, tgt, micro_batch_size=mb, pipeline=pipe)
                engine.sync_gradients(model, data=not zero)
                if zero:
                    opt.step()
        else:
            loss = engine.forward_backward(model, tok, tgt, micro_batch_size=mb, pipeline=pipe)
            engine.sync_gradients(model, data=not zero)
            if zero:
                opt.step()
        if s == 0 and not zero:
            norm = float(engine.grad_norm(model))  # outside the recorded step: it adds collectives
        if not zero:
            opt.step()
        losses.append(loss)
    placement = opt.placement() if zero else None
    separate_local = [u.local is not u.shard for u in opt.units] if stage == 3 else None
    if stage == 3:
        opt.materialize()
    state = engine.full_state_dict(model)
    return {"coords": dict(grid.coords), "losses": losses, "bytes": rec.bytes_per_group(),
            "calls": rec.calls_per_group(), "grad_norm": norm, "table": rec.table(),
            "state": state if rank == 0 else None, "chained": chained, "placement": placement,
            "separate_local": separate_local, "offload": getattr(opt, "offload", None),
            "prefetch_hits": sum(m.depth_prefetch_hits for m in model.modules()
                                 if isinstance(m, engine.ShardedLinear))}


def global_losses(results: list[dict[str, Any]], degrees: dict[str, int]) -> list[float]:
    """Mean over (data, depth) replicas of the last stage's local mean losses."""
    last = [r for r in results if r["coords"]["inter"] == degrees["inter"] - 1
            and r["coords"]["row"] == 0 and r["coords"]["col"] == 0]
    assert len(last) == degrees["data"] * degrees["depth"]
    steps = len(last[0]["losses"])
    return [sum(r["losses"][s] for r in last) / len(last) for s in range(steps)]


def assert_trains_as_one_process(results: list[dict[str, Any]], degrees: dict[str, int],
                                 num_layers: int = 2) -> None:
    """The grid's global losses and rank 0's full state dict equal single-process training at 1e-5."""
    ref_losses, ref_state, _ = reference(num_layers)
    assert global_losses(results, degrees) == pytest.approx(ref_losses, rel=1e-5)
    state = results[0]["state"]
    assert set(state) == set(ref_state)
    for name, ref in ref_state.items():
        assert (state[name] - ref).abs().max().item() <= 1e-5, name


def predicted_traffic(degrees: dict[str, int], options: dict[str, Any],
                      stage: int) -> tuple[dict[str, float], dict[str, float]]:
    """perfmodels.traffic's bytes and calls per group per step for this rank's pipeline stage."""
    from perfmodels.plans import from_plans
    from perfmodels.specs import Plan, Training
    from perfmodels.traffic import bytes_per_group, calls_per_group

    local = GLOBAL_BATCH // (degrees["data"] * degrees["depth"])
    plan = Plan(**{FIELDS[a]: degrees[a] for a in AXES5},
                micro_batch_size=options.get("micro_batch_size") or local,
                schedule=options.get("schedule", "1f1b"), virtual_stages=options.get("virtual_stages", 1),
                zero_stage=options.get("zero_stage", 0), recompute=options.get("recompute", "none"))
    training = Training(global_batch_size=GLOBAL_BATCH, dtype="fp32")
    spec = config(options.get("num_layers", 2)).to_spec()
    arrays = from_plans([plan])
    b = {k: float(v[0]) for k, v in bytes_per_group(spec, training, arrays, stage=stage).items()}
    c = {k: float(v[0]) for k, v in calls_per_group(spec, training, arrays, stage=stage).items()}
    return b, c


SCHEDULE_CYCLE = ("1f1b", "gpipe", "interleaved-1f1b")


def options_for(degrees: dict[str, int]) -> dict[str, Any]:
    """Deterministic per-grid options that exercise micro-batching and every schedule."""
    local = GLOBAL_BATCH // (degrees["data"] * degrees["depth"])
    S = degrees["inter"]
    if S == 1:
        return {"micro_batch_size": local // 2} if local >= 2 else {}
    world = 1
    for a in AXES5:
        world *= degrees[a]
    pipelined = [d for d in factorizations(world, AXES5) if d["inter"] > 1]
    schedule = SCHEDULE_CYCLE[pipelined.index(degrees) % 3] if degrees in pipelined else "1f1b"
    if schedule == "interleaved-1f1b" and local % S == 0:
        return {"schedule": schedule, "micro_batch_size": 1, "virtual_stages": 2, "num_layers": 2 * S}
    return {"schedule": "1f1b" if schedule == "interleaved-1f1b" else schedule, "micro_batch_size": 1,
            "num_layers": max(2, S)}


_RUNS: dict[tuple, list[dict[str, Any]]] = {}


def run_grid(degrees: dict[str, int], options: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Launch `train_gpt` on this grid once per test session (the equivalence and traffic tests share it)."""
    from engine.launch import launch

    options = options_for(degrees) if options is None else options
    key = (tuple(degrees[a] for a in AXES5), tuple(sorted(options.items())))
    if key not in _RUNS:
        world = 1
        for a in AXES5:
            world *= degrees[a]
        if world > MAX_WORLD:
            import pytest

            pytest.skip(f"{world} ranks but GRIDTUNE_TEST_MAX_WORLD={MAX_WORLD} ({BACKEND})")
        _RUNS[key] = launch(train_gpt, world_size=world, args=(degrees, options), backend=BACKEND,
                            timeout_s=120)
    return _RUNS[key]
