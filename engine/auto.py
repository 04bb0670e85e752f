"""`engine.auto_parallelize()`: turn the `torch.nn.Linear`s of an arbitrary model into 3D Linears.

    grid = engine.init(G_data=2, G_intra_r=2, G_intra_c=2)
    with engine.auto_parallelize():
        net = MyModel()            # every nn.Linear whose shapes divide becomes engine.Linear
    net = engine.wrap(net)         # replicas agree (broadcast), gradient sync is checked
    out = net(x_local)             # ordinary activations: local batch shard, full features

Inside the context, `torch.nn.Linear(...)` returns an `engine.Linear` holding only this rank's
shards when its shapes divide on the grid (engine.linear.split_problems); its values are drawn
chunk by chunk with the RNG calls nn.Linear makes, so they equal single-process construction with
the same seed and the full weight is never allocated. Otherwise it returns the plain layer
(replicated, synced like any other parameter). Models split by auto_parallelize have no pipeline
stages: a grid with G_inter > 1 is refused (the stages would all hold and compute the whole
model). Code that imported the
class itself before the context (`from torch.nn import Linear`) is not affected, and inside the
context `isinstance(m, torch.nn.Linear)` is not meaningful.

engine.Linear takes and returns full-feature activations, converting around the 3D layer; the traffic,
which perfmodels.traffic._layer_list_events counts ("convert" events), is per call:
  fwd  keep this rank's input features (free); all-gather the output over row (normal layer)
  bwd  keep this rank's output-grad slice (free); all-gather the input grad over col
(transposed: row and col swap). A layer whose input needs no gradient (the first layer on the
data) issues no backward input collectives at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torch import nn

from engine.grid import Grid, GridError, current_grid
from engine.linear import Linear, split_problems

AutoLinear = Linear  # the name this class had before engine.Linear became the drop-in form


@contextlib.contextmanager
def auto_parallelize(grid: Grid | None = None, *, transpose: bool = False, pipeline: bool = False,
                     embedding: bool = False, conv: bool = False, attention: bool = False) -> Iterator[Grid]:
    """Within the block, `torch.nn.Linear(...)` returns an engine.Linear where the shapes divide.
    `pipeline=True`: the blocks built here go to engine.BlockPipeline (allowed with G_inter > 1).
    `embedding=True`: `torch.nn.Embedding(V, D)` (no padding_idx / max_norm / sparse) returns an
    engine.vocab_embedding.VocabParallelEmbedding, its vocabulary split over G_intra_r.
    `conv=True`: `torch.nn.Conv2d` returns an engine.conv.ChannelParallelConv2d (output channels
    split over G_intra_r) where they divide. `attention=True`: `torch.nn.MultiheadAttention` returns
    an engine.mha.HeadParallelMultiheadAttention (heads split over G_intra_r) where they divide."""
    grid = current_grid(grid)
    if grid.size("inter") > 1 and not pipeline:
        raise GridError(
            f"auto_parallelize splits Linears over G_intra_r/G_intra_c/G_intra_d, but the grid has "
            f"G_inter={grid.size('inter')}: a model built this way has no pipeline stages, so every "
            f"stage would hold and compute the whole model; use G_inter=1, engine.ParallelGPT, or "
            f"auto_parallelize(pipeline=True) with engine.BlockPipeline")
    original = nn.Linear

    class linear(original):  # type: ignore[valid-type,misc]
        """A class, not a function: libraries subclass `nn.Linear` and test `isinstance(m, nn.Linear)`
        while the model is built (Hugging Face's `_init_weights`, classes defined on a lazy import);
        both failed on a function with "isinstance() arg 2 must be a type". `linear(k, n)` returns an
        engine.Linear (or the plain layer when the shapes do not divide); subclasses are built as
        ordinary nn.Linear subclasses."""

        def __new__(cls, in_features: int = 0, out_features: int = 0, bias: bool = True, device: Any = None,
                    dtype: Any = None, *args: Any, **kwargs: Any) -> Any:
            if cls is not linear:
                return super().__new__(cls)
            if split_problems(in_features, out_features, transpose, grid.degrees):
                return original(in_features, out_features, bias, device=device, dtype=dtype)
            return Linear(in_features, out_features, bias, device=device, dtype=dtype, transpose=transpose,
                          grid=grid)

    original_embedding = nn.Embedding

    def make_embedding(num_embeddings: int, embedding_dim: int, padding_idx: Any = None, max_norm: Any = None,
                       *args: Any, device: Any = None, dtype: Any = None, **kwargs: Any) -> nn.Module:
        if (padding_idx is not None or max_norm is not None or args or kwargs.get("sparse")
                or kwargs.get("_weight") is not None or grid.size("row") == 1):
            return original_embedding(num_embeddings, embedding_dim, padding_idx, max_norm, *args,
                                      device=device, dtype=dtype, **kwargs)
        from engine.vocab_embedding import VocabParallelEmbedding

        return VocabParallelEmbedding(num_embeddings, embedding_dim, grid=grid, device=device, dtype=dtype)

    nn.Linear = linear  # type: ignore[misc,assignment]
    if embedding:
        nn.Embedding = make_embedding  # type: ignore[misc,assignment]
    original_conv = nn.Conv2d
    if conv:
        from engine.conv import make_conv2d

        nn.Conv2d = make_conv2d(original_conv, grid)  # type: ignore[misc,assignment]
    original_mha = nn.MultiheadAttention
    if attention:
        from engine.mha import make_mha

        nn.MultiheadAttention = make_mha(original_mha, grid)  # type: ignore[misc,assignment]
    try:
        yield grid
    finally:
        nn.Linear = original  # type: ignore[misc]
        nn.Embedding = original_embedding  # type: ignore[misc]
        nn.Conv2d = original_conv  # type: ignore[misc]
        nn.MultiheadAttention = original_mha  # type: ignore[misc]
