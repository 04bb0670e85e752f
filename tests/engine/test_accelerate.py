"""Hugging Face Accelerate: `GridtunePlugin(...).prepare(model, optimizer, dataloader)` with an
`accelerate.Accelerator` loop (accelerator.backward, optimizer.step) trains an MLP on 2 gloo ranks
exactly as single-process training (losses and final parameters at 1e-5): row2, data2, col2 with
ZeRO-2, data2 with ZeRO-3 and offload="params".

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_accelerate.py -q
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from engine.launch import launch
from tests.engine.harness import isolated

pytest.importorskip("accelerate", reason="accelerate is not installed (pip install gridtune[accelerate])")

GLOBAL, STEPS = 8, 3


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def _optimizer(model: nn.Module, one_group: bool = False) -> torch.optim.Optimizer:
    if one_group:  # engine.Zero3 steps one parameter group
        return torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-6, weight_decay=0.1)
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    rest = [p for n, p in model.named_parameters() if not n.endswith("weight")]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                             lr=1e-2, eps=1e-6)


def _data() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(9)
    return torch.utils.data.TensorDataset(torch.randn(STEPS * GLOBAL, 8, generator=g),
                                          torch.randn(STEPS * GLOBAL, 4, generator=g))


def _reference(one_group: bool) -> tuple[list[float], dict[str, torch.Tensor]]:
    torch.set_num_threads(1)
    model = _model()
    opt = _optimizer(model, one_group)
    losses = []
    for x, y in torch.utils.data.DataLoader(_data(), batch_size=GLOBAL):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _rank(rank: int, world: int, degrees: dict[str, int], options: dict[str, Any]) -> dict[str, Any]:
    from accelerate import Accelerator

    import engine
    from engine.accelerate import GridtunePlugin

    torch.set_num_threads(1)
    plugin = GridtunePlugin(**degrees, **options)
    grid = plugin.setup()
    accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == world
    model = _model()
    per_replica = GLOBAL if options.get("split_batches") else GLOBAL // grid.batch_shards
    loader = torch.utils.data.DataLoader(_data(), batch_size=per_replica)
    model, opt, loader = plugin.prepare(model, _optimizer(model, options.get("zero_stage") == 3), loader)
    losses = []
    for x, y in loader:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x.to(plugin.device)), y.to(plugin.device))
        accelerator.backward(loss)
        opt.step()
        mean = loss.detach().clone()  # the global mean loss: replicas' means averaged
        torch.distributed.all_reduce(mean)
        losses.append(float(mean) / world)
    if options.get("zero_stage") == 3:
        opt.materialize()
    split = sum(isinstance(m, engine.ShardedLinear) for m in model.modules())
    return {"losses": losses, "state": engine.full_state_dict(model), "split": split,
            "steps": len(losses)}


CASES = [({"G_intra_r": 2}, {}), ({"G_data": 2}, {}), ({"G_intra_c": 2}, {"zero_stage": 2}),
         ({"G_data": 2}, {"zero_stage": 3, "offload": "params", "split_batches": True})]


@pytest.mark.parametrize(("degrees", "options"), CASES,
                         ids=["row2", "data2", "col2-zero2", "data2-zero3-offload-params"])
def test_accelerate_plugin_trains_as_one_process(degrees, options):
    ref_losses, ref_state = isolated(_reference, options.get("zero_stage") == 3)
    results = launch(_rank, 2, args=(degrees, options), timeout_s=120)
    for r in results:
        assert r["steps"] == STEPS
        assert r["losses"] == pytest.approx(ref_losses, rel=1e-5)
        assert set(r["state"]) == set(ref_state)
        for name, ref in ref_state.items():
            assert (r["state"][name] - ref).abs().max().item() <= 1e-5, name
    if degrees.get("G_intra_r", 1) > 1 or degrees.get("G_intra_c", 1) > 1:
        assert results[0]["split"] == 2  # both Linears split


def test_plugin_refuses_bad_arguments_before_any_collective():
    import torch.distributed as dist

    from engine.accelerate import GridtunePlugin

    with pytest.raises(ValueError, match="G_intra_r must be a positive integer, got 0"):
        GridtunePlugin(G_intra_r=0)
    with pytest.raises(ValueError, match=r"offload must be .* got 'gpu'"):
        GridtunePlugin(zero_stage=3, offload="gpu")
    with pytest.raises(ValueError, match="offload='params' needs ZeRO-3"):
        GridtunePlugin(zero_stage=2, offload="params")
    with pytest.raises(ValueError, match="zero_stage must be 0, 1, 2 or 3, got 4"):
        GridtunePlugin(zero_stage=4)
    assert not dist.is_initialized()
