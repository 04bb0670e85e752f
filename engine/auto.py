"""`engine.auto_parallelize()`: turn the `torch.nn.Linear`s of an arbitrary model into 3D Linears.

    grid = engine.init(G_data=2, G_intra_r=2, G_intra_c=2)
    with engine.auto_parallelize():
        net = MyModel()            # every nn.Linear whose shapes divide becomes engine.AutoLinear
    out = net(x_local)             # ordinary activations: local batch shard, full features

Inside the context, `torch.nn.Linear(...)` first builds the ordinary layer (same RNG draws, so the
values equal single-process construction with the same seed) and then, when its shapes divide on
the grid (engine.linear.split_problems), returns an `AutoLinear` holding this rank's shards;
otherwise the plain layer (replicated, synced like any other parameter). Code that imported the
class itself before the context (`from torch.nn import Linear`) is not affected, and inside the
context `isinstance(m, torch.nn.Linear)` is not meaningful.

AutoLinear takes and returns full-feature activations, converting around the 3D layer; the traffic,
which perfmodels.traffic._layer_list_events counts ("convert" events), is per call:
  fwd  keep this rank's input features (free); all-gather the output over row (normal layer)
  bwd  keep this rank's output-grad slice (free); all-gather the input grad over col
(transposed: row and col swap). A layer whose input needs no gradient (the first layer on the
data) issues no backward input collectives at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from engine.comm import gather_last, scatter_last
from engine.grid import Grid, current_grid
from engine.linear import Linear, split_problems


class AutoLinear(Linear):
    """A 3D Linear with ordinary (full-feature) input and output; same parameter names as nn.Linear."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_axis, out_axis = ("row", "col") if self.transpose else ("col", "row")
        x = scatter_last(x, self.grid.group(in_axis))
        y = super().forward(x)
        return gather_last(y, self.grid.group(out_axis))


@contextlib.contextmanager
def auto_parallelize(grid: Grid | None = None, *, transpose: bool = False) -> Iterator[Grid]:
    """Within the block, `torch.nn.Linear(...)` returns an AutoLinear where the shapes divide."""
    grid = current_grid(grid)
    original = nn.Linear

    def linear(in_features: int, out_features: int, bias: bool = True, device: object = None,
               dtype: object = None) -> nn.Module:
        dense = original(in_features, out_features, bias, device=device, dtype=dtype)
        if split_problems(in_features, out_features, transpose, grid.degrees):
            return dense
        return AutoLinear.from_dense(dense, transpose=transpose, grid=grid)

    nn.Linear = linear  # type: ignore[misc,assignment]
    try:
        yield grid
    finally:
        nn.Linear = original  # type: ignore[misc]
