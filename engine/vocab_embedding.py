"""A vocabulary-parallel `nn.Embedding` for engine.auto_parallelize(embedding=True).

The table's rows (the vocabulary, zero-padded to a multiple of G_intra_r) are split over the row
group; each rank looks up the ids in its range (others read as zero) and the partial embeddings
are summed over row (forward all-reduce, backward identity), so the output is the ordinary full
embedding on every rank and each rank's gradient lands only on its own rows. The table is
replicated over col and depth (depth ranks see different samples: engine.sync_gradients reduces
it over depth like any replicated parameter). Values: the full table is drawn with
nn.Embedding's RNG call (normal_) and only this rank's rows are kept, so they equal
single-process construction with the same seed.

Not counted by perfmodels.traffic's layer-list model (it treats embeddings as replicated), which
is why auto_parallelize leaves nn.Embedding alone unless asked.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.comm import group_rank, group_size, reduce_from
from engine.grid import Grid
from engine.shard import ShardSpec, mark


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, *, grid: Grid, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.group = grid.comm_group("row")
        p, r = group_size(self.group), group_rank(self.group)
        padded = -(-num_embeddings // p) * p
        self.rows = padded // p
        self.start = r * self.rows
        full = torch.empty(num_embeddings, embedding_dim, dtype=dtype).normal_()
        local = torch.zeros(self.rows, embedding_dim, dtype=full.dtype)
        end = min(self.start + self.rows, num_embeddings)
        if end > self.start:
            local[:end - self.start] = full[self.start:end]
        del full
        spec = ShardSpec(full_shape=(num_embeddings, embedding_dim), row_dim=0,
                         padded_dim0=padded if padded != num_embeddings else None)
        self.weight = mark(nn.Parameter(local.to(device or grid.device)), spec)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.group is None:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        mine = (local >= 0) & (local < self.rows)
        # every id is looked up on every row rank (clamped), zeroed where another rank owns it;
        # the sum over row then gives each token its one real row
        out = F.embedding(local.clamp(0, self.rows - 1), self.weight)
        out = out * mine.unsqueeze(-1).to(self.weight.dtype)
        return reduce_from(out, self.group)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, rows {self.start}..{self.start + self.rows}"
