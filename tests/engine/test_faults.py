"""Faults: a rank that raises brings every rank down with its error (no hang), and a bad
configuration fails on every rank, before any collective, with a message naming every factor.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_faults.py -q
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from engine.launch import RankFailed, launch
from engine.models.gpt import GPT, GPTConfig


def _raise_on_rank_2(rank: int, world: int) -> None:
    import engine

    grid = engine.init(G_data=2, G_intra_r=2)
    torch.manual_seed(0)
    model = engine.ParallelGPT.from_serial(GPT(GPTConfig(num_layers=1, hidden_size=16, num_attention_heads=2,
                                                         seq_length=4, vocab_size=16)), grid)
    if rank == 2:
        raise ValueError("injected failure on rank 2")
    tokens = torch.zeros(2, 4, dtype=torch.long)
    for _ in range(100):  # the peers block in collectives that rank 2 never joins
        model(tokens, tokens).backward()
        engine.sync_gradients(model)


def test_one_rank_raising_stops_every_rank_with_that_error():
    with pytest.raises(RankFailed) as info:
        launch(_raise_on_rank_2, world_size=4, timeout_s=30)
    message = str(info.value)
    assert "rank 2 failed" in message
    assert "injected failure on rank 2" in message


def _bad_configs(rank: int, world: int) -> dict[str, str]:
    import engine
    from engine.recorder import CommRecorder

    out = {}
    try:
        engine.init(G_data=3, G_intra_r=2)  # 6 != 4: must fail on every rank before any group exists
    except engine.GridError as exc:
        out["grid"] = str(exc)
    grid = engine.init(G_data=2, G_intra_r=2)
    rec = CommRecorder(grid)
    with rec:
        try:
            engine.ParallelGPT.from_serial(GPT(GPTConfig(num_layers=1, hidden_size=24, num_attention_heads=3,
                                                         seq_length=4, vocab_size=16)), grid)
        except engine.GridError as exc:
            out["gpt"] = str(exc)
        try:
            engine.create_dataloader(TensorDataset(torch.zeros(12, 4)), global_batch_size=5)
        except engine.GridError as exc:
            out["batch"] = str(exc)
        try:
            engine.Linear(16, 15, grid=grid)
        except engine.GridError as exc:
            out["linear"] = str(exc)
    out["collectives"] = str(sum(rec.calls.values()))
    return out


def test_bad_configs_fail_on_every_rank_before_any_collective():
    results = launch(_bad_configs, world_size=4, timeout_s=30)
    for out in results:
        grid_message = "G_data*G_inter*G_intra_d*G_intra_r*G_intra_c = 3*1*1*2*1 = 6 but the world size is 4"
        assert grid_message in out["grid"]
        assert "G_intra_r=2 does not divide num_attention_heads=3" in out["gpt"]
        assert "global_batch_size=5 is not divisible by G_data*G_intra_d = 2*1 = 2" in out["batch"]
        assert "G_intra_r=2 does not divide out_features=15" in out["linear"]
        assert out["collectives"] == "0"


def _row_all_reduce_with_a_missing_rank(rank: int, world: int, axis: str) -> dict[str, float]:
    import time

    import torch.distributed as dist

    import engine

    grid = engine.init(G_data=2, G_intra_r=2)
    out = {"timeout_s": grid.timeout_s}
    if rank == 3:  # never joins: its peers must time out on the subgroup, not hang for 30 minutes
        time.sleep(25)
        return out
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4), group=grid.group(axis))
        dist.all_reduce(torch.ones(4), group=grid.group(axis))
    except RuntimeError:
        out["raised_after_s"] = time.monotonic() - start
    return out


@pytest.mark.parametrize("axis", ["row", "data"])
def test_a_stuck_rank_raises_within_the_timeout_on_every_subgroup(axis):
    """Issue 23 (3): init_device_mesh's per-axis groups kept torch's 30-minute gloo default."""
    results = launch(_row_all_reduce_with_a_missing_rank, world_size=4, args=(axis,), timeout_s=4)
    assert all(r["timeout_s"] == 4 for r in results)
    # the members of rank 3's group along `axis` block on it and must raise within the timeout
    blocked = [r for rank, r in enumerate(results) if rank != 3 and "raised_after_s" in r]
    assert blocked, results
    for r in blocked:
        assert r["raised_after_s"] < 4 + 10, r
