"""PyTorch Lightning: Trainer(strategy=GridtuneStrategy(G_intra_r=2, ...)) trains a LightningModule
with the engine's layout on 2-4 gloo ranks exactly as single-process training (1e-5).

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_lightning.py -q
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from torch import nn

from engine.launch import launch
from tests.engine.harness import isolated

pl = pytest.importorskip("pytorch_lightning",
                         reason="pytorch-lightning is not installed (pip install gridtune[lightning])")

GLOBAL, STEPS = 8, 3


class Module(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def _data() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(9)
    return torch.utils.data.TensorDataset(torch.randn(STEPS * GLOBAL, 8, generator=g),
                                          torch.randn(STEPS * GLOBAL, 4, generator=g))


def _reference() -> dict[str, torch.Tensor]:
    torch.set_num_threads(1)
    module = Module()
    opt = module.configure_optimizers()
    ds = _data()
    # Lightning gives training loaders a shuffling DistributedSampler (seed 0, epoch 0): every rank
    # draws the same permutation and takes every num_replicas-th index, so a step's global batch is
    # the next GLOBAL indices of that permutation
    perm = torch.randperm(len(ds), generator=torch.Generator().manual_seed(0))
    for s in range(STEPS):
        x, y = ds[perm[s * GLOBAL:(s + 1) * GLOBAL]]
        opt.zero_grad()
        module.training_step((x, y), s).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _fit(rank: int, world: int, degrees: dict[str, int]) -> dict[str, Any]:
    torch.set_num_threads(1)
    os.environ["LOCAL_RANK"] = str(rank)
    import engine
    from engine.lightning import GridtuneStrategy

    module = Module()
    strategy = GridtuneStrategy(**degrees)
    shards = world // (degrees.get("G_intra_r", 1) * degrees.get("G_intra_c", 1))
    loader = torch.utils.data.DataLoader(_data(), batch_size=GLOBAL // shards, shuffle=False)
    trainer = pl.Trainer(strategy=strategy, accelerator="cpu", devices=1, max_steps=STEPS, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0)
    trainer.fit(module, loader)
    split = sum(1 for m in module.modules() if isinstance(m, engine.Linear))
    return {"state": engine.full_state_dict(module, grid=strategy.grid), "split": split}


@pytest.mark.parametrize("degrees",
                         [{"G_intra_r": 2}, {"G_intra_r": 2, "G_data": 2}, {"G_intra_c": 2, "G_data": 2}],
                         ids=["r2", "r2xd2", "c2xd2"])
def test_lightning_strategy_matches_single_process(degrees):
    ref = isolated(_reference)
    world = 1
    for v in degrees.values():
        world *= v
    for r in launch(_fit, world, args=(degrees,), timeout_s=180):
        assert r["split"] == 2
        for name, want in ref.items():
            assert (r["state"][name] - want).abs().max().item() <= 1e-5, name
