"""engine.ShardedLinear on its own: same initial weights as torch.nn.Linear for the same seed, a normal ->
transposed pair computes the dense result in the AxoNN layout (input and output split over col)
with the dense gradients, and clip_grad_norm_ over the grid equals torch's on the dense layers.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_linear.py -q
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.launch import launch
from tests.engine.harness import isolated


def _pair(rank: int, world: int) -> dict[str, Any]:
    import engine

    grid = engine.init(G_intra_d=2, G_intra_r=2, G_intra_c=2)
    torch.manual_seed(0)
    model = nn.Sequential(engine.ShardedLinear(16, 32), nn.GELU(),
                          engine.ShardedLinear(32, 16, transpose=True))
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 16, generator=g)
    # the batch is split over depth; features over col
    d, c = grid.coord("depth"), grid.coord("col")
    x_local = x.chunk(2, dim=0)[d].chunk(2, dim=-1)[c]
    y = model(x_local)
    (y.square().sum() / 4).backward()  # the mean over the global batch of a per-sample loss
    engine.sync_gradients(model)
    # torch's calling convention (parameters), no clipping at this bound: the same global norm
    params_norm = float(engine.clip_grad_norm_(model.parameters(), 1e9))
    norm = float(engine.clip_grad_norm_(model, max_norm=0.01))
    return {"coords": dict(grid.coords), "y": y.detach(), "norm": norm, "params_norm": params_norm,
            "state": engine.full_state_dict(model),
            "grads": {n: p.grad.clone() for n, p in model.named_parameters()}}


def _dense() -> tuple[dict[str, torch.Tensor], torch.Tensor, float]:
    torch.manual_seed(0)
    dense = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
    init = {k: v.clone() for k, v in dense.state_dict().items()}
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 16, generator=g)
    y = dense(x)
    (y.square().sum() / 4 / 2).backward()  # each depth rank's loss covers half the batch, summed
    dense_norm = float(torch.nn.utils.clip_grad_norm_(dense.parameters(), max_norm=0.01))
    return init, y.detach(), dense_norm


def test_linear_pair_equals_dense():
    results = launch(_pair, world_size=8, timeout_s=60)
    init, y, dense_norm = isolated(_dense)
    for r in results:
        assert set(r["state"]) == set(init)
        for name, value in init.items():
            assert torch.equal(r["state"][name], value), name  # same RNG draws, bit for bit
        d, c = r["coords"]["depth"], r["coords"]["col"]
        assert torch.allclose(r["y"], y.detach().chunk(2, dim=0)[d].chunk(2, dim=-1)[c], atol=1e-6)
    # the pair's loss per depth replica is sum/4 over half the batch; sync divides by G_d=2
    assert abs(results[0]["norm"] - dense_norm) <= 1e-5 * dense_norm
    for r in results:  # issue 23: clip_grad_norm_ accepts parameters as torch's does
        assert abs(r["params_norm"] - dense_norm) <= 1e-5 * dense_norm


def _load_unsharded(rank: int, world: int, degrees: dict[str, int]) -> float:
    import engine

    grid = engine.init(**degrees)
    layer = engine.Linear(16, 16, grid=grid)
    torch.manual_seed(7)
    dense = nn.Linear(16, 16)
    layer.load_state_dict(dense.state_dict())  # AxoNN's own test does exactly this
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(1))
    return float((layer(x) - dense(x)).abs().max())


def test_unsharded_linear_state_dict_loads_into_the_parallel_linear():
    """Issue 23: `layer.load_state_dict(nn.Linear(H, H).state_dict())` raised a size mismatch on
    row2, col2 and depth2; the full tensors are now cut to this rank's shard on load."""
    for degrees in ({"G_intra_r": 2}, {"G_intra_c": 2}, {"G_intra_d": 2}):
        for diff in launch(_load_unsharded, 2, args=(degrees,), timeout_s=60):
            assert diff <= 1e-6, degrees
