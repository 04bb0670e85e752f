"""The published mixture-of-experts rows of validation/data against the model: the figure of issue 22
(bench/moe_cp_figures.py), pinned so that a change of the MoE physics that loses it fails here."""

from __future__ import annotations

import numpy as np

from validation import loader
from validation.scoring import score_case


def _moe_errors() -> dict[str, list[float]]:
    cases = loader.load_file(loader.DATA_DIR / "published_megatron_bridge_moe.csv").cases
    out: dict[str, list[float]] = {}
    for case in cases:
        score = score_case(case)
        out.setdefault(case.model.name, []).append(score.median_time_s / case.measured_time_s - 1.0)
    return out


def test_moe_rows_within_the_issue_22_target():
    """Iteration-time MAPE of the 7 Megatron-Bridge DGX-H100 MoE rows at most 12% (22.1% before the
    host issue cost of fine-grained experts, `perfmodels.experts.host_ops`); the large-expert models
    (DeepSeek-V3, Qwen3-235B-A22B: 4 local experts, GPU-bound) within 10%, and the two Qwen3-30B-A3B
    runs (8 and 16 local experts in FP8: host-bound) within 5%."""
    errors = _moe_errors()
    flat = [e for values in errors.values() for e in values]
    assert len(flat) == 7
    assert float(np.mean(np.abs(flat))) <= 0.12
    for name in ("DeepSeek-V3", "Qwen3-235B-A22B"):
        assert max(abs(e) for e in errors[name]) <= 0.10, (name, errors[name])
    assert max(abs(e) for e in errors["Qwen3-30B-A3B"]) <= 0.05, errors["Qwen3-30B-A3B"]
