"""Recommendations and predictions as plain JSON-ready dicts (CLI --json, REST responses) and CSV rows."""

from __future__ import annotations

import csv
from dataclasses import fields
from pathlib import Path
from typing import Any

from perfmodels.io import plan_to_dict, prediction_to_dict
from perfmodels.specs import SCALAR_PLAN_FIELDS, MemoryBreakdown, Plan, Prediction
from tuner.types import Candidate, Recommendation


def candidate_to_dict(rank: int, plan: Plan, prediction: Prediction,
                      equivalent_placements: tuple[tuple[str, ...], ...] = (),
                      equivalent_zero_stages: tuple[int, ...] = ()) -> dict[str, Any]:
    out = {"rank": rank, "plan": plan_to_dict(plan), "prediction": prediction_to_dict(prediction)}
    if equivalent_placements:
        out["equivalent_placements"] = [list(p) for p in equivalent_placements]
    if equivalent_zero_stages:
        out["equivalent_zero_stages"] = list(equivalent_zero_stages)
    return out


def recommendation_to_dict(rec: Recommendation) -> dict[str, Any]:
    best = None
    if rec.best is not None:
        best = {"plan": plan_to_dict(rec.best.plan), "prediction": prediction_to_dict(rec.best.prediction)}
    return {
        "best": best,
        "candidates": [candidate_to_dict(c.rank, c.plan, c.prediction, c.equivalent_placements,
                                         c.equivalent_zero_stages)
                       for c in rec.candidates],
        "num_evaluated": rec.num_evaluated,
        "num_valid": rec.num_valid,
        "complete": rec.complete,
        "num_not_evaluated": rec.num_not_evaluated,
        "num_proved_slower": rec.num_proved_slower,
        "exhaustive": rec.exhaustive,
        "pruned": dict(rec.pruned),
        "pruned_examples": {k: list(v) for k, v in rec.pruned_examples.items()},
        "constants_source": rec.constants_source,
        "explanation": rec.explanation,
        "search_time_s": rec.search_time_s,
    }


CSV_PLAN = SCALAR_PLAN_FIELDS
CSV_PREDICTION = ("iteration_time_s", "tokens_per_s", "tflops_per_gpu", "mfu")
CSV_MEMORY = tuple(f.name for f in fields(MemoryBreakdown))
MEMORY_PARTS = tuple(name for name in CSV_MEMORY if name not in ("per_gpu_gib", "capacity_gib", "fits"))
"""What the per-GPU memory is made of (the MemoryBreakdown fields that add up to `per_gpu_gib`)."""


def candidate_row(c: Candidate) -> dict[str, Any]:
    """One flat CSV row: plan, headline numbers, memory and every time component."""
    row: dict[str, Any] = {"rank": c.rank}
    row.update({f: getattr(c.plan, f, None) for f in CSV_PLAN})
    row["placement"] = "/".join(c.plan.order)
    row["equivalent_placements"] = " ".join("/".join(p) for p in c.equivalent_placements)
    row["equivalent_zero_stages"] = " ".join(str(z) for z in c.equivalent_zero_stages)
    row.update({f: getattr(c.prediction, f) for f in CSV_PREDICTION})
    row.update({f"memory_{f}": getattr(c.prediction.memory, f, None) for f in CSV_MEMORY})
    row.update({f"time_{k}": v for k, v in vars(c.prediction.breakdown).items()})
    row["constants_source"] = c.prediction.constants_source
    return row


def write_candidates_csv(rec: Recommendation, path: str | Path) -> Path:
    """Every ranked candidate of `rec` as CSV (header row first)."""
    out = Path(path)
    rows = [candidate_row(c) for c in rec.candidates]
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as fh:
        names = list(rows[0]) if rows else ["rank", *CSV_PLAN]
        writer = csv.DictWriter(fh, fieldnames=names)
        writer.writeheader()
        writer.writerows(rows)
    return out


def parallel_columns(plans: list[Plan]) -> list[tuple[str, Any]]:
    """The table columns for context and expert parallelism, only where some plan uses them:
    ("CP", G_cp) and ("EP", G_ep), ("ETP", G_etp resolved) as (header, plan -> text)."""
    out: list[tuple[str, Any]] = []
    if any(p.G_cp > 1 for p in plans):
        out.append(("CP", lambda p: str(p.G_cp)))
    if any(p.G_ep > 1 or p.G_etp is not None for p in plans):
        out.append(("EP", lambda p: str(p.G_ep)))
        out.append(("ETP", lambda p: str(p.expert_tp)))
    return out
