"""`create_dataloader`: the global batch split over G_data x G_intra_d (DESIGN.md section 1).

All ranks with the same (data, depth) coordinates get the same samples; replica
`data * G_intra_d + depth` gets every (G_data*G_intra_d)-th sample (DistributedSampler order), so
with shuffle=False the union of one step's local batches is exactly the next `global_batch_size`
samples a single-process DataLoader would yield.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, Dataset, DistributedSampler

from engine.grid import Grid, GridError, current_grid


def local_batch_size(global_batch_size: int, grid: Grid, micro_batch_size: int | None = None) -> int:
    """Per-rank batch; raises GridError naming every factor when the split is uneven."""
    G_data, G_d = grid.size("data"), grid.size("depth")
    shards = G_data * G_d
    if global_batch_size % shards:
        raise GridError(f"global_batch_size={global_batch_size} is not divisible by "
                        f"G_data*G_intra_d = {G_data}*{G_d} = {shards}")
    local = global_batch_size // shards
    if micro_batch_size is not None and local % micro_batch_size:
        raise GridError(f"the per-replica batch global_batch_size/(G_data*G_intra_d) = {global_batch_size}/"
                        f"({G_data}*{G_d}) = {local} is not divisible by micro_batch_size={micro_batch_size}")
    return local


def create_dataloader(dataset: Dataset, global_batch_size: int, micro_batch_size: int | None = None, *,
                      grid: Grid | None = None, shuffle: bool = False, seed: int = 0,
                      **dataloader_kwargs: Any) -> DataLoader:
    """A DataLoader yielding this rank's local batch (global / (G_data*G_intra_d) samples) per step.

    `micro_batch_size` is validated against the local batch and stored as
    `loader.micro_batch_size` (engine.forward_backward splits each local batch into micro-batches).
    """
    grid = current_grid(grid)
    local = local_batch_size(global_batch_size, grid, micro_batch_size)
    sampler = DistributedSampler(dataset, num_replicas=grid.batch_shards, rank=grid.batch_shard_index,
                                 shuffle=shuffle, seed=seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=local, sampler=sampler, drop_last=True, **dataloader_kwargs)
    loader.micro_batch_size = micro_batch_size or local  # type: ignore[attr-defined]
    return loader
