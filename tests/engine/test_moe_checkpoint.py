"""Sharded checkpoints of engine.MoE experts split over G_ep and G_etp: a resumed run (same grid,
another G_ep/G_etp, one process, another ZeRO stage) loads the saved model exactly (its full state
dict equals the one saved) and continues as the uninterrupted run and single-process training do
(1e-5); the consolidated state dict holds every expert once, under the single-process names.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_moe_checkpoint.py -q
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from engine.launch import launch
from tests.engine.harness import GLOBAL_BATCH, STEPS, batches
from tests.engine.test_moe import _optimizer, moe_config, reference

FIELDS = {"data": "G_data", "row": "G_intra_r", "inter": "G_inter", "ep": "G_ep", "etp": "G_etp"}
SAVE_AT = 2


def _world(degrees: dict[str, int]) -> int:
    world = 1
    for a, v in degrees.items():
        world *= v if a not in ("ep", "etp") else 1
    return world


def _run(rank: int, world: int, degrees: dict[str, int], path: str, mode: str, zero: int) -> dict[str, Any]:
    from torch.utils.data import TensorDataset

    import engine
    from engine.models.gpt import GPT

    grid = engine.init(**{FIELDS[a]: v for a, v in degrees.items()})
    cfg = moe_config()
    torch.manual_seed(0 if mode == "save" else 99)  # the resumed model must get its values from the file
    model = engine.ParallelGPT.from_serial(GPT(cfg), grid)
    opt = _optimizer(model, zero)
    start, loaded, saved = 0, None, None
    if mode == "resume":
        start = engine.load_checkpoint(path, model, opt)
        loaded = engine.full_state_dict(model)
    losses = {}
    loader = engine.create_dataloader(TensorDataset(*batches(cfg)), GLOBAL_BATCH)
    for step, (tok, tgt) in enumerate(loader):
        if step < start:
            continue
        opt.zero_grad()
        losses[step] = engine.forward_backward(model, tok, tgt)
        engine.step(model, opt)
        if mode == "save" and step + 1 == SAVE_AT:
            engine.save_checkpoint(path, model, opt, step=SAVE_AT, consolidated=True)
            saved = engine.full_state_dict(model)
    state = engine.full_state_dict(model)
    keep = rank == 0
    return {"coords": dict(grid.coords), "losses": losses, "state": state if keep else None,
            "loaded": loaded if keep else None, "saved": saved if keep else None}


def _loss_at(results: list[dict[str, Any]], step: int) -> float:
    first = [r for r in results if r["coords"]["row"] == 0]
    return sum(r["losses"][step] for r in first) / len(first)


SAVES = {"ep2-d2": ({"data": 2, "ep": 2}, 0), "ep2-d4-zero1": ({"data": 4, "ep": 2}, 1),
         "ep2-r2-d2": ({"data": 2, "row": 2, "ep": 2}, 0)}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = {}
    for key, (degrees, zero) in SAVES.items():
        path = str(tmp_path_factory.mktemp(f"moe-{key}"))
        out[key] = (path, launch(_run, _world(degrees), args=(degrees, path, "save", zero), timeout_s=120))
    return out


RESUMES = [("ep2-d2", {"data": 2, "ep": 2}, 0), ("ep2-d2", {"data": 4, "ep": 4}, 0), ("ep2-d2", {}, 0),
           ("ep2-d4-zero1", {"data": 4, "ep": 2}, 1), ("ep2-d4-zero1", {"data": 2, "ep": 2}, 3),
           ("ep2-r2-d2", {"data": 2, "row": 2, "ep": 2}, 0), ("ep2-r2-d2", {}, 0),
           ("ep2-r2-d2", {"data": 4, "ep": 2}, 2), ("ep2-r2-d2", {"data": 2, "row": 2, "ep": 4, "etp": 1}, 0),
           ("ep2-d4-zero1", {"data": 4, "ep": 2, "etp": 2}, 3)]


@pytest.mark.parametrize(("save", "degrees", "zero"), RESUMES,
                         ids=["ep2d2-same", "ep2d2-to-ep4d4", "ep2d2-to-one", "ep2d4z1-same",
                              "ep2d4z1-to-ep2d2z3", "ep2r2d2-same", "ep2r2d2-to-one", "ep2r2d2-to-ep2d4z2",
                              "ep2r2d2-to-r2-etp1-ep4", "ep2d4z1-to-d4-etp2-ep2-z3"])
def test_split_experts_resume_as_uninterrupted(saved, save, degrees, zero):
    path, uninterrupted = saved[save]
    resumed = launch(_run, _world(degrees), args=(degrees, path, "resume", zero), timeout_s=120)
    at_save = uninterrupted[0]["saved"]
    loaded = resumed[0]["loaded"]
    assert set(loaded) == set(at_save)
    for name, want in at_save.items():  # the loaded model is the saved one
        assert (loaded[name] - want).abs().max().item() <= 1e-6, name
    ref_losses, ref_state, _ = reference()
    for step in range(SAVE_AT, STEPS):  # its forward (the loss) and continued training
        got = _loss_at(resumed, step)
        assert got == pytest.approx(_loss_at(uninterrupted, step), rel=1e-5)
        assert got == pytest.approx(ref_losses[step], rel=1e-5)
    state = resumed[0]["state"]
    for name, want in ref_state.items():
        assert (state[name] - want).abs().max().item() <= 1e-5, name


@pytest.mark.parametrize("save", list(SAVES))
def test_consolidated_holds_every_expert_once_with_single_process_names(saved, save):
    from engine.models.gpt import GPT

    path, uninterrupted = saved[save]
    consolidated = torch.load(os.path.join(path, "consolidated.pt"), weights_only=True)
    fresh = GPT(moe_config())
    assert list(consolidated) == list(fresh.state_dict())
    fresh.load_state_dict(consolidated, strict=True)
    for name, want in uninterrupted[0]["saved"].items():
        assert torch.equal(consolidated[name], want), name
    assert consolidated["blocks.0.mlp.fc1"].shape == fresh.blocks[0].mlp.fc1.shape
