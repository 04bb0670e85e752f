"""Depth prefetch (AxoNN's optimize_communication; engine.prefetch_depth, on through engine.wrap):
each depth-sharded layer launches the next layer's weight all-gather (async_op=True) when its own
forward starts, and the previous layer's when its backward starts, and waits for it on use.

Checked here: the tiny GPT with prefetch equals single-process training at 1e-5 on depth2 x row2,
depth2 x col2 and depth4, every chained layer but the first (forward) / last (backward) used a
prefetched gather on every micro-batch, and the recorder's calls and bytes still equal
perfmodels.traffic (a prefetched gather replaces the layer's own); an op log proves the next
layer's gather is issued before the current layer's matmul (and not without prefetch), and that
a layer's weight-gradient reduce-scatter is in flight during its input-gradient GEMM.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_depth_prefetch.py -q
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from engine.launch import launch
from tests.engine.harness import (
    GLOBAL_BATCH,
    STEPS,
    assert_trains_as_one_process,
    global_losses,
    grid_id,
    options_for,
    predicted_traffic,
    reference,
    run_grid,
)

GRIDS = [
    {"data": 1, "inter": 1, "depth": 2, "row": 2, "col": 1},
    {"data": 1, "inter": 1, "depth": 2, "row": 1, "col": 2},
    {"data": 1, "inter": 1, "depth": 4, "row": 1, "col": 1},
]


@pytest.mark.parametrize("degrees", GRIDS, ids=[grid_id(d) for d in GRIDS])
def test_prefetched_depth_gathers_train_as_one_process_with_unchanged_traffic(degrees):
    options = {**options_for(degrees), "prefetch_depth": True}
    results = run_grid(degrees, options)
    assert_trains_as_one_process(results, degrees)
    local = GLOBAL_BATCH // (degrees["data"] * degrees["depth"])
    m = local // (options.get("micro_batch_size") or local)
    for r in results:
        assert r["chained"] == 9  # 4 Linears per block x 2 blocks + the LM head
        # forward: every layer but the first; backward: every layer but the last; each micro-batch
        assert r["prefetch_hits"] == 2 * (r["chained"] - 1) * m * STEPS
        want_bytes, want_calls = predicted_traffic(degrees, options, r["coords"]["inter"])
        assert {k: float(v) for k, v in r["bytes"].items()} == want_bytes, r["table"]
        assert {k: float(v) for k, v in r["calls"].items()} == want_calls, r["table"]


def test_without_prefetch_nothing_is_prefetched_and_values_agree():
    degrees = GRIDS[0]
    options = {**options_for(degrees), "prefetch_depth": False}
    results = run_grid(degrees, options)
    assert global_losses(results, degrees) == pytest.approx(reference(2)[0], rel=1e-5)
    assert all(r["chained"] == 0 and r["prefetch_hits"] == 0 for r in results)


SIZES = [(8, 16), (16, 32), (32, 8)]  # distinct weight blocks, so each gather names its layer


def _order(rank: int, world: int, prefetch: bool) -> dict[str, Any]:
    """Log, in issue order, the depth all-gathers (by gathered bytes) and the matmuls of one
    forward and one backward of three auto-parallelized Linears on depth2 x row2."""
    import engine
    from engine.recorder import CommRecorder, _group_name

    class OpLog(CommRecorder):
        def __init__(self, grid: Any) -> None:
            super().__init__(grid)
            self.log: list[tuple[str, int]] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                               kwargs: dict | None = None) -> Any:
            rule = self.rules.get(func)
            if rule is not None and rule[0] in ("all_gather", "reduce_scatter"):
                group, nbytes = rule[1](args)
                if self.grid.axis_of_group(_group_name(group)) == "depth":
                    self.log.append(("gather" if rule[0] == "all_gather" else "rs", nbytes))
            elif func.__name__.split(".")[0] in ("mm", "addmm", "bmm"):
                self.log.append(("mm", 0))
            return super().__torch_dispatch__(func, types, args, kwargs)

    grid = engine.init(G_intra_d=2, G_intra_r=2)
    torch.manual_seed(0)
    with engine.auto_parallelize(grid):
        net = torch.nn.Sequential(*(torch.nn.Linear(k, n) for k, n in SIZES))
    net = engine.wrap(net, grid=grid, prefetch_depth=prefetch)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    fwd, bwd = OpLog(grid), OpLog(grid)
    with fwd:
        out = net(x).square().sum()
    with bwd:
        out.backward()
    return {"fwd": fwd.log, "bwd": bwd.log,
            "hits": [m.depth_prefetch_hits for m in net.modules() if isinstance(m, engine.Linear)]}


def _first(log: list[tuple[str, int]], entry: tuple[str, int], after: int = -1) -> int:
    return next(i for i, e in enumerate(log) if e == entry and i > after)


def test_next_layers_gather_is_issued_before_the_current_matmul():
    blocks = [n * k // 2 * 4 for k, n in SIZES]  # gathered bytes per layer: block of row2, fp32
    for r in launch(_order, 4, args=(True,), timeout_s=60):
        f = r["fwd"]
        first_mm = _first(f, ("mm", 0))
        assert _first(f, ("gather", blocks[1])) < first_mm  # layer 1's gather before layer 0's matmul
        assert _first(f, ("gather", blocks[2])) < _first(f, ("mm", 0), first_mm)  # 2's before 1's
        gathers = [e for e in f if e[0] == "gather"]
        assert gathers == [("gather", b) for b in (blocks[1], blocks[0], blocks[2])]
        b = r["bwd"]  # backward runs 2, 1, 0: layer 1's gather goes out before layer 2's matmuls
        assert _first(b, ("gather", blocks[1])) < _first(b, ("mm", 0))
        # layer 2: weight-grad GEMM, its reduce-scatter launched, then the input-grad GEMM behind it
        first_mm = _first(b, ("mm", 0))
        assert b[first_mm + 1:first_mm + 3] == [("rs", blocks[2]), ("mm", 0)]
        assert r["hits"] == [1, 2, 1]  # 0: backward; 1: both; 2: forward
    for r in launch(_order, 4, args=(False,), timeout_s=60):
        f = r["fwd"]
        assert _first(f, ("gather", blocks[1])) > _first(f, ("mm", 0))  # synchronous: one layer at a time
        assert r["hits"] == [0, 0, 0]


def test_prefetch_depth_rejects_a_non_bool():
    import engine

    with pytest.raises(ValueError, match="enabled must be True or False, got 'yes'"):
        engine.prefetch_depth(torch.nn.Linear(2, 2), "yes")


