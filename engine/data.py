"""`create_dataloader`: the global batch split over G_data x G_intra_d (DESIGN.md section 1).

All ranks with the same (data, depth) coordinates get the same samples; replica
`data * G_intra_d + depth` gets every (G_data*G_intra_d)-th sample (DistributedSampler order), so
with shuffle=False the union of one step's local batches is exactly the next `global_batch_size`
samples a single-process DataLoader would yield.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from engine.grid import Grid, GridError, current_grid
from perfmodels import rules


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def local_batch_size(global_batch_size: int, grid: Grid, micro_batch_size: int | None = None) -> int:
    """Per-rank batch; raises GridError (a ValueError) naming every factor when the split is uneven."""
    _positive_int("global_batch_size", global_batch_size)
    if micro_batch_size is not None:
        _positive_int("micro_batch_size", micro_batch_size)
    G_data, G_d = grid.size("data"), grid.size("depth")
    shards = G_data * G_d
    if not rules.batch_split(global_batch_size, G_data, G_d):
        raise GridError(f"global_batch_size={global_batch_size} is not divisible by "
                        f"G_data*G_intra_d = {G_data}*{G_d} = {shards}")
    local = global_batch_size // shards
    if micro_batch_size is not None and not rules.microbatch_split(global_batch_size, G_data, G_d,
                                                                   micro_batch_size):
        raise GridError(f"the per-replica batch global_batch_size/(G_data*G_intra_d) = {global_batch_size}/"
                        f"({G_data}*{G_d}) = {local} is not divisible by micro_batch_size={micro_batch_size}")
    return local


def create_dataloader(dataset: Dataset, global_batch_size: int, micro_batch_size: int | None = None,
                      num_workers: int = 0, *, grid: Grid | None = None, shuffle: bool = False, seed: int = 0,
                      **dataloader_kwargs: Any) -> DataLoader:
    """A DataLoader yielding this rank's local batch (global / (G_data*G_intra_d) samples) per step.

    Positional order as AxoNN's `create_dataloader(dataset, global_batch_size, micro_batch_size,
    num_workers)`. `micro_batch_size` (default: the whole local batch) is validated against the
    local batch and stored as `loader.micro_batch_size` (engine.forward_backward splits each local
    batch into micro-batches). Every argument is checked before anything else happens: a
    non-positive size, an uneven split, or a global batch larger than the dataset (which would
    yield no batch at all) raises ValueError naming the argument and its value.
    """
    grid = current_grid(grid)
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers must be a non-negative integer, got {num_workers!r}")
    local = local_batch_size(global_batch_size, grid, micro_batch_size)
    try:
        size = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        size = None
    if size is not None and size < global_batch_size:
        raise ValueError(f"global_batch_size={global_batch_size} is larger than the dataset "
                         f"({size} samples): the loader would yield no batch")
    sampler = DistributedSampler(dataset, num_replicas=grid.batch_shards, rank=grid.batch_shard_index,
                                 shuffle=shuffle, seed=seed, drop_last=True)
    G_cp = grid.degrees.get("cp", 1)
    if G_cp > 1:  # context parallelism: each cp rank gets its two sequence chunks (engine.context)
        inner = dataloader_kwargs.get("collate_fn")
        dataloader_kwargs["collate_fn"] = _cp_collate(inner, G_cp, grid.coord("cp"))
    loader = DataLoader(dataset, batch_size=local, sampler=sampler, drop_last=True, num_workers=num_workers,
                        **dataloader_kwargs)
    loader.micro_batch_size = micro_batch_size or local  # type: ignore[attr-defined]
    return loader


def _cp_collate(inner: Any, G_cp: int, cp_rank: int) -> Any:
    """Collate as `inner` (default_collate) does, then keep this cp rank's chunks of every tensor
    with a sequence dimension (dim 1): the load-balanced split of engine.context."""
    from torch.utils.data import default_collate

    from engine.context import split_sequence

    collate = inner or default_collate

    def split(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dim() >= 2:
            return split_sequence(x, G_cp, cp_rank, dim=1)
        if isinstance(x, (list, tuple)):
            return type(x)(split(v) for v in x)
        if isinstance(x, dict):
            return {k: split(v) for k, v in x.items()}
        return x

    return lambda batch: split(collate(batch))
