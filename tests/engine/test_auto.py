"""engine.auto_parallelize on an MLP: exact training and the byte contract.

For every factorization of 1, 2 and 4 ranks over (data, depth, row, col), and three 8-rank grids:
under the context an MLP's nn.Linears become 3D Linears where the shapes divide (the last layer,
16 -> 6, stays plain on grids with G_intra_r in {4, 8}); the model takes and returns ordinary
activations. 3 AdamW steps match single-process training (losses 1e-5 relative, parameters 1e-5
absolute, same state_dict keys), and the last step's bytes and calls per group equal
perfmodels.traffic's layer-list prediction.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_auto.py -q
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from engine.launch import launch
from tests.engine.harness import AXES5, FIELDS, factorizations, grid_id, isolated

BATCH, STEPS = 8, 3
SIZES = [(8, 32), (32, 16), (16, 6)]


def mlp() -> nn.Module:
    layers: list[nn.Module] = []
    for i, (k, n) in enumerate(SIZES):
        layers.append(nn.Linear(k, n))
        if i < len(SIZES) - 1:
            layers.append(nn.GELU())
    return nn.Sequential(*layers)


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return (torch.randn(STEPS * BATCH, SIZES[0][0], generator=g),
            torch.randn(STEPS * BATCH, SIZES[-1][1], generator=g))


def optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3, eps=1e-5, weight_decay=0.01)


def reference() -> tuple[list[float], dict[str, torch.Tensor]]:
    return isolated(_reference)


def _reference() -> tuple[list[float], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    net = mlp()
    opt = optimizer(net.parameters())
    x, y = data()
    losses = []
    for s in range(STEPS):
        sl = slice(s * BATCH, (s + 1) * BATCH)
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x[sl]), y[sl])
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, {k: v.detach().clone() for k, v in net.state_dict().items()}


def _train(rank: int, world: int, degrees: dict[str, int]) -> dict[str, Any]:
    from torch.utils.data import TensorDataset

    import engine

    grid = engine.init(**{FIELDS[a]: degrees[a] for a in AXES5})
    torch.manual_seed(0)
    with engine.auto_parallelize():
        net = mlp()
    kinds = [type(m).__name__ for m in net]
    opt = optimizer(net.parameters())
    loader = engine.create_dataloader(TensorDataset(*data()), BATCH)
    rec = engine.CommRecorder(grid)
    losses = []
    for s, (x, y) in enumerate(loader):
        opt.zero_grad()
        with rec if s == STEPS - 1 else engine.no_sync(net):
            loss = nn.functional.mse_loss(net(x), y)
            loss.backward()
        if s == STEPS - 1:
            with rec:
                engine.sync_gradients(net)
        else:
            engine.sync_gradients(net)
        opt.step()
        losses.append(float(loss.detach()))
    state = engine.full_state_dict(net)
    return {"coords": dict(grid.coords), "losses": losses, "kinds": kinds, "bytes": rec.bytes_per_group(),
            "calls": rec.calls_per_group(), "table": rec.table(), "state": state if rank == 0 else None}


def predicted(degrees: dict[str, int], kinds: list[str]) -> tuple[dict[str, float], dict[str, float]]:
    from perfmodels.plans import from_plans
    from perfmodels.specs import LayerSpec, Model, Plan, Training
    from perfmodels.traffic import bytes_per_group, calls_per_group

    specs = []
    linears = iter(SIZES)
    for i, kind in enumerate(kinds):
        if kind == "GELU":
            specs.append(LayerSpec(name=f"{i}", kind="other", params=0))
        else:
            k, n = next(linears)
            specs.append(LayerSpec(name=f"{i}", in_features=k, out_features=n, parallel=kind == "Linear"))
    model = Model(layers=tuple(specs))
    local = BATCH // (degrees["data"] * degrees["depth"])
    plan = Plan(**{FIELDS[a]: degrees[a] for a in AXES5}, micro_batch_size=local)
    arrays = from_plans([plan])
    training = Training(global_batch_size=BATCH, dtype="fp32")
    b = {k: float(v[0]) for k, v in bytes_per_group(model, training, arrays).items()}
    c = {k: float(v[0]) for k, v in calls_per_group(model, training, arrays).items()}
    return b, c


AXES4 = ("data", "depth", "row", "col")
GRIDS = [
    *(d for w in (1, 2, 4) for d in factorizations(w, AXES4)),  # every factorization of 1, 2 and 4 ranks
    {"data": 1, "inter": 1, "depth": 2, "row": 2, "col": 2},
    {"data": 2, "inter": 1, "depth": 1, "row": 4, "col": 1},
    {"data": 1, "inter": 1, "depth": 1, "row": 2, "col": 4},
]


@pytest.mark.parametrize("degrees", GRIDS, ids=[grid_id(d) for d in GRIDS])
def test_auto_parallelized_mlp_matches_single_process_and_traffic(degrees):
    world = 1
    for a in AXES5:
        world *= degrees[a]
    results = launch(_train, world_size=world, args=(degrees,), timeout_s=60)
    ref_losses, ref_state = reference()
    replicas = [r for r in results if r["coords"]["row"] == 0 and r["coords"]["col"] == 0]
    losses = [sum(r["losses"][s] for r in replicas) / len(replicas) for s in range(STEPS)]
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    state = results[0]["state"]
    assert set(state) == set(ref_state)
    for name, ref in ref_state.items():
        assert (state[name] - ref).abs().max().item() <= 1e-5, name
    assert "Linear" in results[0]["kinds"]
    for r in results:
        want_bytes, want_calls = predicted(degrees, r["kinds"])
        assert {k: float(v) for k, v in r["bytes"].items()} == want_bytes, r["table"]
        assert {k: float(v) for k, v in r["calls"].items()} == want_calls, r["table"]
