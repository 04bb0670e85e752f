"""auto_parallelize(attention=True): nn.MultiheadAttention becomes head-parallel (heads over
G_intra_r); a tiny self-attention model (causal mask, batch_first and not) trains exactly as in
one process at 1e-5 on 4-rank grids.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_mha.py -q
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from engine.launch import launch
from tests.engine.harness import isolated

GLOBAL, STEPS, L, E = 8, 3, 5, 16


class Attn(nn.Module):
    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.attn = nn.MultiheadAttention(E, 4, batch_first=batch_first)
        self.fc = nn.Linear(E, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.triu(torch.ones(L, L, dtype=torch.bool), 1)
        h = x if self.batch_first else x.transpose(0, 1)
        out, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        out = out if self.batch_first else out.transpose(0, 1)
        return self.fc(out.mean(1))


def _run(rank: int, world: int, degrees: dict[str, int] | None, batch_first: bool) -> dict[str, Any]:
    torch.set_num_threads(1)
    import engine
    from engine.mha import HeadParallelMultiheadAttention

    grid = engine.init(**(degrees or {}))
    torch.manual_seed(0)
    if degrees is None:
        net: nn.Module = Attn(batch_first)
    else:
        with engine.auto_parallelize(grid, attention=True):
            net = Attn(batch_first)
        net = engine.wrap(net, grid=grid)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(STEPS * GLOBAL, L, E, generator=g), torch.randint(0, 3, (STEPS * GLOBAL,), generator=g)
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
    return {"losses": losses, "replica": replica, "in_w": state["attn.in_proj_weight"].reshape(3 * E, E),
            "out_w": state["attn.out_proj.weight"],
            "split": isinstance(net.attn, HeadParallelMultiheadAttention)}


CASES = [({"G_intra_r": 4}, True), ({"G_intra_r": 2, "G_data": 2}, False),
         ({"G_intra_r": 2, "G_intra_c": 2}, True), ({"G_intra_r": 2, "G_intra_d": 2}, False)]


@pytest.mark.parametrize(("degrees", "batch_first"), CASES, ids=[f"{d}-bf{b}" for d, b in CASES])
def test_head_parallel_attention_matches_single_process(degrees, batch_first):
    ref = isolated(_run, 0, 1, None, batch_first)
    results = launch(_run, 4, args=(degrees, batch_first), timeout_s=120)
    by_replica = {r["replica"]: r["losses"] for r in results}
    mean = [sum(ls[s] for ls in by_replica.values()) / len(by_replica) for s in range(STEPS)]
    assert mean == pytest.approx(ref["losses"], rel=1e-5)
    for r in results:
        assert r["split"]
        assert (r["in_w"] - ref["in_w"]).abs().max().item() <= 1e-5
        assert (r["out_w"] - ref["out_w"]).abs().max().item() <= 1e-5
