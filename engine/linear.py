"""`engine.Linear`: AxoNN's 3D-parallel Linear (DESIGN.md section 1), normal and transposed.

Normal Linear(k -> n): input [*, k/G_c] (features split over col, replicated over row), output
[*, n/G_r] (split over row, replicated over col). Transposed: input split over row, output over
col. Alternating the two (QKV then out-proj, fc1 then fc2) needs no layout conversion.

Per call, exactly the collectives perfmodels.traffic counts (each skipped on a group of size 1):
  fwd  all-gather of the weight shard over depth   (fused with the GEMM; the gathered weight is
                                                    not kept for backward, so ...)
  bwd  all-gather of the weight shard again        (... backward gathers it again)
  bwd  reduce-scatter of the weight grad over depth
  fwd  all-reduce of the partial output            normal: col, transposed: row
  bwd  all-reduce of the input grad                normal: row, transposed: col

Initialization draws the full weight exactly as `torch.nn.Linear` does (same RNG calls, same
order) and keeps this rank's slice, so `engine.full_state_dict` of a model built with the same seed
equals the single-process model's `state_dict()`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.comm import all_gather_flat, copy_to, reduce_from, reduce_scatter_flat
from engine.grid import Grid, GridError, current_grid
from engine.shard import ShardSpec, mark


class _DepthShardedLinearFn(torch.autograd.Function):
    """y = x @ W^T with W gathered over depth in forward and again in backward (never saved)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w_shard: torch.Tensor, block_shape: tuple[int, int],
                depth_group: Any) -> torch.Tensor:
        w = all_gather_flat(w_shard, depth_group).view(block_shape)
        ctx.save_for_backward(x, w_shard)
        ctx.block_shape = block_shape
        ctx.depth_group = depth_group
        return F.linear(x, w)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None]:
        x, w_shard = ctx.saved_tensors
        w = all_gather_flat(w_shard, ctx.depth_group).view(ctx.block_shape)
        grad_x = g.matmul(w) if ctx.needs_input_grad[0] else None
        grad_w = None
        if ctx.needs_input_grad[1]:
            n, k = ctx.block_shape
            full = g.reshape(-1, n).t().matmul(x.reshape(-1, k))
            grad_w = reduce_scatter_flat(full, ctx.depth_group).view_as(w_shard)
        return grad_x, grad_w, None, None


def linear_specs(in_features: int, out_features: int, bias: bool, transpose: bool,
                 padded_out: int | None = None) -> tuple[ShardSpec, ShardSpec | None]:
    """ShardSpecs of the weight [out, in] and bias [out] of a 3D Linear."""
    w_spec = ShardSpec(full_shape=(out_features, in_features), row_dim=1 if transpose else 0,
                       col_dim=0 if transpose else 1, depth_flat=True, padded_dim0=padded_out)
    b_spec = None
    if bias:
        b_spec = ShardSpec(full_shape=(out_features,), row_dim=None if transpose else 0,
                           col_dim=0 if transpose else None, padded_dim0=padded_out)
    return w_spec, b_spec


def split_problems(in_features: int, out_features: int, transpose: bool, degrees: dict[str, int],
                   padded_out: int | None = None) -> list[str]:
    """Why a Linear of these shapes cannot be split on this grid (empty when it can)."""
    n = padded_out or out_features
    out_axis, in_axis = ("col", "row") if transpose else ("row", "col")
    fields = {"row": "G_intra_r", "col": "G_intra_c"}
    problems = []
    if n % degrees[out_axis]:
        problems.append(f"{fields[out_axis]}={degrees[out_axis]} does not divide out_features={n}")
    if in_features % degrees[in_axis]:
        problems.append(f"{fields[in_axis]}={degrees[in_axis]} does not divide in_features={in_features}")
    if not problems:
        block = (n // degrees[out_axis]) * (in_features // degrees[in_axis])
        if block % degrees["depth"]:
            problems.append(
                f"G_intra_d={degrees['depth']} does not divide the weight block of "
                f"(out_features/{fields[out_axis]})*(in_features/{fields[in_axis]}) = {block} elements"
            )
    return problems


class Linear(nn.Module):
    """3D-parallel Linear; see the module docstring for layouts and traffic.

    `weight` is this rank's flat depth shard of its (row, col) block; `bias` this rank's slice of
    the output features (replicated over the other tensor axis and over depth).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, transpose: bool = False, *,
                 grid: Grid | None = None, padded_out_features: int | None = None,
                 _full_weight: torch.Tensor | None = None, _full_bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.grid = current_grid(grid)
        self.in_features, self.out_features = in_features, out_features
        self.transpose = transpose
        problems = split_problems(in_features, out_features, transpose, self.grid.degrees, padded_out_features)
        if problems:
            raise GridError(f"engine.Linear({in_features}, {out_features}, transpose={transpose}) on grid "
                            f"{self.grid.describe()}: " + "; ".join(problems))
        if _full_weight is None:
            _full_weight = torch.empty(out_features, in_features)
            nn.init.kaiming_uniform_(_full_weight, a=math.sqrt(5))  # what torch.nn.Linear does
            if bias:
                bound = 1 / math.sqrt(in_features) if in_features > 0 else 0
                _full_bias = torch.empty(out_features).uniform_(-bound, bound)
        self.w_spec, self.b_spec = linear_specs(in_features, out_features, bias, transpose, padded_out_features)
        g = self.grid
        self.block_shape = self.w_spec.block_shape(g.degrees)
        self.weight = nn.Parameter(self.w_spec.shard(_full_weight.detach(), g.coords, g.degrees).to(g.device))
        mark(self.weight, self.w_spec)
        if bias:
            assert self.b_spec is not None and _full_bias is not None
            self.bias = nn.Parameter(self.b_spec.shard(_full_bias.detach(), g.coords, g.degrees).to(g.device))
            mark(self.bias, self.b_spec)
        else:
            self.register_parameter("bias", None)
        self.in_group = g.group("col" if transpose else "row")  # input grad all-reduce
        self.out_group = g.group("row" if transpose else "col")  # partial output all-reduce

    @classmethod
    def from_dense(cls, dense: nn.Linear, *, transpose: bool = False, grid: Grid | None = None,
                   padded_out_features: int | None = None) -> Linear:
        """Shard an existing torch.nn.Linear (same values, this rank's slice)."""
        return cls(dense.in_features, dense.out_features, dense.bias is not None, transpose, grid=grid,
                   padded_out_features=padded_out_features, _full_weight=dense.weight.detach(),
                   _full_bias=None if dense.bias is None else dense.bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = copy_to(x, self.in_group)
        depth = self.grid.group("depth")
        if depth is None:  # nothing to gather: plain autograd (and the bias fused when no reduction follows)
            fused_bias = self.bias if self.out_group is None else None
            y = F.linear(x, self.weight.view(self.block_shape), fused_bias)
            if self.out_group is None:
                return y
        else:
            y = _DepthShardedLinearFn.apply(x, self.weight, self.block_shape, depth)
        y = reduce_from(y, self.out_group)
        if self.bias is not None:
            y = y + self.bias
        return y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, transpose={self.transpose}, grid=({self.grid.describe()})")
