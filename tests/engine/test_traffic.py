"""The engine sends what the performance model says: for every grid of 8 ranks (all 35
factorizations over data, inter, depth, row, col), the communication recorder's calls and bytes
per group in the last (steady-state) step equal perfmodels.traffic's prediction for the same plan
and each rank's pipeline stage, on every rank.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_traffic.py -q
"""

from __future__ import annotations

import pytest

from tests.engine.harness import AXES5, factorizations, grid_id, options_for, predicted_traffic, run_grid

GRIDS8 = factorizations(8, AXES5)


@pytest.mark.parametrize("degrees", GRIDS8, ids=[grid_id(d) for d in GRIDS8])
def test_bytes_and_calls_per_group_match_perfmodels(degrees):
    options = options_for(degrees)
    results = run_grid(degrees, options)
    for r in results:
        want_bytes, want_calls = predicted_traffic(degrees, options, r["coords"]["inter"])
        got_bytes = {k: float(v) for k, v in r["bytes"].items()}
        got_calls = {k: float(v) for k, v in r["calls"].items()}
        assert got_bytes == want_bytes, (r["coords"], r["table"])
        assert got_calls == want_calls, (r["coords"], r["table"])
