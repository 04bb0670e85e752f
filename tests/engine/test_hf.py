"""Hugging Face transformers: a tiny Llama and GPT-2 built from their configs, split with
engine.parallelize, train exactly as in one process (1e-5); the consolidated checkpoint loads back
into transformers; engine.train(model, dataset, auto=True) trains a built Llama.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_hf.py -q
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from engine.launch import launch
from tests.engine.harness import isolated

transformers = pytest.importorskip("transformers",
                                   reason="transformers is not installed (pip install gridtune[hf])")

GLOBAL, STEPS, SEQ, VOCAB = 8, 3, 8, 64


def _llama() -> Any:
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=SEQ, tie_word_embeddings=False)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg)


def _gpt2() -> Any:
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=4,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg)


BUILD = {"llama": _llama, "gpt2": _gpt2}


def _splittable(model: torch.nn.Module) -> int:
    """nn.Linears not tied to another module (GPT-2's head shares the embedding) plus Conv1Ds."""
    from transformers.pytorch_utils import Conv1D

    tied = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    return sum(1 for m in model.modules()
               if isinstance(m, Conv1D) or (type(m) is torch.nn.Linear and id(m.weight) not in tied))


def _tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (STEPS * GLOBAL, SEQ + 1), generator=torch.Generator().manual_seed(4))


def _run(rank: int, world: int, degrees: dict[str, int] | None, path: str | None,
         kind: str = "llama", zero3: bool = False) -> dict[str, Any]:
    torch.set_num_threads(1)
    import engine

    grid = engine.init(**(degrees or {}))
    if kind.endswith("-auto"):  # the guide's flow: built under auto_parallelize (HF ties the head)
        from transformers.models.gpt2 import modeling_gpt2  # noqa: F401 - imported outside the context

        with engine.auto_parallelize(grid):
            model = BUILD[kind.removesuffix("-auto")]()
        model = engine.wrap(model, grid=grid)
        n_linear = 0
    else:
        model = BUILD[kind]()
        n_linear = _splittable(model)
    if degrees is not None and not kind.endswith("-auto"):
        model = engine.wrap(engine.parallelize(model, grid), grid=grid)
    split = sum(1 for m in model.modules() if isinstance(m, engine.Linear))
    opt = engine.Zero3(model, torch.optim.AdamW, lr=1e-2) if zero3 else \
        torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = _tokens()
    local = GLOBAL // grid.batch_shards
    replica = grid.coord("data") * grid.size("depth") + grid.coord("depth")
    losses = []
    for s in range(STEPS):
        batch = data[s * GLOBAL + replica * local:s * GLOBAL + (replica + 1) * local]
        opt.zero_grad()
        logits = model(batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        loss.backward()
        engine.step(model, opt)
        losses.append(float(loss))
    if path is not None:
        engine.save_consolidated(path, model)
    probe = data[:2, :-1]
    with torch.no_grad():
        out = model(probe).logits
    return {"losses": losses, "replica": replica, "logits": out, "n_linear": n_linear, "split": split}


@pytest.mark.parametrize("degrees", [{"G_intra_r": 2, "G_data": 2}, {"G_intra_r": 2, "G_intra_c": 2}],
                         ids=["r2xd2", "r2xc2"])
def test_llama_multi_rank_equals_single_process_and_checkpoint_loads_into_transformers(degrees, tmp_path):
    ref = isolated(_run, 0, 1, None, None)
    path = str(tmp_path / "llama.pt")
    results = launch(_run, 4, args=(degrees, path), timeout_s=180)
    by_replica = {r["replica"]: r["losses"] for r in results}
    mean = [sum(ls[s] for ls in by_replica.values()) / len(by_replica) for s in range(STEPS)]
    assert mean == pytest.approx(ref["losses"], rel=1e-5)
    assert all(r["split"] == r["n_linear"] for r in results)  # every Linear of the model was split
    for r in results:
        assert (r["logits"] - ref["logits"]).abs().max().item() <= 1e-4
    fresh = _llama()
    fresh.load_state_dict(torch.load(path), strict=True)
    with torch.no_grad():
        again = fresh(_tokens()[:2, :-1]).logits
    assert (again - ref["logits"]).abs().max().item() <= 1e-4


class _Windows(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.data = _tokens().repeat(4, 1)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[i, :-1], self.data[i, 1:]


def _auto(rank: int, world: int) -> Any:
    from engine.train import train

    return train(_llama(), _Windows(), 8, 6, auto=True, micro_batch_size=2, warmup_steps=1, progress=False,
                 record=False, use_calibrated=False, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))


def test_engine_train_auto_trains_a_built_llama():
    report = launch(_auto, 2, timeout_s=180)[0]
    assert report.losses[-1] < report.losses[0]


@pytest.mark.parametrize("degrees", [{"G_intra_r": 2, "G_intra_c": 2}, {"G_intra_r": 2, "G_data": 2},
                                     {"G_intra_d": 2, "G_intra_r": 2}, {"G_intra_d": 2, "G_intra_c": 2}],
                         ids=["r2xc2", "r2xd2", "depth2xr2", "depth2xc2"])
def test_gpt2_conv1d_split_equals_single_process_and_loads_into_transformers(degrees, tmp_path):
    """Every Conv1D (c_attn with q, k, v fused, c_proj, c_fc, mlp.c_proj) becomes an engine.Linear;
    training equals one process at 1e-5 and the consolidated file has Conv1D's [in, out] shapes."""
    ref = isolated(_run, 0, 1, None, None, "gpt2")
    assert ref["n_linear"] == 8  # 4 Conv1Ds per block; the head is tied to the embedding
    path = str(tmp_path / "gpt2.pt")
    results = launch(_run, 4, args=(degrees, path, "gpt2"), timeout_s=180)
    by_replica = {r["replica"]: r["losses"] for r in results}
    mean = [sum(ls[s] for ls in by_replica.values()) / len(by_replica) for s in range(STEPS)]
    assert mean == pytest.approx(ref["losses"], rel=1e-5)
    assert ref["losses"][-1] < ref["losses"][0]  # it trains
    assert all(r["split"] == 8 for r in results)
    for r in results:
        assert (r["logits"] - ref["logits"]).abs().max().item() <= 1e-4
    state = torch.load(path)
    assert tuple(state["transformer.h.0.attn.c_attn.weight"].shape) == (32, 96)  # Conv1D: [in, out]
    assert tuple(state["transformer.h.1.mlp.c_proj.weight"].shape) == (128, 32)
    fresh = _gpt2()
    fresh.load_state_dict(state, strict=True)
    with torch.no_grad():
        again = fresh(_tokens()[:2, :-1]).logits
    assert (again - ref["logits"]).abs().max().item() <= 1e-4


@pytest.mark.parametrize("degrees", [{"G_data": 2}, {"G_data": 2, "G_intra_r": 2}], ids=["d2", "d2xr2"])
def test_gpt2_tied_head_under_zero3_equals_single_process(degrees):
    """Issue 23 (4): ZeRO-3 failed at GPT-2's first forward (`size mismatch ... vec (0)`): the head
    shares the embedding's weight, which lives in the embedding's unit; the head's forward must
    gather that unit too. The tied weight's gradient sums both uses, as in one process."""
    ref = isolated(_run, 0, 1, None, None, "gpt2")
    world = 1
    for v in degrees.values():
        world *= v
    results = launch(_run, world, args=(degrees, None, "gpt2", True), timeout_s=180)
    by_replica = {r["replica"]: r["losses"] for r in results}
    mean = [sum(ls[s] for ls in by_replica.values()) / len(by_replica) for s in range(STEPS)]
    assert mean == pytest.approx(ref["losses"], rel=1e-5)
    for r in results:
        assert (r["logits"] - ref["logits"]).abs().max().item() <= 1e-4


@pytest.mark.parametrize("degrees", [{"G_intra_r": 2}, {"G_intra_c": 2}, {"G_intra_d": 2}],
                         ids=["r2", "c2", "depth2"])
def test_gpt2_built_under_auto_parallelize_ties_its_head(degrees):
    """Issue 23 (4): building GPT-2 inside auto_parallelize() failed (transformers' isinstance(m,
    nn.Linear) on the patched name) and its tied head gave a shape error on row, col and depth
    grids. The tied head runs as a replicated Linear over the embedding's weight."""
    ref = isolated(_run, 0, 1, None, None, "gpt2")
    results = launch(_run, 2, args=(degrees, None, "gpt2-auto"), timeout_s=180)
    by_replica = {r["replica"]: r["losses"] for r in results}
    mean = [sum(ls[s] for ls in by_replica.values()) / len(by_replica) for s in range(STEPS)]
    assert mean == pytest.approx(ref["losses"], rel=1e-5)
    for r in results:
        assert (r["logits"] - ref["logits"]).abs().max().item() <= 1e-4
