"""`engine.Linear` (drop-in, full activations) and `engine.ShardedLinear` (3D layout in and out):
AxoNN's 3D-parallel Linear (DESIGN.md section 1), normal and transposed.

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

Depth prefetch (AxoNN's optimize_communication; `prefetch_depth(model)`, on by default through
`engine.wrap`): consecutive depth-sharded layers (module order) are chained; when a layer's forward
starts it launches the next layer's weight all-gather with async_op=True, and when a layer's
backward starts it launches the previous layer's backward all-gather the same way, so each gather
runs while the current layer gathers, multiplies and reduces; the layer waits on the handle when
it uses the weight. Same calls and bytes as without (every prefetched gather replaces the one the
layer would have issued). In backward the weight gradient is computed first and its depth
reduce-scatter launched with async_op=True, so it runs behind the input-gradient GEMM.

Initialization draws the full weight exactly as `torch.nn.Linear` does (same RNG calls, same
order), chunk by chunk, and keeps only this rank's slice, so `engine.full_state_dict` of a model
built with the same seed equals the single-process model's `state_dict()` while peak memory grows
with the shard, not with the layer.
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.comm import (
    all_gather_flat,
    all_gather_flat_async,
    copy_to,
    gather_last,
    reduce_from,
    reduce_scatter_flat_async,
    scatter_last,
)
from engine.grads import install_sync_guard
from engine.grid import Grid, GridError, current_grid
from engine.shard import ShardSpec, drawn_chunks, mark, materialize, spec_of, tensor_chunks


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast computes matmuls in on this device type, or None when it is off."""
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


class _DepthShardedLinearFn(torch.autograd.Function):
    """y = x @ W^T with W gathered over depth in forward and again in backward (never saved).

    Under autocast the shard is cast to the autocast dtype before it is gathered (half the bytes,
    as perfmodels.traffic counts with the training dtype), the GEMMs run in that dtype, and the
    weight gradient is reduce-scattered in it and handed back in the parameter's dtype: the same
    dtypes torch.nn.Linear gets under autocast, on every grid. `in_out`: the block is stored as
    [in, out] (transformers' Conv1D layout), so it is used transposed.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w_shard: torch.Tensor, block_shape: tuple[int, int],
                depth_group: Any, compute_dtype: torch.dtype | None, in_out: bool = False,
                gathered: torch.Tensor | None = None, layer: ShardedLinear | None = None) -> torch.Tensor:
        dtype = compute_dtype or torch.promote_types(x.dtype, w_shard.dtype)
        xc = x.to(dtype)
        if gathered is None:  # not prefetched by the previous layer
            gathered = all_gather_flat(w_shard.to(dtype), depth_group)
        w = gathered.view(block_shape)
        ctx.save_for_backward(xc, w_shard)
        ctx.block_shape, ctx.depth_group, ctx.dtype, ctx.x_dtype = block_shape, depth_group, dtype, x.dtype
        ctx.in_out, ctx.layer = in_out, layer
        with torch.autocast(x.device.type, enabled=False):
            return F.linear(xc, w.t() if in_out else w)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None,
                                                     None, None, None, None]:
        xc, w_shard = ctx.saved_tensors
        g = g.to(ctx.dtype)
        layer = ctx.layer
        gathered = layer.take_prefetched("bwd", ctx.dtype) if layer is not None else None
        if layer is not None:  # the previous layer's backward runs next: start its gather now
            prev = layer.depth_neighbour("prev")
            if prev is not None and prev.weight.requires_grad:
                prev.prefetch("bwd", ctx.dtype)
        if gathered is None:
            gathered = all_gather_flat(w_shard.to(ctx.dtype), ctx.depth_group)
        w = gathered.view(ctx.block_shape)
        if ctx.in_out:
            w = w.t()
        scattered = None
        if ctx.needs_input_grad[1]:  # weight grad first: its reduce-scatter runs behind the input-grad GEMM
            n, k = w.shape
            g2, x2 = g.reshape(-1, n), xc.reshape(-1, k)
            full = x2.t().matmul(g2) if ctx.in_out else g2.t().matmul(x2)
            scattered = reduce_scatter_flat_async(full, ctx.depth_group)
        grad_x = g.matmul(w).to(ctx.x_dtype) if ctx.needs_input_grad[0] else None
        grad_w = None
        if scattered is not None:
            out, work = scattered
            work.wait()
            grad_w = out.view_as(w_shard).to(w_shard.dtype)
        return grad_x, grad_w, None, None, None, None, None, None


def _in_backward() -> bool:
    """Whether autograd's engine is running a backward on this thread (a checkpointed forward
    being recomputed). torch exposes it privately; without it, assume so (no forward prefetch)."""
    task = getattr(torch._C, "_current_graph_task_id", None)
    return task is None or task() != -1


@dataclass(frozen=True, kw_only=True)
class _Prefetched:
    """A depth all-gather launched ahead of its use: the output, its Work, the source kept alive,
    and the stamp (weight version, local size, dtype) the use must match. The stamp holds only
    what every depth rank agrees on, so all of them take or drop a prefetch alike."""

    flat: torch.Tensor
    work: Any
    source: torch.Tensor
    stamp: tuple[int, int, torch.dtype]


def linear_specs(in_features: int, out_features: int, bias: bool, transpose: bool,
                 padded_out: int | None = None, *,
                 in_out: bool = False) -> tuple[ShardSpec, ShardSpec | None]:
    """ShardSpecs of the weight [out, in] (`in_out`: [in, out], transformers' Conv1D) and bias [out]
    of a 3D Linear."""
    if in_out and padded_out is not None:
        raise ValueError(f"padded_out_features={padded_out} needs the [out, in] weight layout (in_out=False)")
    out_dim, in_dim = (1, 0) if in_out else (0, 1)
    w_spec = ShardSpec(full_shape=(in_features, out_features) if in_out else (out_features, in_features),
                       row_dim=in_dim if transpose else out_dim, col_dim=out_dim if transpose else in_dim,
                       depth_flat=True, padded_dim0=padded_out)
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


def _kaiming_bound(fan_in: int) -> float:
    """torch.nn.Linear's weight init: kaiming_uniform_(a=sqrt(5)) ==
    uniform(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    gain = math.sqrt(2.0 / (1 + 5.0))
    return math.sqrt(3.0) * gain / math.sqrt(fan_in) if fan_in > 0 else 0.0


def linear_init_chunks(out_features: int, in_features: int, bias: bool) -> tuple[Iterator, Iterator | None]:
    """Row chunks of a fresh torch.nn.Linear's weight and bias, drawn from the default generator in
    the order nn.Linear draws them (weight first, then bias); consume the weight's before the bias's."""
    wb = _kaiming_bound(in_features)
    weight = drawn_chunks((out_features, in_features), lambda t: t.uniform_(-wb, wb))
    if not bias:
        return weight, None
    bb = 1 / math.sqrt(in_features) if in_features > 0 else 0.0
    return weight, drawn_chunks((out_features,), lambda t: t.uniform_(-bb, bb))


class ShardedLinear(nn.Module):
    """3D-parallel Linear on sharded activations (the form ParallelGPT uses; module docstring).

    Input [*, in/G_c] (transposed: in/G_r), output [*, out/G_r] (transposed: out/G_c).
    `weight` is this rank's flat depth shard of its (row, col) block; `bias` this rank's slice of
    the output features (replicated over the other tensor axis and over depth).

    Built with no `_full_weight`, only this rank's shard is ever allocated: the full weight is drawn
    chunk by chunk from the CPU generator exactly as torch.nn.Linear draws it (`init="serial"`, the
    default: same values as single-process construction with the same seed), or the shard alone is
    drawn on the device with the same distribution (`init="local"`: fast, different values).

    `weight_in_out=True` stores the weight as [in, out], the layout of Hugging Face transformers'
    `Conv1D` (GPT-2's c_attn, c_proj, c_fc): same math, and `engine.full_state_dict` / checkpoints
    hold Conv1D's keys and shapes, so a consolidated state dict loads back into transformers.
    Serial init then draws Conv1D's normal(0, 0.02) weight and zero bias.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device: Any = None,
                 dtype: torch.dtype | None = None, *, transpose: bool = False, grid: Grid | None = None,
                 padded_out_features: int | None = None, init: str = "serial", weight_in_out: bool = False,
                 _full_weight: torch.Tensor | None = None, _full_bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.grid = current_grid(grid)
        self.in_features, self.out_features = in_features, out_features
        self.transpose = transpose
        self.weight_in_out = weight_in_out
        problems = split_problems(in_features, out_features, transpose, self.grid.degrees,
                                  padded_out_features)
        if problems:
            raise GridError(f"engine.{type(self).__name__}({in_features}, {out_features}, "
                            f"transpose={transpose}) on grid {self.grid.describe()}: " + "; ".join(problems))
        if init not in ("serial", "local"):
            raise ValueError(f"init must be 'serial' or 'local', got {init!r}")
        g = self.grid
        device = torch.device(device) if device is not None else g.device
        self.w_spec, self.b_spec = linear_specs(in_features, out_features, bias, transpose,
                                                padded_out_features, in_out=weight_in_out)
        self.block_shape = self.w_spec.block_shape(g.degrees)
        if _full_weight is not None:
            w_chunks, b_chunks = tensor_chunks(_full_weight), (tensor_chunks(_full_bias) if bias else None)
        elif init == "serial" and weight_in_out:
            w_chunks = drawn_chunks((in_features, out_features), lambda t: t.normal_(0.0, 0.02))
            b_chunks = tensor_chunks(torch.zeros(out_features)) if bias else None
        elif init == "serial":
            w_chunks, b_chunks = linear_init_chunks(out_features, in_features, bias)
        else:
            w_chunks = b_chunks = None
        if w_chunks is not None:
            weight = materialize(self.w_spec, w_chunks, g.coords, g.degrees, dtype=dtype, device=device)
        else:
            wb = _kaiming_bound(in_features)
            weight = torch.empty(self.w_spec.local_shape(g.degrees), dtype=dtype, device=device)
            if weight_in_out:
                weight.normal_(0.0, 0.02)
            else:
                weight.uniform_(-wb, wb)
        self.weight = mark(nn.Parameter(weight), self.w_spec)
        if bias:
            assert self.b_spec is not None
            if b_chunks is not None:
                b = materialize(self.b_spec, b_chunks, g.coords, g.degrees, dtype=dtype, device=device)
            else:
                bb = 1 / math.sqrt(in_features) if in_features > 0 else 0.0
                b = torch.empty(self.b_spec.local_shape(g.degrees), dtype=dtype, device=device)
                b.uniform_(-bb, bb)
            self.bias = mark(nn.Parameter(b), self.b_spec)
        else:
            self.register_parameter("bias", None)
        # "next"/"prev": weakrefs to the chained layers (prefetch_depth)
        self._depth_links: dict[str, Any] = {}
        self._prefetched: dict[str, _Prefetched] = {}
        self.depth_prefetch_hits = 0  # gathers this layer used from a prefetch (tests, bench)
        self.in_group = g.comm_group("col" if transpose else "row")  # input grad all-reduce
        self.out_group = g.comm_group("row" if transpose else "col")  # partial output all-reduce
        install_sync_guard(self, g)

    @classmethod
    def from_dense(cls, dense: nn.Linear, *, transpose: bool = False, grid: Grid | None = None,
                   padded_out_features: int | None = None) -> ShardedLinear:
        """Shard an existing torch.nn.Linear (same values, this rank's slice)."""
        return cls(dense.in_features, dense.out_features, dense.bias is not None, transpose=transpose,
                   grid=grid, padded_out_features=padded_out_features, _full_weight=dense.weight.detach(),
                   _full_bias=None if dense.bias is None else dense.bias.detach())

    @classmethod
    def from_conv1d(cls, conv: nn.Module, *, transpose: bool = False,
                    grid: Grid | None = None) -> ShardedLinear:
        """Shard a transformers `Conv1D` (weight [nx, nf] = [in, out], bias [nf]): same values, same
        parameter names and layout (`weight_in_out=True`)."""
        weight = conv.weight.detach()
        bias = getattr(conv, "bias", None)
        return cls(weight.shape[0], weight.shape[1], bias is not None, transpose=transpose, grid=grid,
                   weight_in_out=True, _full_weight=weight,
                   _full_bias=None if bias is None else bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = copy_to(x, self.in_group)
        depth = self.grid.comm_group("depth")
        if depth is None:  # nothing to gather: plain autograd (and the bias fused when no reduction follows)
            fused_bias = self.bias if self.out_group is None else None
            w = self.weight.view(self.block_shape)
            y = F.linear(x, w.t() if self.weight_in_out else w, fused_bias)
            if self.out_group is None:
                return y
        else:
            compute_dtype = autocast_dtype(x.device.type)
            dtype = compute_dtype or torch.promote_types(x.dtype, self.weight.dtype)
            gathered = self.take_prefetched("fwd", dtype)
            nxt = self.depth_neighbour("next")
            # not while autograd recomputes a checkpointed forward inside backward: the next layer's
            # forward may not be recomputed, and its gather would then be an extra call
            if nxt is not None and not _in_backward():
                nxt.prefetch("fwd", dtype)
            y = _DepthShardedLinearFn.apply(x, self.weight, self.block_shape, depth, compute_dtype,
                                            self.weight_in_out, gathered, self)
        y = reduce_from(y, self.out_group)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)  # as nn.Linear under autocast: the output keeps the GEMM's dtype
        return y

    # ---- depth prefetch (prefetch_depth) --------------------------------------------------------

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, local_metadata: Any,
                              strict: bool, missing_keys: list[str], unexpected_keys: list[str],
                              error_msgs: list[str]) -> None:
        """Also accept the unsharded layer's tensors (`layer.load_state_dict(nn.Linear(k, n)
        .state_dict())`, AxoNN's own test; or a whole single-process model's state_dict): a
        full-shaped weight or bias is cut to this rank's shard (vocabulary padding included) before
        the usual loading."""
        g = self.grid
        for name, spec in (("weight", self.w_spec), ("bias", self.b_spec)):
            key = prefix + name
            local = self._parameters.get(name)
            if spec is None or local is None or key not in state_dict:
                continue
            value = state_dict[key]
            full = (self.in_features, self.out_features) if (name == "weight" and self.weight_in_out) else \
                (self.out_features, self.in_features) if name == "weight" else (self.out_features,)
            if isinstance(value, torch.Tensor) and tuple(value.shape) == full and value.shape != local.shape:
                state_dict[key] = spec.shard(value.detach().to(local.device), g.coords, g.degrees)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def depth_neighbour(self, which: str) -> ShardedLinear | None:
        """The chained next ("next") or previous ("prev") depth-sharded layer, if any."""
        ref = self._depth_links.get(which)
        return ref() if ref is not None else None

    def _stamp(self, dtype: torch.dtype) -> tuple[int, int, torch.dtype]:
        return (self.weight._version, self.weight.numel(), dtype)

    def prefetch(self, phase: str, dtype: torch.dtype) -> None:
        """Launch this layer's depth all-gather for its next `phase` ("fwd" or "bwd") use, unless
        one is pending or the weight is not materialized (ZeRO-3 between gathers)."""
        if phase in self._prefetched or self.weight.numel() != self.w_spec.local_shape(self.grid.degrees)[0]:
            return
        source = self.weight.detach().to(dtype)
        flat, work = all_gather_flat_async(source, self.grid.comm_group("depth"))
        self._prefetched[phase] = _Prefetched(flat=flat, work=work, source=source, stamp=self._stamp(dtype))

    def take_prefetched(self, phase: str, dtype: torch.dtype) -> torch.Tensor | None:
        """The gathered weight (flat) a prefetch left for this `phase`, after waiting on it; None
        when there is none or it no longer matches the weight (updated since, another dtype)."""
        pending = self._prefetched.pop(phase, None)
        if pending is None:
            return None
        pending.work.wait()
        if pending.stamp != self._stamp(dtype):
            return None
        self.depth_prefetch_hits += 1
        return pending.flat

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, transpose={self.transpose}, "
                + ("weight_in_out=True, " if self.weight_in_out else "") + f"grid=({self.grid.describe()})")


class Linear(ShardedLinear):
    """Drop-in torch.nn.Linear (same signature, parameter names and initial values for the same
    seed) that splits its weight over the grid: ordinary full-feature activations in and out, local
    batch shard. It keeps this rank's input features (free), runs the 3D layer and all-gathers the
    output features (normal: over row; backward all-gathers the input grad over col; transposed:
    row and col swap), the "convert" events of perfmodels.traffic. For activations already in the
    3D layout, use `engine.ShardedLinear`."""

    tied = False  # True once a full (unsharded) weight was assigned: weight tying, see __setattr__

    def __setattr__(self, name: str, value: Any) -> None:
        """Weight tying (`lm_head.weight = wte.weight`, as Hugging Face's tie_weights does): a
        full-shaped, unsharded Parameter assigned to `weight` makes this layer an ordinary
        replicated nn.Linear over that shared tensor (its gradient is the tied tensor's, synced like
        any replicated parameter). Splitting it is impossible without splitting its owner too.
        Before, the shard-shaped view of the full tensor failed with a shape error on the first
        forward (row, col and depth grids alike)."""
        if name == "weight" and isinstance(value, nn.Parameter) and "weight" in self._parameters \
                and spec_of(value) is None:
            full = (self.in_features, self.out_features) if self.weight_in_out else \
                (self.out_features, self.in_features)
            if tuple(value.shape) != full:
                raise GridError(f"engine.Linear({self.in_features}, {self.out_features}).weight: a tied "
                                f"weight must have the full shape {full}, got {tuple(value.shape)}")
            if self.bias is not None:
                raise GridError(f"engine.Linear({self.in_features}, {self.out_features}): a tied weight "
                                "needs bias=False (its bias is split over the grid)")
            object.__setattr__(self, "tied", True)
        super().__setattr__(name, value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tied:
            w = self.weight.t() if self.weight_in_out else self.weight
            return F.linear(x, w, self.bias)
        in_axis, out_axis = ("row", "col") if self.transpose else ("col", "row")
        x = scatter_last(x, self.grid.comm_group(in_axis))
        y = super().forward(x)
        return gather_last(y, self.grid.comm_group(out_axis))


def prefetch_depth(model: nn.Module, enabled: bool = True) -> int:
    """Chain `model`'s depth-sharded layers (engine.ShardedLinear / engine.Linear, in module order)
    so each prefetches the next one's forward all-gather and the previous one's backward
    all-gather (module docstring); `enabled=False` unchains them. Returns the number of layers
    chained. Nothing to do when G_intra_d == 1. `engine.wrap` calls it; call it again after
    replacing layers."""
    if not isinstance(enabled, bool):
        raise ValueError(f"enabled must be True or False, got {enabled!r}")
    layers = [m for m in model.modules()
              if isinstance(m, ShardedLinear) and m.grid.comm_group("depth") is not None]
    for layer in layers:
        layer._depth_links.clear()
        for pending in layer._prefetched.values():
            pending.work.wait()
        layer._prefetched.clear()
    if not enabled or len(layers) < 2:
        return 0
    for a, b in itertools.pairwise(layers):
        if a.grid is not b.grid:
            continue
        a._depth_links["next"] = weakref.ref(b)
        b._depth_links["prev"] = weakref.ref(a)
    return len(layers)
