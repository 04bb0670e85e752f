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
