"""A channel-split `nn.Conv2d` for engine.auto_parallelize(conv=True) (AxoNN's channel split).

The output channels (weight [C_out, C_in, kH, kW] and bias) are split over the row group: each
rank convolves the full input with its C_out/G_intra_r filters, and the outputs are all-gathered
over row along the channel dimension (backward: each rank keeps its channels' gradient). The
input goes through `copy_to` (identity forward, all-reduce over row backward), because each rank's
input gradient comes from its filters only. Filters are replicated over col and depth (depth
ranks see different samples; engine.sync_gradients reduces them there). Values: a full nn.Conv2d
is drawn with its own initialization and only this rank's filters are kept, so they equal
single-process construction with the same seed. Falls back to nn.Conv2d when C_out does not
divide G_intra_r, or for groups != 1.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.comm import copy_to, gather_last, group_rank, group_size
from engine.grid import Grid
from engine.shard import ShardSpec, mark


class ChannelParallelConv2d(nn.Module):
    def __init__(self, full: nn.Conv2d, *, grid: Grid) -> None:
        super().__init__()
        self.group = grid.comm_group("row")
        p, r = group_size(self.group), group_rank(self.group)
        c_out = full.out_channels
        n = c_out // p
        self.in_channels, self.out_channels = full.in_channels, c_out
        self.stride, self.padding, self.dilation = full.stride, full.padding, full.dilation
        self.kernel_size = full.kernel_size
        w = full.weight.detach()[r * n:(r + 1) * n].clone()
        self.weight = mark(nn.Parameter(w.to(grid.device)),
                           ShardSpec(full_shape=tuple(full.weight.shape), row_dim=0))
        if full.bias is not None:
            b = full.bias.detach()[r * n:(r + 1) * n].clone()
            self.bias = mark(nn.Parameter(b.to(grid.device)), ShardSpec(full_shape=(c_out,), row_dim=0))
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = copy_to(x, self.group)
        out = F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation)
        if self.group is None:
            return out
        return gather_last(out.movedim(1, -1).contiguous(), self.group).movedim(-1, 1)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                "channel-split over row")


def make_conv2d(original: Any, grid: Grid) -> Any:
    """The nn.Conv2d replacement used inside auto_parallelize(conv=True)."""

    def conv2d(in_channels: int, out_channels: int, kernel_size: Any, *args: Any, **kwargs: Any) -> nn.Module:
        full = original(in_channels, out_channels, kernel_size, *args, **kwargs)
        p = grid.size("row")
        if p == 1 or out_channels % p or full.groups != 1 or full.padding_mode != "zeros":
            return full
        return ChannelParallelConv2d(full, grid=grid)

    return conv2d
