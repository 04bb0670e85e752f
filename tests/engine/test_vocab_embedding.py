"""auto_parallelize(embedding=True): nn.Embedding becomes a vocabulary-parallel embedding (rows
split over G_intra_r, vocabulary padded), and a model of Embedding -> Linear -> Linear trains
exactly as in one process at 1e-5 on 4-rank grids with data, row, col and depth parallelism.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_vocab_embedding.py -q
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from engine.launch import launch
from tests.engine.harness import isolated

VOCAB, DIM, GLOBAL, STEPS = 30, 16, 8, 3  # 30 rows: padded to 32 on G_intra_r=4


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.fc1 = nn.Linear(DIM, 32)
        self.fc2 = nn.Linear(32, 5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(self.emb(ids).mean(1))))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return (torch.randint(0, VOCAB, (STEPS * GLOBAL, 6), generator=g),
            torch.randint(0, 5, (STEPS * GLOBAL,), generator=g))


def _reference() -> tuple[list[float], torch.Tensor]:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    x, y = _data()
    losses = []
    for s in range(STEPS):
        opt.zero_grad()
        step = slice(s * GLOBAL, (s + 1) * GLOBAL)
        loss = nn.functional.cross_entropy(net(x[step]), y[step])
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses, net.emb.weight.detach().clone()


def _body(rank: int, world: int, degrees: dict[str, int]) -> dict[str, Any]:
    import engine
    from engine.vocab_embedding import VocabParallelEmbedding

    grid = engine.init(**degrees)
    torch.manual_seed(0)
    with engine.auto_parallelize(grid, embedding=True):
        net = Net()
    net = engine.wrap(net, grid=grid)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    x, y = _data()
    shards = grid.batch_shards
    local = GLOBAL // shards
    replica = grid.coord("data") * grid.size("depth") + grid.coord("depth")
    losses = []
    for s in range(STEPS):
        rows = slice(s * GLOBAL + replica * local, s * GLOBAL + (replica + 1) * local)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(x[rows]), y[rows])
        loss.backward()
        engine.step(net, opt)
        losses.append(float(loss))
    state = engine.full_state_dict(net)
    return {"losses": losses, "emb": state["emb.weight"],
            "parallel": isinstance(net.emb, VocabParallelEmbedding), "local_rows": net.emb.weight.shape[0],
            "replica": replica}


GRIDS = [{"G_intra_r": 4}, {"G_intra_r": 2, "G_data": 2}, {"G_intra_r": 2, "G_intra_c": 2},
         {"G_intra_r": 2, "G_intra_d": 2}]


@pytest.mark.parametrize("degrees", GRIDS, ids=[str(d) for d in GRIDS])
def test_vocab_parallel_embedding_matches_single_process(degrees):
    ref_losses, ref_emb = isolated(_reference)
    results = launch(_body, 4, args=(degrees,), timeout_s=120)
    by_replica = {r["replica"]: r["losses"] for r in results}
    mean = [sum(ls[s] for ls in by_replica.values()) / len(by_replica) for s in range(STEPS)]
    assert mean == pytest.approx(ref_losses, rel=1e-5)
    for r in results:
        assert r["parallel"] and r["local_rows"] == -(-VOCAB // degrees["G_intra_r"])
        assert (r["emb"] - ref_emb).abs().max().item() <= 1e-5


class TiedNet(nn.Module):
    """Embedding and output head share one weight (as GPT-2 does)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(32, DIM)
        self.fc = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, 32, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.fc(self.emb(ids))))


def _tied_run(degrees: dict[str, int] | None) -> dict[str, Any]:
    torch.set_num_threads(1)
    import engine

    grid = engine.init(**(degrees or {}))
    torch.manual_seed(0)
    if degrees is None:
        net: nn.Module = TiedNet()
    else:
        with engine.auto_parallelize(grid, embedding=True):
            net = TiedNet()
        net = engine.wrap(net, grid=grid)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(5)
    x = torch.randint(0, 32, (STEPS * GLOBAL, 4), generator=g)
    shards = grid.batch_shards
    local = GLOBAL // shards
    replica = grid.coord("data") * grid.size("depth") + grid.coord("depth")
    losses = []
    for s in range(STEPS):
        rows = slice(s * GLOBAL + replica * local, s * GLOBAL + (replica + 1) * local)
        opt.zero_grad()
        logits = net(x[rows][:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 32), x[rows][:, 1:].reshape(-1))
        loss.backward()
        engine.step(net, opt)
        losses.append(float(loss))
    return {"losses": losses, "replica": replica, "tied": net.head.weight is net.emb.weight}


@pytest.mark.parametrize("degrees", [{"G_intra_r": 4}, {"G_intra_r": 2, "G_data": 2}], ids=["r4", "r2d2"])
def test_weight_tying_between_vocab_parallel_embedding_and_head_survives(degrees):
    ref = launch(lambda rank, world: _tied_run(None), 1, timeout_s=60)[0]["losses"]
    results = launch(lambda rank, world: _tied_run(degrees), 4, timeout_s=120)
    assert all(r["tied"] for r in results)
    by_replica = {r["replica"]: r["losses"] for r in results}
    mean = [sum(ls[s] for ls in by_replica.values()) / len(by_replica) for s in range(STEPS)]
    assert mean == pytest.approx(ref, rel=1e-5)


def test_tying_on_a_col_split_grid_is_refused_before_any_collective():
    def body(rank: int, world: int) -> str:
        import engine

        grid = engine.init(G_intra_r=2, G_intra_c=2)
        with engine.auto_parallelize(grid, embedding=True):
            net = TiedNet()
        try:
            engine.wrap(net, grid=grid)
        except ValueError as exc:
            return str(exc)
        return ""

    for msg in launch(body, 4, timeout_s=60):
        assert msg.startswith("head.weight is tied to a vocabulary-parallel embedding")
