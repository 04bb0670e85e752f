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
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from engine.grid import Grid, current_grid
from engine.shard import spec_of

DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024
_NO_SYNC_ATTR = "_gridtune_no_sync"


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
    all_reduce_bucketed([p.grad for p in params if replicated_over_depth(p)], grid.group("depth"), bucket_bytes)


def sync_gradients(model: nn.Module, *, grid: Grid | None = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                   data: bool = True) -> None:
    """Make every gradient the single-process gradient of the mean loss over the global batch.

    A no-op inside `no_sync(model)`. `data=False` skips the data-parallel step (ZeRO-1 does it
    itself with a reduce-scatter); the scaling by 1/(G_data*G_intra_d) is still applied.
    """
    if getattr(model, _NO_SYNC_ATTR, False):
        return
    grid = current_grid(grid)
    params = _params_with_grads(model)
    reduce_depth_replicated(model, grid, bucket_bytes)
    if data:
        all_reduce_bucketed([p.grad for p in params], grid.group("data"), bucket_bytes)
    scale = 1.0 / grid.batch_shards
    if scale != 1.0:
        for p in params:
            p.grad.mul_(scale)


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


def grad_norm(model: nn.Module, *, grid: Grid | None = None, norm_type: float = 2.0) -> torch.Tensor:
    """Norm of the full (unsharded) gradient of the whole model, on every rank; call after sync.

    Each rank sums |g|^p over its local gradients, weighting a tensor replicated over k tensor-parallel
    ranks by 1/k, then the sum is all-reduced over depth, row, col and pipeline stages.
    """
    grid = current_grid(grid)
    total = torch.zeros((), dtype=torch.float64, device=grid.device)
    for p in model.parameters():
        if p.grad is None:
            continue
        spec = spec_of(p)
        axes = spec.replicated_axes() if spec is not None else ("depth", "row", "col")
        copies = 1
        for axis in axes:
            copies *= grid.size(axis)
        total += p.grad.detach().double().abs().pow(norm_type).sum() / copies
    for axis in ("depth", "row", "col", "inter"):
        group = grid.group(axis)
        if group is not None:
            dist.all_reduce(total, group=group)
    return total.pow(1.0 / norm_type)


def clip_grad_norm_(model: nn.Module, max_norm: float, *, grid: Grid | None = None,
                    norm_type: float = 2.0) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ over the whole grid: same total norm and scaling as one process."""
    norm = grad_norm(model, grid=grid, norm_type=norm_type)
    coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for p in model.parameters():
        if p.grad is not None:
            p.grad.mul_(coef.to(p.grad.dtype))
    return norm.float()
