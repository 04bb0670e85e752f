"""engine.init: Slurm- and torchrun-style starts without a prior init_process_group, and placements
other than the default, whose groups must be exactly perfmodels.layout's; which grid a call uses.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_grid.py -q
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.launch import free_port, launch
from perfmodels.layout import group_ranks

ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _env_rank(i: int, n: int, port: int, style: str, queue: Any) -> None:
    import engine

    for key in ENV_KEYS:
        os.environ.pop(key, None)
    if style == "slurm":
        os.environ.update(SLURM_PROCID=str(i), SLURM_NTASKS=str(n), SLURM_LOCALID=str(i),
                          SLURM_JOB_NODELIST="localhost", MASTER_PORT=str(port))
    else:  # what torchrun exports
        os.environ.update(RANK=str(i), WORLD_SIZE=str(n), LOCAL_RANK=str(i), MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        grid = engine.init(G_data=1, G_intra_c=n, timeout_s=30)
        t = torch.ones(1)
        dist.all_reduce(t, group=grid.group("col"))
        queue.put((grid.rank, grid.coord("col"), float(t)))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.parametrize("style", ["slurm", "torchrun"])
def test_init_from_launcher_variables(style):
    ctx = mp.get_context("fork")
    queue = ctx.SimpleQueue()
    mp.start_processes(_env_rank, args=(2, free_port(), style, queue), nprocs=2, join=True,
                       start_method="fork")
    got = sorted(queue.get() for _ in range(2))
    assert got == [(0, 0, 2.0), (1, 1, 2.0)]


PLACEMENT = ("data", "col", "depth", "row", "inter")  # data innermost: consecutive ranks are replicas


def _groups(rank: int, world: int) -> dict[str, Any]:
    import engine

    grid = engine.init(G_data=2, G_intra_c=2, G_intra_r=2, placement=PLACEMENT)
    return {"coords": dict(grid.coords),
            "groups": {a: dist.get_process_group_ranks(g) for a, g in grid.groups.items()}}


def test_non_default_placement_builds_perfmodels_groups():
    degrees = {"data": 2, "inter": 1, "depth": 1, "row": 2, "col": 2}
    results = launch(_groups, world_size=8, timeout_s=60)
    for rank, r in enumerate(results):
        assert r["groups"]["cp"] == [rank]  # G_cp=1: a one-rank group
        for axis, ranks in r["groups"].items():
            if axis == "cp":
                continue
            assert ranks == group_ranks(rank, axis, degrees, PLACEMENT), (rank, axis)
        assert r["groups"]["data"] == [rank - rank % 2, rank - rank % 2 + 1]


def _grid(**degrees: int) -> Any:
    from engine.grid import Grid

    full = {"data": 1, "inter": 1, "depth": 1, "row": 1, "col": 1, **degrees}
    return Grid(degrees=full, placement=("col", "row", "depth", "inter", "data"), rank=0, world_size=1,
                coords=dict.fromkeys(full, 0), device=torch.device("cpu"))


def test_a_model_brings_its_own_grid_before_engine_inits():
    """grid_of: an explicit grid=, else the grid engine.wrap recorded, else the first engine layer's,
    else engine.init's (the only read of the module-level grid outside the public constructors)."""
    from torch import nn

    from engine import grid as grid_module
    from engine.grid import GRID_ATTR, grid_of

    built, wrapped, explicit, initialized = _grid(row=2), _grid(col=2), _grid(data=2), _grid(depth=2)
    layer = nn.Linear(2, 2)
    layer.grid = built  # what an engine layer holds
    model = nn.Sequential(nn.ReLU(), layer)
    saved = list(grid_module._CURRENT)
    grid_module._CURRENT[:] = [initialized]
    try:
        assert grid_of(model) is built
        assert grid_of([nn.ReLU(), model]) is built  # BlockPipeline's list of blocks
        setattr(model, GRID_ATTR, wrapped)
        assert grid_of(model) is wrapped
        assert grid_of(model, explicit) is explicit
        assert grid_of(nn.ReLU()) is initialized
        assert grid_of(iter(model.parameters())) is initialized
    finally:
        grid_module._CURRENT[:] = saved
