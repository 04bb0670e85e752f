"""ZeRO-2 (gradients and optimizer state sharded over G_data) and ZeRO-3 (parameters too) composed
with tensor parallelism: the same training as one process at 1e-5, and the data group carries
exactly the calls and bytes perfmodels.traffic predicts for zero_stage=2 and 3 (gridtune stack:
ZeRO-2 reduce-scatters once per step; ZeRO-3 gathers each unit before its forward and backward and
reduce-scatters its gradient per micro-batch, and under a pipeline (data2 x inter2) gathers each
unit once per step and reduce-scatters its gradient once after the schedule).

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_zero23.py -q
"""

from __future__ import annotations

import pytest

from tests.engine.harness import assert_trains_as_one_process, grid_id, predicted_traffic, run_grid

GRIDS4 = [
    {"data": 4, "inter": 1, "depth": 1, "row": 1, "col": 1},
    {"data": 2, "inter": 1, "depth": 1, "row": 2, "col": 1},
    {"data": 2, "inter": 1, "depth": 1, "row": 1, "col": 2},
    {"data": 2, "inter": 1, "depth": 2, "row": 1, "col": 1},
    {"data": 2, "inter": 2, "depth": 1, "row": 1, "col": 1},
]
# ZeRO-3 on data2 x inter2 (and x depth2, 8 ranks: per-unit depth all-reduce, prefetched depth
# gathers across the stage's gathered blocks): gathered once per step
PIPED_DEPTH8 = {"data": 2, "inter": 2, "depth": 2, "row": 1, "col": 1}
CASES = [(g, 2) for g in GRIDS4] + [(g, 3) for g in GRIDS4] + [(PIPED_DEPTH8, 3)]


def _options(degrees: dict[str, int], stage: int) -> dict:
    if degrees["inter"] > 1:
        return {"zero_stage": stage, "schedule": "1f1b", "micro_batch_size": 1}
    return {"zero_stage": stage, "micro_batch_size": 1, "offload": degrees["row"] == 2}


@pytest.mark.parametrize(("degrees", "stage"), CASES, ids=[f"z{s}-{grid_id(d)}" for d, s in CASES])
def test_zero23_matches_single_process_and_traffic(degrees, stage):
    options = _options(degrees, stage)
    results = run_grid(degrees, options)
    assert_trains_as_one_process(results, degrees)
    for r in results:
        want_bytes, want_calls = predicted_traffic(degrees, options, r["coords"]["inter"])
        assert {k: float(v) for k, v in r["bytes"].items()} == want_bytes, r["table"]
        assert {k: float(v) for k, v in r["calls"].items()} == want_calls, r["table"]


def test_zero3_peak_model_states_at_most_035_of_zero0_on_4_data_ranks():
    """engine.Zero3's peak model-state bytes (shards + gradients + AdamW state + gathered units)
    against ZeRO-0's parameters + gradients + AdamW state, per rank (bench/engine_zero_memory.py)."""
    import importlib.util
    from pathlib import Path

    from engine.launch import launch
    from engine.models.gpt import GPTConfig

    path = Path(__file__).resolve().parents[2] / "bench" / "engine_zero_memory.py"
    spec = importlib.util.spec_from_file_location("engine_zero_memory", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cfg = GPTConfig(num_layers=8, hidden_size=64, num_attention_heads=4, seq_length=16, vocab_size=128)
    zero0 = launch(bench.measure, 4, args=(cfg, 0, False), timeout_s=120)
    zero3 = launch(bench.measure, 4, args=(cfg, 3, False), timeout_s=120)
    for r0, r3 in zip(zero0, zero3):
        assert r3["state"] <= 0.35 * r0["state"], (r3["state"], r0["state"])


@pytest.mark.parametrize("shard", [2, 1], ids=["hybrid2x2", "replicated"])
def test_zero3_hybrid_shard_matches_single_process(shard):
    """HybridShard (FSDP's and AxonML's name): ZeRO-3 within groups of `shard` data ranks,
    replicated across them (4 data ranks), trains exactly as one process."""
    degrees = {"data": 4, "inter": 1, "depth": 1, "row": 1, "col": 1}
    results = run_grid(degrees, {"zero_stage": 3, "hybrid_shard": shard, "micro_batch_size": 2})
    assert_trains_as_one_process(results, degrees)
    for r in results:  # the units are gathered over the shard group (not a grid axis: "other")
        ops = {(axis, op) for axis, op, *_ in r["table"]}
        assert ("other", "all_gather") in ops and ("data", "all_gather") not in ops, r["table"]
