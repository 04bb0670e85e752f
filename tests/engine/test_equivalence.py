"""The engine trains exactly as one process would.

For every factorization of 1, 2, 4 and 8 ranks over the five axes (data, inter, depth, row, col),
3 AdamW steps of the tiny GPT in fp32 (pipeline grids use GPipe, 1F1B or interleaved 1F1B, and the
others gradient accumulation over two micro-batches where the local batch allows) give the same
losses (1e-5 relative) and parameters (1e-5 absolute, via engine.full_state_dict) as
single-process training on the global batch.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/engine/test_equivalence.py -q
"""

from __future__ import annotations

import pytest

from tests.engine.harness import (
    AXES5,
    factorizations,
    global_losses,
    grid_id,
    options_for,
    reference,
    run_grid,
)

GRIDS = [d for w in (1, 2, 4, 8) for d in factorizations(w, AXES5)]


@pytest.mark.parametrize("degrees", GRIDS, ids=[grid_id(d) for d in GRIDS])
def test_gpt_matches_single_process(degrees):
    options = options_for(degrees)
    results = run_grid(degrees, options)
    ref_losses, ref_state, ref_norm = reference(options.get("num_layers", 2))
    losses = global_losses(results, degrees)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    for r in results:  # engine.grad_norm: the full gradient's norm on every rank
        assert r["grad_norm"] == pytest.approx(ref_norm, rel=1e-5)
    state = results[0]["state"]
    assert set(state) == set(ref_state)
    for name, ref in ref_state.items():
        assert state[name].shape == ref.shape, name
        diff = (state[name] - ref).abs().max().item()
        assert diff <= 1e-5, f"{name}: max |param - reference| = {diff}"
