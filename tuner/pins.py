"""Why pinned values leave nothing to rank: each pinned value searched alone, and the rules that
rejected every layout holding it.

A search whose pins empty the space used to say only "495 excluded by the search pins". A user who
pinned `G_intra_r=3` on 256 GPUs needs to hear "3 does not divide 256"; one who pinned `G_intra_r=128`
for a 64-head model needs the head-count rule. `diagnose_pins` runs, for every pinned value, the same
search with only that value pinned (a short time budget each) and reports the rules that rejected its
layouts, largest count first; a value that is fine alone is reported as rejected only in combination
with the other pins.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tuner.types import SearchOptions

NOT_PINS = ("max_micro_batch_size", "time_budget_s", "examples_per_reason", "exhaustive")
PIN_REASON = "excluded by the search pins"
DIAGNOSE_BUDGET_S = 5.0
"""Time budget of each one-value search (a diagnosis must not cost more than the search it explains)."""


def pinned_fields(options: SearchOptions) -> dict[str, tuple[Any, ...]]:
    """The pinned plan fields and their allowed values."""
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)
            if f.name not in NOT_PINS and getattr(options, f.name) is not None}


def _value_text(field: str, value: Any) -> str:
    return "/".join(value) if field == "placement" else str(value)


def diagnose_pins(search: Callable[[SearchOptions], Any], options: SearchOptions, num_gpus: int) -> str:
    """One clause per pinned value: which rules rejected every layout with it. `search(options)` runs
    a search (top_k=1, no diagnosis of its own) and returns its Recommendation."""
    pins = pinned_fields(options)
    values = sum(len(v) for v in pins.values())
    budget = min(options.time_budget_s, DIAGNOSE_BUDGET_S) / max(values, 1)
    clauses = []
    for field, allowed in pins.items():
        for value in allowed:
            alone = dataclasses.replace(
                SearchOptions(), **{field: (value,)}, max_micro_batch_size=options.max_micro_batch_size,
                time_budget_s=max(budget, 0.2), examples_per_reason=1, exhaustive=options.exhaustive,
            )
            rec = search(alone)
            label = f"{field}={_value_text(field, value)}"
            if rec.best is not None:
                step = rec.best.prediction.iteration_time_s
                clauses.append(f"{label} has valid layouts alone (best {step:.3g} s per step): only its "
                               "combination with the other pins is rejected")
                continue
            reasons = sorted(((n, r) for r, n in rec.pruned.items() if r != PIN_REASON), reverse=True)
            if not reasons:
                why = (f"no grid of {num_gpus:,} GPUs has it ({value} does not divide {num_gpus:,})"
                       if isinstance(value, int) and field.startswith("G_") and num_gpus % value
                       else "no layout of this search space has it")
                clauses.append(f"{label}: {why}")
                continue
            parts = []
            for n, reason in reasons[:3]:
                example = rec.pruned_examples.get(reason, [])
                shown = example[0] if example and example[0] != reason and label not in example[0] else ""
                parts.append(f"{reason} ({n:,} layouts" + (f", e.g. {shown}" if shown else "") + ")")
            clauses.append(f"{label}: every layout with it is rejected by " + "; ".join(parts))
    return "no layout fits the search pins. " + ". ".join(clauses)
