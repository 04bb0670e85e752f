"""Larger layouts, outside the default run (`-m slow`):

- 16 real gloo ranks: equivalence with single-process training and the byte contract;
- 64- and 128-rank 3D x data layouts on torch's fake backend: one process plays one rank (collectives are
  no-ops, so the numbers are meaningless but every call is issued and counted) and its recorded
  bytes and calls per group must equal perfmodels.traffic for its pipeline stage.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_slow.py -q -m slow
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from tests.engine.harness import (
    AXES5,
    FIELDS,
    GLOBAL_BATCH,
    assert_trains_as_one_process,
    config,
    grid_id,
    options_for,
    predicted_traffic,
    run_grid,
)

pytestmark = pytest.mark.slow

GRIDS16 = [
    {"data": 2, "inter": 2, "depth": 1, "row": 2, "col": 2},
    {"data": 1, "inter": 2, "depth": 2, "row": 2, "col": 2},
    {"data": 2, "inter": 1, "depth": 2, "row": 2, "col": 2},
]


@pytest.mark.parametrize("degrees", GRIDS16, ids=[grid_id(d) for d in GRIDS16])
def test_16_ranks_match_single_process_and_traffic(degrees):
    options = options_for(degrees)
    results = run_grid(degrees, options)
    assert_trains_as_one_process(results, degrees, options.get("num_layers", 2))
    for r in results:
        want_bytes, _ = predicted_traffic(degrees, options, r["coords"]["inter"])
        assert {k: float(v) for k, v in r["bytes"].items()} == want_bytes


def _fake_rank(rank: int, world: int, degrees: dict[str, int], options: dict[str, Any], queue: Any) -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import engine
    from engine.models.gpt import GPT

    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        grid = engine.init(**{FIELDS[a]: degrees[a] for a in AXES5})
        torch.manual_seed(0)
        cfg = config(options.get("num_layers", 2))
        model = engine.ParallelGPT.from_serial(GPT(cfg), grid)
        local = GLOBAL_BATCH // grid.batch_shards
        mb = options["micro_batch_size"]
        tokens = torch.zeros(local, cfg.seq_length, dtype=torch.long)
        rec = engine.CommRecorder(grid)
        with rec:
            engine.forward_backward(model, tokens, tokens, micro_batch_size=mb)
            engine.sync_gradients(model)
        queue.put((rank, grid.coord("inter"), rec.bytes_per_group(), rec.calls_per_group()))
    finally:
        dist.destroy_process_group()


# Without pipeline stages: on the fake backend the pipelining warm-up vote (a real recv) reads
# zeros and switches to dynamic shape inference, whose object receive cannot work without peers.
FAKE = [
    ({"data": 2, "inter": 1, "depth": 2, "row": 4, "col": 4}, {"micro_batch_size": 1}),
    ({"data": 4, "inter": 1, "depth": 2, "row": 4, "col": 4}, {"micro_batch_size": 1}),
    ({"data": 1, "inter": 1, "depth": 8, "row": 8, "col": 2}, {"micro_batch_size": 1}),
]


@pytest.mark.parametrize(("degrees", "options"), FAKE, ids=[grid_id(d) for d, _ in FAKE])
def test_many_rank_layouts_on_the_fake_backend(degrees, options):
    world = 1
    for a in AXES5:
        world *= degrees[a]
    ctx = mp.get_context("fork")
    for rank in sorted({0, world // 2 - 1, world // 2 + 3, world - 1}):
        queue = ctx.SimpleQueue()
        proc = ctx.Process(target=_fake_rank, args=(rank, world, degrees, options, queue))
        proc.start()
        proc.join(120)
        assert proc.exitcode == 0, f"rank {rank} exited with {proc.exitcode}"
        _, stage, got_bytes, got_calls = queue.get()
        want_bytes, want_calls = predicted_traffic(degrees, options, stage)
        assert {k: float(v) for k, v in got_bytes.items()} == want_bytes, rank
        assert {k: float(v) for k, v in got_calls.items()} == want_calls, rank
