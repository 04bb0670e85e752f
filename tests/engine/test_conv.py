"""auto_parallelize(conv=True): nn.Conv2d becomes a channel-split conv (output channels over
G_intra_r); a small CNN trains exactly as in one process at 1e-5 on 4-rank grids.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_conv.py -q
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from engine.launch import launch
from tests.engine.harness import isolated

GLOBAL, STEPS = 8, 3


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 4, 3)
        self.fc = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv2(torch.relu(self.conv1(x)))).flatten(1))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return (torch.randn(STEPS * GLOBAL, 3, 6, 6, generator=g),
            torch.randint(0, 5, (STEPS * GLOBAL,), generator=g))


def _run(rank: int, world: int, degrees: dict[str, int] | None) -> dict[str, Any]:
    torch.set_num_threads(1)
    import engine
    from engine.conv import ChannelParallelConv2d

    grid = engine.init(**(degrees or {}))
    torch.manual_seed(0)
    if degrees is None:
        net: nn.Module = CNN()
    else:
        with engine.auto_parallelize(grid, conv=True):
            net = CNN()
        net = engine.wrap(net, grid=grid)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    x, y = _data()
    local = GLOBAL // grid.batch_shards
    replica = grid.coord("data") * grid.size("depth") + grid.coord("depth")
    losses = []
    for s in range(STEPS):
        rows = slice(s * GLOBAL + replica * local, s * GLOBAL + (replica + 1) * local)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(x[rows]), y[rows])
        loss.backward()
        engine.step(net, opt)
        losses.append(float(loss))
    state = engine.full_state_dict(net) if degrees is not None else net.state_dict()
    return {"losses": losses, "replica": replica, "conv1": state["conv1.weight"],
            "conv2_b": state["conv2.bias"], "split": isinstance(net.conv1, ChannelParallelConv2d)}


GRIDS = [{"G_intra_r": 4}, {"G_intra_r": 2, "G_data": 2}, {"G_intra_r": 2, "G_intra_c": 2},
         {"G_intra_r": 2, "G_intra_d": 2}]


@pytest.mark.parametrize("degrees", GRIDS, ids=[str(d) for d in GRIDS])
def test_channel_split_conv_matches_single_process(degrees):
    ref = isolated(_run, 0, 1, None)
    results = launch(_run, 4, args=(degrees,), timeout_s=120)
    by_replica = {r["replica"]: r["losses"] for r in results}
    mean = [sum(ls[s] for ls in by_replica.values()) / len(by_replica) for s in range(STEPS)]
    assert mean == pytest.approx(ref["losses"], rel=1e-5)
    for r in results:
        assert r["split"]
        assert (r["conv1"] - ref["conv1"]).abs().max().item() <= 1e-5
        assert (r["conv2_b"] - ref["conv2_b"]).abs().max().item() <= 1e-5
