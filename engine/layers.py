"""Layout-aware layers of the parallel transformer, besides engine.Linear.

- `ParallelLayerNorm`: LayerNorm over features split over a group (the residual stream is split
  over col). Statistics are all-reduced instead of gathering activations: forward one fp32
  all-reduce of [T, 2] (sum, sum of squares), backward one of [T, 2] (sum of g*gamma and of
  g*gamma*xhat), as perfmodels.traffic counts ("norm" events).
- `SplitEmbedding`: an embedding table split along the hidden dim over col; a lookup returns the
  col-split activation directly, with no communication.
- `vocab_parallel_cross_entropy`: mean cross entropy over logits whose vocabulary is split over
  row (and padded): three fp32 all-reduces over row of [T] (max, sum of exponentials, target
  logit) in forward, none in backward ("loss" events).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from engine.comm import all_reduce_ as _all_reduce
from engine.comm import group_rank, group_size
from engine.shard import ShardSpec, mark, tensor_chunks


class _SplitLayerNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, group: Any,
                full_features: int, eps: float) -> torch.Tensor:
        xf = x.float()
        # one pass for the local statistics (Welford), then the group's: every member holds the same
        # number of features, so the global mean is the mean of the local means and
        # E[x^2] = mean over members of (var_local + mean_local^2)
        var_l, mean_l = torch.var_mean(xf, dim=-1, correction=0, keepdim=True)
        stats = torch.cat([mean_l, torch.addcmul(var_l, mean_l, mean_l)], dim=-1)
        _all_reduce(stats, group)
        stats = stats / group_size(group)
        mean = stats[..., 0:1]
        var = (stats[..., 1:2] - mean * mean).clamp_min(0)
        rstd = torch.rsqrt(var + eps)
        xhat = (xf - mean).mul_(rstd)
        ctx.save_for_backward(xhat, rstd, weight)
        ctx.group, ctx.n = group, full_features
        return torch.addcmul(bias, xhat, weight).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        xhat, rstd, weight = ctx.saved_tensors
        gf = g.float()
        gx = gf * weight
        # dx needs mean(g*gamma) and mean(g*gamma*xhat) over all features, which are spread over
        # the group: one all-reduce of the two local sums instead of gathering g and xhat
        sums = torch.stack([gx.sum(-1), (gx * xhat).sum(-1)], dim=-1)
        _all_reduce(sums, ctx.group)
        sums = sums / ctx.n
        dx = torch.addcmul(gx.sub_(sums[..., 0:1]), xhat, sums[..., 1:2], value=-1.0).mul_(rstd)
        lead = tuple(range(g.dim() - 1))
        dw = (gf * xhat).sum(lead)
        db = gf.sum(lead)
        return dx.to(g.dtype), dw.to(weight.dtype), db.to(weight.dtype), None, None, None


class ParallelLayerNorm(nn.Module):
    """LayerNorm(hidden) whose input holds hidden/G features of a group of G ranks (contiguous part
    `group_rank`); gamma and beta are split the same way (replicated over the other axes)."""

    def __init__(self, hidden_size: int, group: Any, *, eps: float = 1e-5, split_axis: str = "col",
                 weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                 device: Any = None) -> None:
        super().__init__()
        self.group, self.hidden_size, self.eps = group, hidden_size, eps
        p, r = group_size(group), group_rank(group)
        n = hidden_size // p
        spec = ShardSpec(full_shape=(hidden_size,), col_dim=0 if split_axis == "col" else None,
                         row_dim=0 if split_axis == "row" else None)
        mine = slice(r * n, (r + 1) * n)
        w = torch.ones(n, device=device) if weight is None else weight.detach()[mine].clone().to(device)
        b = torch.zeros(n, device=device) if bias is None else bias.detach()[mine].clone().to(device)
        self.weight = mark(nn.Parameter(w), spec)
        self.bias = mark(nn.Parameter(b), spec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.group is None:  # all features here: torch's fused kernel
            return F.layer_norm(x, (self.hidden_size,), self.weight, self.bias, self.eps)
        return _SplitLayerNormFn.apply(x, self.weight, self.bias, self.group, self.hidden_size, self.eps)


class SplitEmbedding(nn.Module):
    """Embedding(num, hidden) with the hidden dim split over a group (col): returns [*, hidden/G]."""

    def __init__(self, num_embeddings: int, hidden_size: int, group: Any, *,
                 weight: torch.Tensor | None = None,
                 split_axis: str = "col", chunks: Iterable[tuple[int, torch.Tensor]] | None = None,
                 device: Any = None) -> None:
        """Values from `weight` (a full table), from `chunks` (row chunks of the full table, see
        engine.shard.materialize; only this rank's columns are kept), or drawn for this shard alone."""
        super().__init__()
        p, r = group_size(group), group_rank(group)
        spec = ShardSpec(full_shape=(num_embeddings, hidden_size), col_dim=1 if split_axis == "col" else None,
                         row_dim=1 if split_axis == "row" else None)
        if weight is not None:
            chunks = tensor_chunks(weight)
        n = hidden_size // p
        if chunks is None:
            local = torch.empty(num_embeddings, n, device=device).normal_()  # torch.nn.Embedding's init
        else:
            local = torch.zeros(num_embeddings, n, device=device)
            for start, t in chunks:
                local[start:start + t.shape[0]] = t[:, r * n:(r + 1) * n].to(local.device)
        self.weight = mark(nn.Parameter(local), spec)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return F.embedding(idx, self.weight)


class _VocabParallelCEFn(torch.autograd.Function):
    """Works in one fp32 buffer of the local logits' size (in place: max, shift, exp, normalize), so
    peak memory is the bf16 logits plus 4 bytes per local logit, as perfmodels.memory counts it;
    the probabilities it saves become the gradient in place in backward."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, group: Any, vocab_start: int,
                vocab_size: int) -> torch.Tensor:
        lf = logits.reshape(-1, logits.shape[-1]).float()
        if lf.data_ptr() == logits.data_ptr():
            lf = lf.clone()  # fp32 logits: never write into the caller's tensor
        t = targets.reshape(-1)
        local_v = lf.shape[-1]
        if vocab_start + local_v > vocab_size:  # padded vocabulary rows never win
            lf[:, max(0, vocab_size - vocab_start):] = float("-inf")
        mx = lf.max(dim=-1).values
        # the global max keeps exp() finite on every member; the target logit lives on one member
        # only (the others contribute 0), and the softmax denominator sums over the whole vocabulary
        _all_reduce(mx, group, dist.ReduceOp.MAX)
        lf.sub_(mx.unsqueeze(-1))
        local_t = t - vocab_start
        mine = (local_t >= 0) & (local_t < local_v)
        local_t = local_t.clamp(0, local_v - 1)
        tl = lf.gather(1, local_t.unsqueeze(1)).squeeze(1) * mine
        _all_reduce(tl, group)
        lf.exp_()
        sum_e = lf.sum(-1)
        _all_reduce(sum_e, group)
        loss = (sum_e.log() - tl).mean()
        probs = lf.div_(sum_e.unsqueeze(-1))
        ctx.save_for_backward(probs, local_t, mine)
        ctx.shape, ctx.dtype = logits.shape, logits.dtype
        return loss

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        probs, local_t, mine = ctx.saved_tensors
        grad = probs  # used once: backward runs once per forward (no retain_graph on the loss)
        rows = torch.arange(grad.shape[0], device=grad.device)
        grad[rows, local_t] -= mine.to(grad.dtype)
        grad.mul_(g / grad.shape[0])
        return grad.view(ctx.shape).to(ctx.dtype), None, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, group: Any, vocab_start: int,
                                 vocab_size: int) -> torch.Tensor:
    """Mean cross entropy; `logits` [..., V_local] hold vocabulary ids [vocab_start, vocab_start+V_local)
    of a vocabulary split over `group`; ids >= vocab_size are padding and never win."""
    if group is None:  # the whole (padded) vocabulary is here: torch's kernel on the real ids
        flat = logits[..., :vocab_size].reshape(-1, vocab_size)
        return F.cross_entropy(flat, targets.reshape(-1))
    return _VocabParallelCEFn.apply(logits, targets, group, vocab_start, vocab_size)
