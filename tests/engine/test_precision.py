"""Mixed precision (engine.MixedPrecision, engine.LossScaler): bf16/fp16 compute with fp32 master
weights, the data all-reduce in a chosen dtype (half the bytes in bf16), fp16 loss scaling in
engine.train, bad input rejected before any collective.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_precision.py -q
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from engine.launch import launch
from tests.engine.harness import batches, config


def _reduce_body(rank: int, world: int) -> dict[str, Any]:
    import engine
    from engine.models.gpt import GPT

    grid = engine.init(G_data=2, G_intra_r=2)
    cfg = config(2)
    tokens, targets = batches(cfg, 1)
    d = grid.coord("data")
    x, y = tokens[d * 4:(d + 1) * 4], targets[d * 4:(d + 1) * 4]
    out: dict[str, Any] = {}
    grads = {}
    for reduce_dtype in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = engine.ParallelGPT.from_serial(GPT(cfg), grid)
        policy = engine.MixedPrecision(compute_dtype="bf16", reduce_dtype=reduce_dtype)
        policy.apply(model)
        rec = engine.CommRecorder(grid)
        with rec, policy.autocast(grid.device):
            engine.forward_backward(model, x, y, micro_batch_size=2)
            engine.sync_gradients(model)
        out[reduce_dtype] = rec.bytes_per_group()["data"]
        grads[reduce_dtype] = [p.grad.clone() for p in model.parameters()]
        out[reduce_dtype + "_dtypes"] = {str(p.dtype) for p in model.parameters()} | \
            {str(p.grad.dtype) for p in model.parameters()}
    out["rel"] = max(((a - b).norm() / a.norm().clamp_min(1e-12)).item()
                     for a, b in zip(grads["fp32"], grads["bf16"]))
    return out


def test_reduce_dtype_halves_data_bytes_and_keeps_fp32_master_weights():
    for r in launch(_reduce_body, 4, timeout_s=120):
        assert r["bf16"] * 2 == r["fp32"] > 0
        assert r["fp32_dtypes"] == r["bf16_dtypes"] == {"torch.float32"}
        assert r["rel"] < 1e-2  # one bf16 rounding of each summed gradient


def _train(rank: int, world: int, dtype: str, reduce_dtype: str) -> Any:
    from engine.train import stdlib_text_dataset, train
    from perfmodels.specs import Plan

    cfg = config()
    cfg = type(cfg)(num_layers=2, hidden_size=32, num_attention_heads=8, seq_length=8, vocab_size=256)
    return train(cfg, stdlib_text_dataset(cfg.seq_length, 50_000), 8, 4,
                 plan=Plan(G_data=2, micro_batch_size=2), warmup_steps=1, progress=False, record=False,
                 use_calibrated=False, dtype=dtype, reduce_dtype=reduce_dtype)


def test_train_fp16_with_loss_scaling_and_bf16_reduction_tracks_fp32():
    base = launch(_train, 2, args=("fp32", "fp32"), timeout_s=120)[0]
    for dtype, reduce_dtype in (("fp16", "fp32"), ("bf16", "bf16")):
        run = launch(_train, 2, args=(dtype, reduce_dtype), timeout_s=120)[0]
        assert run.dtype == dtype
        assert run.losses == pytest.approx(base.losses, rel=2e-2), (dtype, reduce_dtype)


def test_bad_precision_arguments_raise_before_any_collective():
    from engine.train import train

    with pytest.raises(ValueError, match="dtype must be"):
        train(config(), [], 8, 4, dtype="fp8")
    with pytest.raises(ValueError, match="reduce_dtype must be one of"):
        train(config(), [], 8, 4, reduce_dtype="int8")
    with pytest.raises(ValueError, match="compute_dtype must be one of"):
        __import__("engine").MixedPrecision(compute_dtype="half")
