"""ZeRO-1 (optimizer state sharded over G_data): same training as one process, and the data group
carries exactly one reduce-scatter of gradients and one all-gather of parameters (zero-padded to a
multiple of G_data), as perfmodels.traffic predicts for zero_stage=1.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_zero.py -q
"""

from __future__ import annotations

import pytest

from tests.engine.harness import assert_trains_as_one_process, grid_id, predicted_traffic, run_grid

CASES = [
    ({"data": 2, "inter": 1, "depth": 1, "row": 2, "col": 2}, {"micro_batch_size": 2}),
    ({"data": 4, "inter": 1, "depth": 2, "row": 1, "col": 1}, {}),
    ({"data": 2, "inter": 2, "depth": 1, "row": 1, "col": 2}, {"schedule": "1f1b", "micro_batch_size": 1}),
]


@pytest.mark.parametrize(("degrees", "options"), CASES, ids=[grid_id(d) for d, _ in CASES])
def test_zero1_matches_single_process_and_traffic(degrees, options):
    options = {**options, "zero_stage": 1}
    results = run_grid(degrees, options)
    assert_trains_as_one_process(results, degrees, options.get("num_layers", 2))
    for r in results:
        want_bytes, want_calls = predicted_traffic(degrees, options, r["coords"]["inter"])
        assert {k: float(v) for k, v in r["bytes"].items()} == want_bytes, r["table"]
        assert {k: float(v) for k, v in r["calls"].items()} == want_calls, r["table"]
        assert r["calls"]["data"] == 2
