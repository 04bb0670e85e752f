"""Gradient synchronization, gradient accumulation and norm clipping over the whole grid.

After backward, each rank's gradients hold the sum over its (data, depth) replica's local batch of
the local mean loss's gradient, with weight shards already reduce-scattered over depth by
engine.Linear. `sync_gradients` then
  1. all-reduces over depth the gradients of parameters replicated over depth (norms, biases,
     embeddings, plain layers): each depth rank saw different samples;        [depth, "depth_grad"]
  2. all-reduces over data every local gradient, in flat buckets;              [data, "dp_grad"]
     (with ZeRO-1, engine.zero.ZeroAdamW reduce-scatters instead)
  3. divides by G_data * G_intra_d,
which gives exactly the gradient of the mean loss over the global batch, as in single-process
training. Row/col replicas need no reduction: the conjugate collectives make their gradients equal.
The counts (one call per bucket, bytes = local gradient bytes) are perfmodels.traffic's.

Replicas never drift silently: `wrap(model)` (called by ParallelGPT and engine.train) broadcasts
parameters and buffers over their replica groups, and every engine layer's parameters (all of a
wrapped model's) carry a hook that marks them after backward; an optimizer step on marked
parameters raises until `sync_gradients` ran. `step(model, optimizer)` syncs, clips and steps.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from engine.grid import Grid, current_grid
from engine.shard import spec_of

DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024
_NO_SYNC_ATTR = "_gridtune_no_sync"
_GUARDED_ATTR = "_gridtune_guarded"  # the parameter carries the post-accumulate hook below
_DIRTY_ATTR = "_gridtune_dirty"  # gradients accumulated since the last sync_gradients
ZERO_ATTR = "_gridtune_zero"  # weakref to the engine.ZeroOptimizer sharding this parameter's state
STAGE_SPLIT_ATTR = "_gridtune_stage_split"  # a module whose parameters are split over pipeline stages


def replicated_over_depth(p: torch.Tensor) -> bool:
    spec = spec_of(p)
    return spec is None or not spec.depth_flat


def _params_with_grads(model: nn.Module) -> list[torch.Tensor]:
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:  # every rank of a group must reduce the same buffers
            p.grad = torch.zeros_like(p)
    return params


def _buckets(tensors: list[torch.Tensor], bucket_bytes: int) -> Iterator[list[torch.Tensor]]:
    bucket: list[torch.Tensor] = []
    size = 0
    for t in tensors:
        nb = t.numel() * t.element_size()
        if bucket and (size + nb > bucket_bytes or t.dtype != bucket[0].dtype):
            yield bucket
            bucket, size = [], 0
        bucket.append(t)
        size += nb
    if bucket:
        yield bucket


def all_reduce_bucketed(tensors: list[torch.Tensor], group: object, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
    """Sum each tensor over `group` in place, flattening them into buckets of at most `bucket_bytes`."""
    if group is None or not tensors:
        return
    for bucket in _buckets(tensors, bucket_bytes):
        flat = _flatten_dense_tensors(bucket)
        dist.all_reduce(flat, group=group)
        for t, synced in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
            t.copy_(synced)


def reduce_depth_replicated(model: nn.Module, grid: Grid, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
    params = _params_with_grads(model)
    all_reduce_bucketed([p.grad for p in params if replicated_over_depth(p)], grid.comm_group("depth"), bucket_bytes)


# --------------------------------------------------------------------------------------------
# The sync guard: replicas never drift silently
# --------------------------------------------------------------------------------------------


def _mark_dirty(p: torch.Tensor) -> None:
    setattr(p, _DIRTY_ATTR, True)


def _check_synced(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """Global optimizer step pre-hook: refuse to step parameters whose gradients were accumulated
    on one (data, depth) replica and never synchronized (the replicas would drift apart)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if getattr(p, _DIRTY_ATTR, False):
                raise RuntimeError(
                    "gradients were not synchronized across the G_data*G_intra_d replicas before "
                    f"{type(optimizer).__name__}.step(): call engine.sync_gradients(model) after backward, or "
                    "engine.step(model, optimizer), which syncs and steps")


def install_sync_guard(module: nn.Module, grid: Grid) -> None:
    """Mark `module`'s parameters so that an optimizer step after a backward without
    engine.sync_gradients raises. Nothing to do when the batch is not split (one replica)."""
    if grid.batch_shards == 1:
        return
    from torch.optim import optimizer as optimizer_module

    hooks = getattr(optimizer_module, "_global_optimizer_pre_hooks", {})
    if not any(h is _check_synced for h in hooks.values()):
        optimizer_module.register_optimizer_step_pre_hook(_check_synced)
    for p in module.parameters():
        if p.requires_grad and not getattr(p, _GUARDED_ATTR, False):
            p.register_post_accumulate_grad_hook(_mark_dirty)
            setattr(p, _GUARDED_ATTR, True)


def _clear_dirty(params: list[torch.Tensor]) -> None:
    for p in params:
        if getattr(p, _DIRTY_ATTR, False):
            setattr(p, _DIRTY_ATTR, False)


def zero_optimizer_of(model: nn.Module) -> Any:
    """The engine.ZeroOptimizer that shards `model`'s optimizer state, if any."""
    for p in model.parameters():
        ref = getattr(p, ZERO_ATTR, None)
        if ref is not None:
            return ref()
    return None


def is_stage_split(model: nn.Module) -> bool:
    """True when `model`'s parameters are split over pipeline stages (engine.ParallelGPT)."""
    return any(getattr(m, STAGE_SPLIT_ATTR, False) for m in model.modules())


def sync_gradients(model: nn.Module, *, grid: Grid | None = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                   data: bool = True) -> None:
    """Make every gradient the single-process gradient of the mean loss over the global batch.

    A no-op inside `no_sync(model)`, and when nothing was accumulated since the last sync (so a
    second call never scales twice). `data=False` skips the data-parallel step; it is skipped too
    when an engine.ZeroOptimizer shards `model` (its step reduce-scatters over data instead). The
    scaling by 1/(G_data*G_intra_d) is always applied.
    """
    if getattr(model, _NO_SYNC_ATTR, False):
        return
    grid = current_grid(grid)
    params = _params_with_grads(model)
    guarded = [p for p in params if getattr(p, _GUARDED_ATTR, False)]
    if guarded and not any(getattr(p, _DIRTY_ATTR, False) for p in guarded):
        return
    reduce_depth_replicated(model, grid, bucket_bytes)
    if data and zero_optimizer_of(model) is None:
        all_reduce_bucketed([p.grad for p in params], grid.comm_group("data"), bucket_bytes)
    scale = 1.0 / grid.batch_shards
    if scale != 1.0:
        for p in params:
            p.grad.mul_(scale)
    _clear_dirty(params)


@contextlib.contextmanager
def no_sync(model: nn.Module) -> Iterator[None]:
    """Gradient accumulation: `sync_gradients(model)` does nothing inside; call it after the last
    micro-batch, outside. (The engine never syncs implicitly, so this exists for code written for
    DDP-style loops.)"""
    previous = getattr(model, _NO_SYNC_ATTR, False)
    setattr(model, _NO_SYNC_ATTR, True)
    try:
        yield
    finally:
        setattr(model, _NO_SYNC_ATTR, previous)


def replica_copies(p: torch.Tensor, grid: Grid) -> int:
    """How many tensor-parallel ranks (depth, row, col) hold the same local gradient of `p`."""
    spec = spec_of(p)
    axes = spec.replicated_axes() if spec is not None else ("depth", "row", "col")
    copies = 1
    for axis in axes:
        copies *= grid.size(axis)
    return copies


def reduce_norm_over_model(total: torch.Tensor, model: nn.Module, grid: Grid) -> None:
    """All-reduce a per-rank sum of |g|^p over the tensor axes, and over pipeline stages only when
    the model is split into stages (otherwise every stage holds the same parameters)."""
    axes = ("depth", "row", "col", "inter") if is_stage_split(model) else ("depth", "row", "col")
    for axis in axes:
        group = grid.comm_group(axis)
        if group is not None:
            dist.all_reduce(total, group=group)


def sum_of_powers(grads: list[torch.Tensor], weights: list[float], norm_type: float,
                  device: torch.device) -> torch.Tensor:
    """sum_i weights[i] * ||grads[i]||_p^p in float64, one fused norm kernel per dtype/device batch
    (no float64 copies of the gradients: those cost more than the step on a GPU)."""
    total = torch.zeros((), dtype=torch.float64, device=device)
    if not grads:
        return total
    norms = torch._foreach_norm(grads, norm_type)
    stacked = torch.stack([n.to(device=device, dtype=torch.float64) for n in norms])
    w = torch.tensor(weights, dtype=torch.float64, device=device)
    return total + (stacked.pow(norm_type) * w).sum()


def grad_norm(model: nn.Module, *, grid: Grid | None = None, norm_type: float = 2.0) -> torch.Tensor:
    """Norm of the full (unsharded) gradient of the whole model, on every rank; call after sync.

    Each rank sums |g|^p over its local gradients, weighting a tensor replicated over k tensor-parallel
    ranks by 1/k, then the sum is all-reduced over depth, row, col (and pipeline stages for a
    model split into stages). Under an engine.ZeroOptimizer the data-parallel reduce-scatter runs
    first and the norm is taken over the reduced shards (summed over data).
    """
    grid = current_grid(grid)
    zero = zero_optimizer_of(model)
    if zero is not None:
        return zero.grad_norm(norm_type=norm_type, model=model)
    params = [p for p in model.parameters() if p.grad is not None]
    total = sum_of_powers([p.grad.detach() for p in params], [1.0 / replica_copies(p, grid) for p in params],
                          norm_type, grid.device)
    reduce_norm_over_model(total, model, grid)
    return total.pow(1.0 / norm_type)


def clip_grad_norm_(model: nn.Module, max_norm: float, *, grid: Grid | None = None,
                    norm_type: float = 2.0) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ over the whole grid: same total norm and scaling as one process
    (under ZeRO-1 too: the norm of the data-reduced gradient, and its shards are scaled)."""
    grid = current_grid(grid)
    zero = zero_optimizer_of(model)
    if zero is not None:
        return zero.clip_grad_norm_(max_norm, norm_type=norm_type, model=model)
    norm = grad_norm(model, grid=grid, norm_type=norm_type)
    coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if grads:
        torch._foreach_mul_(grads, coef.to(dtype=grads[0].dtype))
    return norm.float()


# --------------------------------------------------------------------------------------------
# wrap and step
# --------------------------------------------------------------------------------------------


def _replicated_over(t: torch.Tensor, axis: str, is_param: bool) -> bool:
    if not is_param:
        return True
    spec = spec_of(t)
    if axis == "data":
        return True
    return spec is None or axis in spec.replicated_axes()


def broadcast_replicas(model: nn.Module, grid: Grid, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
    """Give every replica of each parameter and buffer the values of the first member of its
    group: over data for all of them, and over depth/row/col for those replicated there."""
    tensors = [(p, True) for p in model.parameters()] + [(b, False) for b in model.buffers()]
    with torch.no_grad():
        for axis in ("data", "depth", "row", "col"):
            group = grid.comm_group(axis)
            if group is None:
                continue
            src = dist.get_global_rank(group, 0)
            chosen = [t.data for t, is_param in tensors
                      if _replicated_over(t, axis, is_param) and t.numel() and t.is_floating_point()]
            others = [t.data for t, is_param in tensors
                      if _replicated_over(t, axis, is_param) and t.numel() and not t.is_floating_point()]
            for bucket in _buckets(sorted(chosen, key=lambda t: (str(t.dtype), str(t.device))), bucket_bytes):
                flat = _flatten_dense_tensors(bucket)
                dist.broadcast(flat, src=src, group=group)
                for t, synced in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                    t.copy_(synced)
            for t in others:  # integer buffers (BatchNorm's num_batches_tracked)
                dist.broadcast(t, src=src, group=group)


def wrap(model: nn.Module, *, grid: Grid | None = None, broadcast: bool = True) -> nn.Module:
    """Make `model` safe to train on the grid; returns it.

    Broadcasts parameters and buffers from the first member of each replica group (so replicas
    built with different seeds, or loaded differently, cannot drift), and installs the sync guard:
    an optimizer step after a backward without engine.sync_gradients raises. A model that is not
    split into pipeline stages on a grid with G_inter > 1 gets a warning: every stage would hold
    and compute all of it.
    """
    grid = current_grid(grid)
    if grid.size("inter") > 1 and not is_stage_split(model):
        warnings.warn(f"{type(model).__name__} is not split into pipeline stages but the grid has "
                      f"G_inter={grid.size('inter')}: every stage holds and computes the whole model "
                      "(use G_inter=1, or engine.ParallelGPT)", stacklevel=2)
    if broadcast and grid.world_size > 1:
        broadcast_replicas(model, grid)
    install_sync_guard(model, grid)
    return model


def step(model: nn.Module, optimizer: torch.optim.Optimizer, *, max_grad_norm: float | None = None,
         grid: Grid | None = None) -> torch.Tensor | None:
    """One optimizer step done right on the grid: synchronize gradients (unless already done since
    the last backward; ZeRO-1 reduces over data inside its step), clip them to `max_grad_norm`
    (returning the norm before clipping), then `optimizer.step()`."""
    if max_grad_norm is not None and not max_grad_norm > 0:
        raise ValueError(f"max_grad_norm must be positive, got {max_grad_norm!r}")
    grid = current_grid(grid)
    sync_gradients(model, grid=grid)
    norm = clip_grad_norm_(model, max_grad_norm, grid=grid) if max_grad_norm is not None else None
    optimizer.step()
    return norm
