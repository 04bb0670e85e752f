"""Context parallelism (engine.context): the GPT with its sequence split over G_cp ranks (ring
attention, load-balanced chunks) trains exactly as one process (loss and final parameters at
1e-5), alone and with row, data and ZeRO-3, and the "cp" group carries the contract's bytes.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_context.py -q
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from engine.launch import launch
from tests.engine.harness import GLOBAL_BATCH, LR, STEPS, batches, config, isolated, make_optimizer, reference

FIELDS = {"data": "G_data", "row": "G_intra_r", "cp": "G_cp", "inter": "G_inter"}


def _train(rank: int, world: int, degrees: dict[str, int], zero3: bool) -> dict[str, Any]:
    from torch.utils.data import TensorDataset

    import engine
    from engine.models.gpt import GPT

    grid = engine.init(**{FIELDS[a]: v for a, v in degrees.items()})
    cfg = config()
    torch.manual_seed(0)
    model = engine.ParallelGPT.from_serial(GPT(cfg), grid)
    opt = engine.Zero3(model, torch.optim.AdamW, lr=LR, eps=1e-5, weight_decay=0.01) if zero3 else \
        make_optimizer(model.parameters())
    loader = engine.create_dataloader(TensorDataset(*batches(cfg)), GLOBAL_BATCH)
    local = GLOBAL_BATCH // grid.batch_shards
    pipe = None
    if grid.size("inter") > 1:
        pipe = engine.Pipeline(model, grid, schedule="1f1b", micro_batch_size=local // 2,
                               local_batch_size=local)
    rec = engine.CommRecorder(grid)
    losses = []
    for s, (tok, tgt) in enumerate(loader):
        assert tok.shape[1] == cfg.seq_length // grid.size("cp")
        opt.zero_grad()
        if s == STEPS - 1:
            rec.__enter__()
        loss = engine.forward_backward(model, tok, tgt, pipeline=pipe)
        engine.sync_gradients(model, data=not zero3)
        opt.step()
        if s == STEPS - 1:
            rec.__exit__(None, None, None)
        losses.append(loss)
    state = engine.full_state_dict(model)
    return {"coords": dict(grid.coords), "losses": losses, "state": state if grid.coord("cp") == 0 else None,
            "table": rec.table(), "local_batch": GLOBAL_BATCH // grid.batch_shards}


def _global_losses(results: list[dict[str, Any]]) -> list[float]:
    """Mean over data and cp ranks of the local mean losses (every cp rank holds as many tokens)."""
    last = max(r["coords"]["inter"] for r in results)
    first = [r for r in results if r["coords"]["row"] == 0 and r["coords"]["col"] == 0
             and r["coords"]["inter"] == last]
    return [sum(r["losses"][s] for r in first) / len(first) for s in range(STEPS)]


def cp_ring_bytes(degrees: dict[str, int], local_batch: int, num_layers: int = 2) -> int:
    """The contract's bytes on "cp" per rank per step (sends and receives both counted): per
    attention layer and micro-batch, forward G-1 hops of K and V, backward G-1 of K and V plus G of
    dK and dV, each message 2 * T_c * kvh * e with T_c = micro-batch * seq / G_cp and kvh = the
    rank's heads * head_dim = hidden / G_intra_r."""
    cfg = config(num_layers)
    G = degrees["cp"]
    T_c = local_batch * cfg.seq_length // G
    kvh = cfg.hidden_size // degrees.get("row", 1)
    message = 2 * T_c * kvh * 4
    hops = (G - 1) + (G - 1) + G
    return num_layers * hops * message * 2


CASES = [{"cp": 2}, {"cp": 4}, {"cp": 2, "row": 2}, {"cp": 2, "data": 2}]


@pytest.mark.parametrize("degrees", CASES, ids=["cp2", "cp4", "cp2xr2", "cp2xd2"])
def test_context_parallel_gpt_trains_as_one_process(degrees):
    world = 1
    for v in degrees.values():
        world *= v
    results = launch(_train, world, args=(degrees, False), timeout_s=180)
    ref_losses, ref_state, _ = reference()
    assert _global_losses(results) == pytest.approx(ref_losses, rel=1e-5)
    for name, want in ref_state.items():
        assert (results[0]["state"][name] - want).abs().max().item() <= 1e-5, name
    for r in results:  # the ring's bytes: the contract's formula, sends and receives
        cp = {op: (calls, nbytes) for axis, op, calls, nbytes in r["table"] if axis == "cp"}
        assert set(cp) == {"send", "recv"}, r["table"]
        assert cp["send"][1] + cp["recv"][1] == cp_ring_bytes(degrees, r["local_batch"]), r["table"]
        G = degrees["cp"]
        assert cp["send"][0] == cp["recv"][0] == 2 * (3 * G - 2), r["table"]  # 2 layers


def test_context_parallel_with_zero3_and_data_trains_as_one_process():
    degrees = {"cp": 2, "data": 2}
    results = launch(_train, 4, args=(degrees, True), timeout_s=180)
    ref_losses, ref_state, _ = reference()
    assert _global_losses(results) == pytest.approx(ref_losses, rel=1e-5)
    for name, want in ref_state.items():
        assert (results[0]["state"][name] - want).abs().max().item() <= 1e-5, name
    for r in results:
        # ZeRO-3 shards over data x cp (one flattened group, counted as "data"): the units are
        # gathered there, and the ring still runs on "cp"
        ops = {(axis, op) for axis, op, _, _ in r["table"]}
        assert ("data", "all_gather") in ops and ("cp", "send") in ops, r["table"]
        cp = {op: nbytes for axis, op, _, nbytes in r["table"] if axis == "cp"}
        assert cp["send"] + cp["recv"] == cp_ring_bytes(degrees, r["local_batch"]), r["table"]


def test_context_parallel_in_a_pipeline_trains_as_one_process():
    """cp2 x inter2 (1F1B, 2 micro-batches): the stages exchange this rank's tokens only."""
    degrees = {"cp": 2, "inter": 2}
    results = launch(_train, 4, args=(degrees, False), timeout_s=180)
    ref_losses, ref_state, _ = reference()
    assert _global_losses(results) == pytest.approx(ref_losses, rel=1e-5)
    state = {k: v for r in results if r["state"] is not None for k, v in r["state"].items()}
    for name, want in ref_state.items():
        assert (state[name] - want).abs().max().item() <= 1e-5, name


def _positions() -> list[list[int]]:
    from engine.context import local_positions

    return [local_positions(16, 4, r).tolist() for r in range(4)]


def test_load_balanced_chunk_order():
    """cp rank i holds chunks i and 2*G_cp-1-i of the sequence (the contract's order)."""
    assert isolated(_positions) == [[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]]
