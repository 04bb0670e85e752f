"""Collectives as conjugate autograd pairs, plus the plain flat helpers the engine uses.

Each function takes the ProcessGroup explicitly (from the grid); a `None` group (an axis of size
one) makes every function the identity, so nothing is sent and nothing is counted, exactly as
perfmodels.traffic assumes. The pairs (DESIGN.md section 1):

- `reduce_from(x, g)`: forward all-reduce (sum of partial results, in place on `x`: pass a fresh
  GEMM output that nothing saved for backward), backward identity.
- `copy_to(x, g)`: forward identity, backward all-reduce (a replicated input used with different
  weights on each member needs the sum of their input gradients).
- `gather_last(x, g)`: forward all-gather along the last dim, backward keeps this member's slice.
- `scatter_last(x, g)`: forward keeps this member's slice, backward all-gathers the gradient.

The depth pair (all-gather of a weight shard in forward and again in backward, reduce-scatter of
its gradient) lives in engine.linear, fused with the GEMM so the gathered weight is never saved.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

_all_gather_flat_op = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat_op = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def group_size(group: Any) -> int:
    return 1 if group is None else dist.get_world_size(group)


def group_rank(group: Any) -> int:
    return 0 if group is None else dist.get_rank(group)


def all_reduce_(t: torch.Tensor, group: Any, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
    """In-place all-reduce; a no-op on a None group."""
    if group is not None:
        dist.all_reduce(t, op=op, group=group)
    return t


def all_gather_flat(t: torch.Tensor, group: Any) -> torch.Tensor:
    """Concatenate every member's (equal-sized) flat tensor, in group-rank order."""
    if group is None:
        return t
    t = t.contiguous().view(-1)
    out = torch.empty(t.numel() * group_size(group), dtype=t.dtype, device=t.device)
    _all_gather_flat_op(out, t, group=group)
    return out


def all_gather_flat_into(out: torch.Tensor, t: torch.Tensor, group: Any) -> None:
    """`all_gather_flat` into a caller's flat buffer of group-size times `t`'s elements (ZeRO's
    parameter buffer: the gathered values land in the parameters themselves, no full-size output
    beside them). The group must not be None."""
    _all_gather_flat_op(out, t.contiguous().view(-1), group=group)


def all_gather_flat_async(t: torch.Tensor, group: Any) -> tuple[torch.Tensor, Any]:
    """`all_gather_flat` launched with async_op=True: (the output buffer, its Work; wait() before
    reading the buffer). `t` must stay alive and unchanged until then. The group must not be None."""
    t = t.contiguous().view(-1)
    out = torch.empty(t.numel() * group_size(group), dtype=t.dtype, device=t.device)
    work = _all_gather_flat_op(out, t, group=group, async_op=True)
    return out, work


def reduce_scatter_flat(t: torch.Tensor, group: Any) -> torch.Tensor:
    """Sum a flat tensor over the group and keep this member's equal chunk."""
    if group is None:
        return t
    t = t.contiguous().view(-1)
    out = torch.empty(t.numel() // group_size(group), dtype=t.dtype, device=t.device)
    _reduce_scatter_flat_op(out, t, group=group)
    return out


def reduce_scatter_consumed(t: torch.Tensor, group: Any) -> torch.Tensor:
    """`reduce_scatter_flat` of a buffer the caller owns and drops afterwards (ZeRO's padded flat
    gradient): returns a fresh tensor with this member's summed chunk.

    On gloo this is an in-place all-reduce of `t` followed by a copy of the chunk. gloo's
    reduce-scatter is itself an all-reduce on a full-size copy of its input (ProcessGroupGloo has
    no native reduce-scatter for CPU tensors): measured on 4 ranks, a 200 MB reduce_scatter_tensor
    raised each rank's peak RSS by 242 MB, an in-place all_reduce of the same buffer by 4 MB; the
    bytes on the wire are the same (an all-reduce either way). The call counts as one collective
    of the input's size on the group, as the reduce-scatter did. Other backends reduce-scatter.
    """
    if group is None:
        return t
    if dist.get_backend(group) != "gloo":
        return reduce_scatter_flat(t, group)
    t = t.contiguous().view(-1)
    dist.all_reduce(t, group=group)
    n = t.numel() // group_size(group)
    r = group_rank(group)
    return t[r * n:(r + 1) * n].clone()


def reduce_scatter_flat_async(t: torch.Tensor, group: Any) -> tuple[torch.Tensor, Any]:
    """`reduce_scatter_flat` launched with async_op=True: (this member's output chunk, its Work;
    wait() before reading it). The group must not be None."""
    t = t.contiguous().view(-1)
    out = torch.empty(t.numel() // group_size(group), dtype=t.dtype, device=t.device)
    work = _reduce_scatter_flat_op(out, t, group=group, async_op=True)
    return out, work


def _gather_last_dim(x: torch.Tensor, group: Any) -> torch.Tensor:
    p = group_size(group)
    flat = all_gather_flat(x.contiguous(), group)
    parts = flat.view(p, *x.shape)
    return torch.cat(list(parts.unbind(0)), dim=-1)


def _slice_last_dim(x: torch.Tensor, group: Any) -> torch.Tensor:
    p = group_size(group)
    return x.chunk(p, dim=-1)[group_rank(group)].contiguous()


class _ReduceFrom(torch.autograd.Function):
    """In place: the partial output of a GEMM is not saved by anyone for backward, so summing it
    where it lies saves a copy of every Linear's output (the clone cost ~7% of a step on a GPU)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        dist.all_reduce(x, group=group)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g, None


class _CopyTo(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        # each member multiplied the same input by its own weight slice, so the input's gradient is
        # the sum of theirs; a copy because autograd may hand the same `g` to other consumers
        g = g.clone()
        dist.all_reduce(g, group=ctx.group)
        return g, None


class _GatherLast(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return _gather_last_dim(x, group)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        # every member computed the same loss from the same gathered tensor, so each already holds
        # the full gradient: its own slice is its input's gradient, no reduction needed
        return _slice_last_dim(g, ctx.group), None


class _ScatterLast(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return _slice_last_dim(x, group)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        # the input was replicated and each member used only its slice: the input's gradient is the
        # sum of the members' contributions, each nonzero only on its own slice, i.e. their concat
        return _gather_last_dim(g, ctx.group), None


def reduce_from(x: torch.Tensor, group: Any) -> torch.Tensor:
    """Forward all-reduce (sum), backward identity."""
    return x if group is None else _ReduceFrom.apply(x, group)


def copy_to(x: torch.Tensor, group: Any) -> torch.Tensor:
    """Forward identity, backward all-reduce (sum)."""
    return x if group is None else _CopyTo.apply(x, group)


def gather_last(x: torch.Tensor, group: Any) -> torch.Tensor:
    """Forward all-gather along the last dim, backward slice."""
    return x if group is None else _GatherLast.apply(x, group)


def scatter_last(x: torch.Tensor, group: Any) -> torch.Tensor:
    """Forward slice along the last dim, backward all-gather."""
    return x if group is None else _ScatterLast.apply(x, group)
