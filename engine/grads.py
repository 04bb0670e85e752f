"""Gradient synchronization, gradient accumulation and norm clipping over the whole grid.

After backward, each rank's gradients hold the sum over its (data, depth) replica's local batch of
the local mean loss's gradient, with weight shards already reduce-scattered over depth by
engine.Linear. `sync_gradients` then
  1. all-reduces over depth the gradients of parameters replicated over depth (norms, biases,
     embeddings, plain layers): each depth rank saw different samples;        [depth, "depth_grad"]
  2. all-reduces over data every local gradient, in flat buckets;              [data, "dp_grad"]
     (with ZeRO-1/2, engine.ZeroOptimizer reduce-scatters instead; ZeRO-3, engine.Zero3, during
     backward)
  3. divides by G_data * G_intra_d,
which gives exactly the gradient of the mean loss over the global batch, as in single-process
training. Row/col replicas need no reduction: the conjugate collectives make their gradients equal.
The counts (one call per bucket, bytes = local gradient bytes) are perfmodels.traffic's.

Overlap (as DDP does it): `wrap(model)` gives the model an `_OverlappedReducer`. Its buckets hold
the trainable parameters in reverse order (backward produces the last layers' gradients first);
each parameter's post-accumulate-grad hook counts it ready, and a bucket whose parameters are all
ready is flattened and all-reduced over data with `async_op=True` while backward goes on (buckets
launch in index order on every rank, so the collectives match). `sync_gradients` launches what is
left (parameters without a gradient this step), waits, copies the sums back, then reduces over
depth and scales; the sum over data and depth commutes, so the result is the synchronous one.
Inside `no_sync(model)` (and for every micro-batch but the last in `forward_backward`) nothing
launches; in a pipeline a parameter counts as ready after its last micro-batch's backward (so
1F1B's buckets go out while the remaining micro-batches drain); a second backward without a sync
in between discards the in-flight sums and reduces synchronously. `overlap_grad_reduce(model,
False)` turns it off.

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

from engine.grid import GRID_ATTR, Grid, grid_of
from engine.shard import spec_of

DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024
_NO_SYNC_ATTR = "_gridtune_no_sync"
_OVERLAP_ATTR = "_gridtune_overlap"  # the model's _OverlappedReducer
_GUARDED_ATTR = "_gridtune_guarded"  # the parameter carries the post-accumulate hook below
_DIRTY_ATTR = "_gridtune_dirty"  # gradients accumulated since the last sync_gradients
ZERO_ATTR = "_gridtune_zero"  # weakref to the engine.ZeroOptimizer sharding this parameter's state
STAGE_SPLIT_ATTR = "_gridtune_stage_split"  # a module whose parameters are split over pipeline stages


def replicated_over_depth(p: torch.Tensor) -> bool:
    spec = spec_of(p)
    return spec is None or not spec.depth_flat


EXPERT_ATTR = "_gridtune_expert"  # engine.moe marks its expert weights: split over ep/etp, reduced over edp


def is_expert(p: torch.Tensor) -> bool:
    """A MoE expert weight (engine.moe): not replicated over data; its gradient is reduced over the
    expert-data group ("edp") instead."""
    return bool(getattr(p, EXPERT_ATTR, False))


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


def all_reduce_bucketed(tensors: list[torch.Tensor], group: object, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                        dtype: torch.dtype | None = None) -> None:
    """Sum each tensor over `group` in place, flattening them into buckets of at most `bucket_bytes`
    (summed in `dtype` when given: engine.MixedPrecision's reduce_dtype)."""
    tensors = [t for t in tensors if t.numel()]  # (engine.Zero3 leaves empty placeholders)
    if group is None or not tensors:
        return
    for bucket in _buckets(tensors, bucket_bytes):
        flat = _flatten_dense_tensors(bucket)
        if dtype is not None:
            flat = flat.to(dtype)
        dist.all_reduce(flat, group=group)
        for t, synced in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
            t.copy_(synced)


def _param_buckets(params: list[torch.Tensor], bucket_bytes: int) -> list[list[torch.Tensor]]:
    out: list[list[torch.Tensor]] = []
    size = 0
    for p in params:
        nb = p.numel() * p.element_size()
        if not out or size + nb > bucket_bytes or p.dtype != out[-1][0].dtype:
            out.append([])
            size = 0
        out[-1].append(p)
        size += nb
    return out


class _OverlappedReducer:
    """Data-parallel gradient all-reduce in buckets launched from post-accumulate-grad hooks."""

    def __init__(self, model: nn.Module, grid: Grid, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        import weakref

        self.model_ref = weakref.ref(model)
        self.group = grid.comm_group("data")
        self.enabled = True
        self.expected = 1  # backward passes per step that reach each parameter (a pipeline: micro-batches)
        # factor the schedule applies to the gradients after backward, which a gradient copied into
        # its bucket during backward has not seen (torch.distributed.pipelining's scale_grads)
        self.launch_scale = 1.0
        params = [p for p in model.parameters() if p.requires_grad and not is_expert(p)]
        self.buckets = _param_buckets(list(reversed(params)), bucket_bytes)
        self.index = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.offset: dict[int, int] = {}
        for bucket in self.buckets:
            offset = 0
            for p in bucket:
                self.offset[id(p)] = offset
                offset += p.numel()
        self._reset()
        for p in params:
            p.register_post_accumulate_grad_hook(self._ready)

    def _reset(self) -> None:
        self.ready = [0] * len(self.buckets)
        self.flats: list[torch.Tensor | None] = [None] * len(self.buckets)
        self.copied: list[set[int]] = [set() for _ in self.buckets]
        self.works: list[Any] = []
        self.next = 0
        self.stale = False
        self.active: bool | None = None  # decided at the first hook of a backward
        self.seen: dict[int, int] = {}

    def _decide(self) -> bool:
        model = self.model_ref()
        return (self.enabled and model is not None and not getattr(model, _NO_SYNC_ATTR, False)
                and zero_optimizer_of(model) is None)

    def _flat(self, i: int) -> torch.Tensor:
        flat = self.flats[i]
        if flat is None:
            bucket = self.buckets[i]
            model = self.model_ref()
            dtype = getattr(model, "_gridtune_reduce_dtype", None) if model is not None else None
            flat = self.flats[i] = torch.zeros(sum(p.numel() for p in bucket), dtype=dtype or bucket[0].dtype,
                                               device=bucket[0].device)
        return flat

    def _copy_in(self, i: int, p: torch.Tensor, scale: float) -> None:
        """Snapshot p's gradient into its bucket (DDP's bucket views): a schedule may rescale p.grad
        before the whole bucket is ready (interleaved 1F1B finishes one chunk before the other)."""
        offset = self.offset[id(p)]
        if p.grad is not None:
            view = self._flat(i)[offset:offset + p.numel()]
            view.copy_(p.grad.reshape(-1))
            if scale != 1.0:
                view.mul_(scale)
        self.copied[i].add(id(p))

    def _ready(self, p: torch.Tensor) -> None:
        if self.active is None:
            if not self._decide():
                return
            self.active = True
        i = self.index.get(id(p))
        if i is None:
            return
        if self.expected > 1:  # ready after its last micro-batch's backward
            n = self.seen[id(p)] = self.seen.get(id(p), 0) + 1
            if n < self.expected:
                return
        if i < self.next:  # a second backward before the sync: the in-flight sums are stale
            self.stale = True
            return
        self._copy_in(i, p, self.launch_scale)
        self.ready[i] += 1
        while self.next < len(self.buckets) and self.ready[self.next] >= len(self.buckets[self.next]):
            self._launch(self.next)

    def _launch(self, i: int) -> None:
        # only ever bucket `self.next`: NCCL matches collectives by issue order, and hooks fire in
        # a different order on different ranks, so every rank must launch bucket 0, 1, 2, ...
        for p in self.buckets[i]:  # parameters without a gradient in backward: their value now
            if id(p) not in self.copied[i]:
                self._copy_in(i, p, 1.0)
        flat = self._flat(i)
        self.works.append(dist.all_reduce(flat, group=self.group, async_op=True))
        self.next = i + 1

    def discard(self) -> None:
        for work in self.works:
            work.wait()
        self._reset()

    def finish(self) -> bool:
        """Complete the data all-reduce started in backward: True when the gradients now hold the
        sums over data; False (nothing launched, or stale) when the caller must reduce itself."""
        if not self.works or self.stale:
            self.discard()
            return False
        while self.next < len(self.buckets):
            self._launch(self.next)
        for work, flat, bucket in zip(self.works, self.flats, self.buckets):
            work.wait()
            assert flat is not None
            for p, synced in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                if p.grad is None:
                    p.grad = synced.to(p.dtype, copy=True)
                else:
                    p.grad.copy_(synced)
        self._reset()
        return True


def overlap_grad_reduce(model: nn.Module, enabled: bool = True) -> None:
    """Turn the data-parallel gradient reduction overlapped with backward on or off for a wrapped model."""
    if not isinstance(enabled, bool):
        raise ValueError(f"enabled must be True or False, got {enabled!r}")
    reducer = getattr(model, _OVERLAP_ATTR, None)
    if reducer is not None:
        reducer.discard()
        reducer.enabled = enabled


def install_overlap(model: nn.Module, grid: Grid, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
    """Give `model` its overlapped data-parallel reducer (nothing to do without a data group; a
    second call replaces the buckets, e.g. with another `bucket_bytes`)."""
    if grid.comm_group("data") is None:
        return
    old = getattr(model, _OVERLAP_ATTR, None)
    if old is not None:
        old.discard()
        old.enabled = False
    setattr(model, _OVERLAP_ATTR, _OverlappedReducer(model, grid, bucket_bytes))


def reduce_depth_replicated(model: nn.Module, grid: Grid, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
    params = _params_with_grads(model)
    all_reduce_bucketed([p.grad for p in params if replicated_over_depth(p)], grid.comm_group("depth"),
                        bucket_bytes)


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
                    f"{type(optimizer).__name__}.step(): call engine.sync_gradients(model) after backward, "
                    "or engine.step(model, optimizer), which syncs and steps")


def install_sync_guard(module: nn.Module, grid: Grid) -> None:
    """Mark `module`'s parameters so that an optimizer step after a backward without
    engine.sync_gradients raises. Nothing to do when the batch is not split (one replica)."""
    if grid.grad_shards == 1:
        return
    from torch.optim import optimizer as optimizer_module

    # one global optimizer pre-hook (registered once) sees every optimizer, including ones built
    # before wrap and user optimizers the engine never wraps
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
    grid = grid_of(model, grid)
    reducer = getattr(model, _OVERLAP_ATTR, None)
    params = _params_with_grads(model)
    guarded = [p for p in params if getattr(p, _GUARDED_ATTR, False)]
    if guarded and not any(getattr(p, _DIRTY_ATTR, False) for p in guarded):
        if reducer is not None:
            reducer.discard()
        return
    reduce_data = data and zero_optimizer_of(model) is None
    overlapped = False
    if reducer is not None:
        overlapped = reducer.finish() if reduce_data else (reducer.discard() or False)
    reduce_depth_replicated(model, grid, bucket_bytes)
    if reduce_data and not overlapped:
        all_reduce_bucketed([p.grad for p in params if not is_expert(p)], grid.comm_group("data"),
                            bucket_bytes, dtype=getattr(model, "_gridtune_reduce_dtype", None))
    experts = [p.grad for p in params if is_expert(p)]
    if experts and reduce_data:  # MoE experts: over the expert-data group (ZeRO: its own reduce-scatter)
        all_reduce_bucketed(experts, grid.expert_comm_group("edp"), bucket_bytes)
    scale = 1.0 / grid.grad_shards
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


def reduce_norm_over_model(total: torch.Tensor, model: nn.Module | None, grid: Grid,
                           extra: torch.Tensor | None = None) -> torch.Tensor:
    """All-reduce a per-rank sum of |g|^p over the tensor axes, add `extra` (a sum already complete
    over the stage: the MoE experts, `expert_power_sum`), then sum over pipeline stages only when
    the model is split into stages (otherwise every stage holds the same parameters; no model:
    not split). Returns the total (in place where possible)."""
    for axis in ("depth", "row", "col"):
        group = grid.comm_group(axis)
        if group is not None:
            dist.all_reduce(total, group=group)
    if extra is not None:
        total = total + extra
    inter = grid.comm_group("inter")
    if model is not None and is_stage_split(model) and inter is not None:
        dist.all_reduce(total, group=inter)
    return total


def expert_power_sum(grads: list[torch.Tensor], norm_type: float, grid: Grid, *,
                     shard_group: Any = None) -> torch.Tensor:
    """sum |g|^p over every MoE expert weight of this pipeline stage, each counted once, on every
    rank of the stage.

    An expert shard lives on one (etp, ep) position of the folded expert grid and is replicated over
    the expert-data group (engine.grid.expert_groups): summing this rank's experts over etp and ep
    covers every shard once, whichever edp member computes it, so the result is complete and equal
    on every rank of the stage and must not be summed over row/col/depth again (etp may differ
    from row: `reduce_norm_over_model` adds it after those axes). Under ZeRO the expert-data
    replicas hold different 1/G_edp shards of the reduced gradient (`shard_group`), summed first.
    Megatron-Core takes the same per-group sums (megatron/core/optimizer/clip_grads.py
    `get_grad_norm_fp32` with the expert model-parallel group for expert parameters)."""
    total = sum_of_powers(grads, [1.0] * len(grads), norm_type, grid.device)
    for group in (shard_group, grid.expert_comm_group("etp"), grid.expert_comm_group("ep")):
        if group is not None:
            dist.all_reduce(total, group=group)
    return total


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
    grid = grid_of(model, grid)
    zero = zero_optimizer_of(model)
    if zero is not None:
        return zero.grad_norm(norm_type=norm_type, model=model)
    params = [p for p in model.parameters() if p.grad is not None and not is_expert(p)]
    experts = [p.grad.detach() for p in model.parameters() if p.grad is not None and is_expert(p)]
    # MoE experts: distinct over etp and ep, alike over edp (expert_power_sum)
    extra = expert_power_sum(experts, norm_type, grid) if experts else None
    return global_norm([p.grad.detach() for p in params], [1.0 / replica_copies(p, grid) for p in params],
                       norm_type, grid, model, extra=extra)


def flat_slice_pieces(grad: torch.Tensor, lo: int, hi: int, params: list[torch.Tensor], numels: list[int],
                      grid: Grid) -> tuple[list[torch.Tensor], list[float]]:
    """`grad` holds elements [lo, hi) of the flat concatenation of `params` (a ZeRO shard): cut it
    at parameter boundaries, each piece weighted 1 / (tensor-parallel ranks holding the same values),
    ready for `global_norm`. `numels` are the parameters' full sizes (engine.Zero3 empties a
    parameter's data while its unit is not gathered)."""
    pieces, weights = [], []
    offset = 0
    for p, n in zip(params, numels):
        a, b = max(lo, offset), min(hi, offset + n)
        if a < b:
            pieces.append(grad[a - lo:b - lo])
            weights.append(1.0 / replica_copies(p, grid))
        offset += n
    return pieces, weights


def global_norm(grads: list[torch.Tensor], weights: list[float], norm_type: float, grid: Grid,
                model: nn.Module | None, *, data_sharded: bool = False,
                extra: torch.Tensor | None = None, data_group: Any = None) -> torch.Tensor:
    """The p-norm of the whole model's gradient, on every rank, from this rank's part of it.

    `grads[i]` weighs `weights[i]` (1/k for a tensor k tensor-parallel ranks hold alike, so the sum
    over the tensor axes counts it once). `data_sharded`: each data rank holds a different shard of
    the data-reduced gradient (ZeRO 1-3), so the sum runs over data too; otherwise the data replicas
    hold the same gradient and summing over them would count it G_data times. Pipeline stages are
    summed only for a `model` split into stages (`reduce_norm_over_model`). The one norm that
    `grad_norm`, `ZeroOptimizer.grad_norm` and `Zero3.grad_norm` all take. `extra`: a sum of
    powers already complete over the stage (the MoE experts: `expert_power_sum`), added after the
    tensor axes.
    """
    total = sum_of_powers(grads, weights, norm_type, grid.device)
    # the group the shards are spread over (ZeRO's; a HybridShard Zero3's shard group)
    data = (data_group if data_group is not None else grid.comm_group("data")) if data_sharded else None
    if data is not None:
        dist.all_reduce(total, group=data)
    # `extra`: a part already complete over the stage (MoE experts, expert_power_sum)
    total = reduce_norm_over_model(total, model, grid, extra)
    return total.pow(1.0 / norm_type)


def clip_coefficient(norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_'s factor: max_norm / (norm + 1e-6), never above one."""
    return (max_norm / (norm + 1e-6)).clamp(max=1.0)


class ShardedGradNorm:
    """`grad_norm` and `clip_grad_norm_` of an optimizer whose gradient lives in data-reduced shards
    (engine.ZeroOptimizer, engine.Zero3). The optimizer supplies `grid`, `reduce_gradients()`,
    `_weighted_pieces()` (its dense shard's gradient cut at parameter boundaries, see
    flat_slice_pieces), `_expert_pieces()` (its MoE expert shards' gradients, sharded over the
    expert-data group) and `_grad_shards()` (the tensors whose gradients clipping scales)."""

    grid: Grid

    def _norm_model(self, model: nn.Module | None) -> nn.Module | None:
        """The model whose stage split decides whether the norm sums over pipeline stages."""
        return model

    @torch.no_grad()
    def grad_norm(self, *, norm_type: float = 2.0, model: nn.Module | None = None) -> torch.Tensor:
        """Norm of the full data-reduced gradient (collective over data and the tensor axes)."""
        self.reduce_gradients()  # type: ignore[attr-defined]
        pieces, weights = self._weighted_pieces()  # type: ignore[attr-defined]
        experts = self._expert_pieces()
        extra = None
        if experts is not None:  # MoE experts: their shards over the expert-data group, then etp x ep
            extra = expert_power_sum(experts, norm_type, self.grid, shard_group=self._expert_shard_group())
        return global_norm(pieces, weights, norm_type, self.grid, self._norm_model(model), data_sharded=True,
                           data_group=getattr(self, "group", None), extra=extra)

    def _expert_pieces(self) -> list[torch.Tensor] | None:
        """This rank's reduced gradient shards of MoE expert weights; None when the model has none
        (the same answer on every rank of a stage, so the collectives match)."""
        return None

    def _expert_shard_group(self) -> Any:
        """The group the expert shards are spread over (the expert-data group)."""
        return self.grid.expert_comm_group("edp")

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, *, norm_type: float = 2.0,
                        model: nn.Module | None = None) -> torch.Tensor:
        norm = self.grad_norm(norm_type=norm_type, model=model)
        coef = clip_coefficient(norm, max_norm)
        for shard in self._grad_shards():  # type: ignore[attr-defined]
            if shard.grad is not None:
                shard.grad.mul_(coef.to(device=shard.grad.device, dtype=shard.grad.dtype))
        return norm.float()


def restore_hyperparameters(param_groups: list[dict[str, Any]], saved: list[dict[str, Any]],
                            source: str) -> None:
    """Write saved per-group hyperparameters (lr, betas, ...) into an optimizer's `param_groups`."""
    if len(saved) != len(param_groups):
        raise ValueError(f"{source} has {len(saved)} optimizer parameter groups, "
                         f"the optimizer {len(param_groups)}")
    for group, values in zip(param_groups, saved):
        group.update(values)


def clip_grad_norm_(model: nn.Module | Any, max_norm: float, norm_type: float = 2.0, *,
                    grid: Grid | None = None) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ over the whole grid: same total norm and scaling as one process
    (under ZeRO-1 too: the norm of the data-reduced gradient, and its shards are scaled).

    `model` may also be what torch's takes: a tensor or an iterable of parameters
    (`engine.clip_grad_norm_(model.parameters(), 1.0)`); their norm is then summed over the tensor
    axes (each replicated tensor counted once) and, when they belong to a model split into pipeline
    stages, over the stages."""
    if not isinstance(model, nn.Module):
        return _clip_parameters(model, max_norm, norm_type, grid)
    grid = grid_of(model, grid)
    zero = zero_optimizer_of(model)
    if zero is not None:
        return zero.clip_grad_norm_(max_norm, norm_type=norm_type, model=model)
    norm = grad_norm(model, grid=grid, norm_type=norm_type)
    coef = clip_coefficient(norm, max_norm)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if grads:
        torch._foreach_mul_(grads, coef.to(dtype=grads[0].dtype))
    return norm.float()


@torch.no_grad()
def _clip_parameters(parameters: Any, max_norm: float, norm_type: float, grid: Grid | None) -> torch.Tensor:
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    grid = grid if grid is not None else _grid_of_params(params)
    with_grads = [p for p in params if p.grad is not None]
    dense = [p for p in with_grads if not is_expert(p)]
    experts = [p.grad for p in with_grads if is_expert(p)]
    extra = expert_power_sum(experts, norm_type, grid) if experts else None
    split = any(getattr(p, _STAGE_PARAM_ATTR, False) for p in params)
    norm = global_norm([p.grad for p in dense], [1.0 / replica_copies(p, grid) for p in dense], norm_type,
                       grid, _StageSplit() if split else None, extra=extra)
    coef = clip_coefficient(norm, max_norm)
    grads = [p.grad for p in with_grads]
    if grads:
        torch._foreach_mul_(grads, coef.to(dtype=grads[0].dtype))
    return norm.float()


_STAGE_PARAM_ATTR = "_gridtune_stage_split_param"  # set by wrap on the parameters of a stage-split model


class _StageSplit(nn.Module):
    """Stands for "a model split into pipeline stages" where only parameters were given."""

    def __init__(self) -> None:
        super().__init__()
        setattr(self, STAGE_SPLIT_ATTR, True)


_PARAM_GRID_ATTR = "_gridtune_param_grid"


def _grid_of_params(params: list[torch.Tensor]) -> Grid:
    """The grid the parameters' model was wrapped on (engine.wrap), else the last engine.init's."""
    from engine.grid import current_grid

    for p in params:
        found = getattr(p, _PARAM_GRID_ATTR, None)
        if isinstance(found, Grid):
            return found
    return current_grid()


# --------------------------------------------------------------------------------------------
# wrap and step
# --------------------------------------------------------------------------------------------


def _replicated_over(t: torch.Tensor, axis: str, is_param: bool) -> bool:
    if not is_param:
        return True
    if is_expert(t):  # split over ep/etp; equal over edp by construction (engine.moe)
        return False
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
            src = dist.get_global_rank(group, 0)  # broadcast takes a world rank, not a group rank
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


def _check_tied_embeddings(model: nn.Module, grid: Grid) -> None:
    """A vocabulary-parallel embedding's rows (split over row) are a Linear head's local block only
    when the head splits nothing else: G_intra_c = G_intra_d = 1."""
    from engine.vocab_embedding import VocabParallelEmbedding

    if grid.size("col") == 1 and grid.size("depth") == 1:
        return
    tables = {id(m.weight) for m in model.modules() if isinstance(m, VocabParallelEmbedding)}
    for name, m in model.named_modules():
        if not isinstance(m, VocabParallelEmbedding) and id(getattr(m, "weight", None)) in tables:
            raise ValueError(f"{name}.weight is tied to a vocabulary-parallel embedding, which only works "
                             f"with G_intra_c=1 and G_intra_d=1 (got G_intra_c={grid.size('col')}, "
                             f"G_intra_d={grid.size('depth')})")


def wrap(model: nn.Module, *, grid: Grid | None = None, broadcast: bool = True,
         overlap_grad_reduce: bool = True, prefetch_depth: bool = True) -> nn.Module:
    """Make `model` safe to train on the grid; returns it.

    Broadcasts parameters and buffers from the first member of each replica group (so replicas
    built with different seeds, or loaded differently, cannot drift), and installs the sync guard:
    an optimizer step after a backward without engine.sync_gradients raises; with
    `overlap_grad_reduce` (default) the data all-reduce runs in buckets during backward; with
    `prefetch_depth` (default; G_intra_d > 1) each depth-sharded layer launches the next layer's
    weight all-gather asynchronously (engine.linear.prefetch_depth). A model that is not
    split into pipeline stages on a grid with G_inter > 1 gets a warning: every stage would hold
    and compute all of it.
    """
    grid = grid_of(model, grid)
    setattr(model, GRID_ATTR, grid)  # what sync_gradients, step and checkpoints use when not given grid=
    split = is_stage_split(model)
    for p in model.parameters():  # clip_grad_norm_(model.parameters(), ...) finds both from a parameter
        setattr(p, _PARAM_GRID_ATTR, grid)
        setattr(p, _STAGE_PARAM_ATTR, split)
    _check_tied_embeddings(model, grid)
    if grid.size("inter") > 1 and not is_stage_split(model):
        warnings.warn(f"{type(model).__name__} is not split into pipeline stages but the grid has "
                      f"G_inter={grid.size('inter')}: every stage holds and computes the whole model "
                      "(use G_inter=1, or engine.ParallelGPT)", stacklevel=2)
    if broadcast and grid.world_size > 1:
        broadcast_replicas(model, grid)
    install_sync_guard(model, grid)
    if overlap_grad_reduce:
        install_overlap(model, grid)
    if grid.comm_group("depth") is not None:
        from engine.linear import prefetch_depth as chain

        chain(model, prefetch_depth)
    return model


def step(model: nn.Module, optimizer: torch.optim.Optimizer, *, max_grad_norm: float | None = None,
         grid: Grid | None = None) -> torch.Tensor | None:
    """One optimizer step done right on the grid: synchronize gradients (unless already done since
    the last backward; ZeRO-1 reduces over data inside its step), clip them to `max_grad_norm`
    (returning the norm before clipping), then `optimizer.step()`."""
    if max_grad_norm is not None and not max_grad_norm > 0:
        raise ValueError(f"max_grad_norm must be positive, got {max_grad_norm!r}")
    grid = grid_of(model, grid)
    sync_gradients(model, grid=grid)
    norm = clip_grad_norm_(model, max_grad_norm, grid=grid) if max_grad_norm is not None else None
    optimizer.step()
    return norm
