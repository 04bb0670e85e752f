"""Gradient reduction overlapped with backward (engine.grads._OverlappedReducer): buckets launch
from post-accumulate-grad hooks during backward, the result equals the synchronous reduction,
`no_sync` still accumulates without communicating, and the data group carries the same bytes.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_overlap.py -q
"""

from __future__ import annotations

from typing import Any

import torch

from engine.launch import launch
from tests.engine.harness import batches, config


def _body(rank: int, world: int) -> dict[str, Any]:
    import engine
    from engine.grads import _OVERLAP_ATTR, install_overlap
    from engine.models.gpt import GPT

    grid = engine.init(G_data=2, G_intra_r=2)
    cfg = config(2)
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(engine.ParallelGPT.from_serial(GPT(cfg), grid))
    overlapped, plain = models
    install_overlap(overlapped, grid, bucket_bytes=8 * 1024)  # several buckets
    engine.overlap_grad_reduce(plain, False)
    reducer = getattr(overlapped, _OVERLAP_ATTR)
    tokens, targets = batches(cfg, 1)
    local = tokens[grid.coord("data") * 4:(grid.coord("data") + 1) * 4]
    local_t = targets[grid.coord("data") * 4:(grid.coord("data") + 1) * 4]
    out: dict[str, Any] = {"buckets": len(reducer.buckets)}
    recs = {}
    for name, model in (("overlapped", overlapped), ("plain", plain)):
        rec = engine.CommRecorder(grid)
        with rec:
            with engine.no_sync(model):  # accumulation: nothing launches
                model(local[:2], local_t[:2]).div(2).backward()
            if model is overlapped:
                out["launched_in_no_sync"] = len(reducer.works)
            model(local[2:], local_t[2:]).div(2).backward()
            if model is overlapped:
                out["launched_in_backward"] = reducer.next
            engine.sync_gradients(model)
        recs[name] = (rec.bytes_per_group(), rec.calls_per_group())
    out["max_diff"] = max((a.grad - b.grad).abs().max().item()
                          for a, b in zip(overlapped.parameters(), plain.parameters()))
    out["bytes"] = {k: v["data"] for k, v in ((n, r[0]) for n, r in recs.items())}
    out["calls"] = {k: v["data"] for k, v in ((n, r[1]) for n, r in recs.items())}
    return out


def test_overlapped_reduction_launches_in_backward_and_equals_synchronous():
    for r in launch(_body, 4, timeout_s=120):
        assert r["buckets"] > 1
        assert r["launched_in_no_sync"] == 0
        assert r["launched_in_backward"] == r["buckets"]  # every bucket launched before sync_gradients
        assert r["max_diff"] <= 1e-6
        assert r["bytes"]["overlapped"] == r["bytes"]["plain"] > 0
        assert r["calls"]["overlapped"] == r["buckets"]


def _pipe_body(rank: int, world: int) -> dict[str, Any]:
    import engine
    from engine.grads import _OVERLAP_ATTR, install_overlap
    from engine.models.gpt import GPT

    grid = engine.init(G_data=2, G_inter=2)
    cfg = config(2)
    torch.manual_seed(0)
    model = engine.ParallelGPT.from_serial(GPT(cfg), grid)
    install_overlap(model, grid, bucket_bytes=8 * 1024)
    reducer = getattr(model, _OVERLAP_ATTR)
    pipe = engine.Pipeline(model, grid, schedule="1f1b", micro_batch_size=1, local_batch_size=4)
    tokens, targets = batches(cfg, 1)
    d = grid.coord("data")
    engine.forward_backward(model, tokens[d * 4:(d + 1) * 4], targets[d * 4:(d + 1) * 4], pipeline=pipe)
    launched = reducer.next
    engine.sync_gradients(model)
    return {"buckets": len(reducer.buckets), "launched": launched}


def test_pipeline_launches_each_bucket_after_its_last_microbatch():
    for r in launch(_pipe_body, 4, timeout_s=120):
        assert r["buckets"] > 1 and r["launched"] == r["buckets"]
