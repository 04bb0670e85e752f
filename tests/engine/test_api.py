"""The AxoNN-friendly API and the memory-scalable start, on real forked gloo ranks.

- ParallelGPT(cfg) allocates only this rank's shards yet equals GPT(cfg) for the same seed, also
  across pipeline stages (the other stages' draws are made and dropped);
- full_state_dict gathers over the tensor and pipeline axes only (nothing on data or the world);
- a checkpoint reloaded on the same grid opens exactly one file per rank;
- replicas built with different seeds agree after wrap (broadcast), and an optimizer step after a
  backward without gradient sync raises instead of letting the replicas drift;
- the device comes from LOCAL_RANK / SLURM_LOCALID.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_api.py -q
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from engine.grid import local_device_index
from engine.launch import launch
from engine.models.gpt import GPT
from tests.engine.harness import GLOBAL_BATCH, batches, config, isolated, make_optimizer


def _build(rank: int, world: int, degrees: dict[str, int], path: str) -> dict[str, Any]:
    import engine
    from engine.checkpoint import INDEX, _named_tensors, _needed_files

    grid = engine.init(**degrees)
    torch.manual_seed(0)
    model = engine.ParallelGPT(config(4), grid)
    rec = engine.CommRecorder(grid)
    with rec:
        full = engine.full_state_dict(model)
    engine.save_checkpoint(path, model, make_optimizer(model.parameters()), step=1)
    index = torch.load(f"{path}/{INDEX}", weights_only=False)
    needed = _needed_files(index, _named_tensors(model)[1], grid)
    return {"full": full if rank == 0 else None, "bytes": rec.bytes_per_group(), "calls": rec.calls,
            "needed": needed, "coords": dict(grid.coords)}


@pytest.mark.parametrize("degrees", [{"G_inter": 2, "G_intra_r": 2},
                                     {"G_data": 2, "G_intra_d": 2, "G_intra_c": 2},
                                     {"G_data": 2, "G_intra_r": 2, "G_intra_c": 2}],
                         ids=["inter2-row2", "data2-depth2-col2", "data2-row2-col2"])
def test_shard_only_construction_equals_serial_and_gathers_over_needed_groups(tmp_path, degrees):
    world = 1
    for d in degrees.values():
        world *= d
    results = launch(_build, world_size=world, args=(degrees, str(tmp_path)), timeout_s=60)
    torch.manual_seed(0)
    ref = GPT(config(4)).state_dict()
    full = results[0]["full"]
    assert list(full) == list(ref)
    for name, value in ref.items():
        assert torch.equal(full[name], value), name
    for rank, r in enumerate(results):
        assert r["bytes"]["data"] == 0
        assert not any(axis == "other" for axis, _ in r["calls"])  # never over the world group
        # the same grid reads back exactly one file: the data-replica-0 rank with the same coordinates
        want = rank % (world // degrees.get("G_data", 1))
        assert r["needed"] == [want], (rank, r["coords"])


def _guard(rank: int, world: int) -> dict[str, Any]:
    import engine

    out: dict[str, Any] = {}
    grid = engine.init(G_data=2)
    torch.manual_seed(rank)  # different seeds on purpose: wrap broadcasts rank 0's values
    model = engine.ParallelGPT.from_serial(GPT(config()), grid)
    out["first"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = make_optimizer(model.parameters())
    tokens, targets = batches(config(), 1)
    local = tokens[rank * 4:(rank + 1) * 4], targets[rank * 4:(rank + 1) * 4]
    engine.forward_backward(model, *local)
    try:
        opt.step()
    except RuntimeError as exc:
        out["error"] = str(exc)
    engine.step(model, opt)  # syncs, then steps
    engine.sync_gradients(model)  # nothing accumulated since: must not scale again
    out["after"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    with engine.no_sync(model):
        engine.forward_backward(model, *local)
    engine.forward_backward(model, *local)
    engine.step(model, opt)  # gradient accumulation: one sync for both backwards
    out["final"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return out


def test_replicas_agree_and_an_unsynced_step_raises():
    a, b = launch(_guard, world_size=2, timeout_s=60)
    for key in ("first", "after", "final"):
        for name in a[key]:
            assert torch.equal(a[key][name], b[key][name]), (key, name)
    for r in (a, b):
        assert "engine.sync_gradients(model)" in r["error"] and "AdamW.step()" in r["error"]
    first, after = isolated(_guard_reference)
    for n, p in first.items():
        assert torch.equal(a["first"][n].view_as(p), p), n
        assert (a["after"][n].view_as(p) - after[n]).abs().max() <= 1e-5, n


def _guard_reference() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    ref = GPT(config())
    first = {n: p.detach().clone() for n, p in ref.named_parameters()}
    opt = make_optimizer(ref.parameters())
    tokens, targets = batches(config(), 1)
    ref(tokens[:GLOBAL_BATCH], targets[:GLOBAL_BATCH]).backward()
    opt.step()
    return first, {n: p.detach().clone() for n, p in ref.named_parameters()}


def test_device_index_comes_from_the_launcher(monkeypatch):
    for key in ("LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    assert local_device_index(rank=13, gpus_per_node=4) == 1
    monkeypatch.setenv("SLURM_LOCALID", "2")
    assert local_device_index(rank=13, gpus_per_node=4) == 2
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert local_device_index(rank=13, gpus_per_node=4) == 3
