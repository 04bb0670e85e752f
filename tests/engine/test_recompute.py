"""Full activation recomputation (plan.recompute="full"): every block is checkpointed, training is
unchanged, and backward repeats exactly the blocks' forward collectives that perfmodels.traffic
counts as "recompute" events.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_recompute.py -q
"""

from __future__ import annotations

import pytest

from tests.engine.harness import assert_trains_as_one_process, grid_id, predicted_traffic, run_grid

CASES = [
    ({"data": 1, "inter": 1, "depth": 2, "row": 2, "col": 2}, {"micro_batch_size": 2}),
    ({"data": 1, "inter": 2, "depth": 1, "row": 2, "col": 2}, {"schedule": "1f1b", "micro_batch_size": 2}),
]


@pytest.mark.parametrize(("degrees", "options"), CASES, ids=[grid_id(d) for d, _ in CASES])
def test_full_recompute_matches_single_process_and_traffic(degrees, options):
    options = {**options, "recompute": "full"}
    results = run_grid(degrees, options)
    assert_trains_as_one_process(results, degrees, options.get("num_layers", 2))
    for r in results:
        want_bytes, want_calls = predicted_traffic(degrees, options, r["coords"]["inter"])
        assert {k: float(v) for k, v in r["bytes"].items()} == want_bytes, r["table"]
        assert {k: float(v) for k, v in r["calls"].items()} == want_calls, r["table"]
    without, _ = predicted_traffic(degrees, {**options, "recompute": "none"}, 0)
    assert sum(want_bytes.values()) > sum(without.values())


def _recomputed_ops(use_reentrant: bool, early_stop: bool = True) -> list[str]:
    """The GEMM and activation ops torch runs in the backward of one checkpointed
    LayerNorm-Linear-GELU-Linear block (+ residual) under bf16 autocast, in order."""
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import checkpoint

    class Log(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm, self.fc1, self.fc2 = nn.LayerNorm(8), nn.Linear(8, 32), nn.Linear(32, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.fc2(F.gelu(self.fc1(self.norm(x))))

    torch.manual_seed(0)
    block, x = Block(), torch.randn(4, 8, requires_grad=True)
    kwargs = {} if use_reentrant else {"early_stop": early_stop}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = checkpoint(block, x, use_reentrant=use_reentrant, **kwargs)
    with Log() as log:
        y.float().sum().backward()
    return [op for op in log.ops if op in ("addmm", "mm", "gelu")]


def test_non_reentrant_recomputation_stops_before_the_last_gemm():
    """What `Stack.full_recompute_repeats_layer` and `perfmodels.compute.early_stop_skipped_s` rest
    on, on the installed torch: non-reentrant checkpointing with its default early stop recomputes
    fc1 and the GELU but not fc2 (an ATen linear saves its inputs before it multiplies, and
    recomputation stops at the block's last saved tensor), so neither fc2's GEMM nor anything after
    it (the engine's row all-reduce of fc2's output:
    test_full_recompute_matches_single_process_and_traffic) runs again.
    Reentrant checkpointing, and non-reentrant with early_stop=False, rerun fc2 too. Backward itself
    runs 4 GEMMs (input and weight gradients of fc1 and fc2)."""
    assert _recomputed_ops(use_reentrant=False) == ["addmm", "gelu"] + ["mm"] * 4
    assert _recomputed_ops(use_reentrant=False, early_stop=False) == ["addmm", "gelu", "addmm"] + ["mm"] * 4
    assert _recomputed_ops(use_reentrant=True) == ["addmm", "gelu", "addmm"] + ["mm"] * 4
