"""Recommendations and predictions as plain JSON-ready dicts (CLI --json, REST responses)."""

from __future__ import annotations

from typing import Any

from perfmodels.io import plan_to_dict, prediction_to_dict
from perfmodels.specs import Plan, Prediction
from tuner.types import Recommendation


def candidate_to_dict(rank: int, plan: Plan, prediction: Prediction) -> dict[str, Any]:
    return {"rank": rank, "plan": plan_to_dict(plan), "prediction": prediction_to_dict(prediction)}


def recommendation_to_dict(rec: Recommendation) -> dict[str, Any]:
    best = None
    if rec.best is not None:
        best = {"plan": plan_to_dict(rec.best.plan), "prediction": prediction_to_dict(rec.best.prediction)}
    return {
        "best": best,
        "candidates": [candidate_to_dict(c.rank, c.plan, c.prediction) for c in rec.candidates],
        "num_evaluated": rec.num_evaluated,
        "num_valid": rec.num_valid,
        "pruned": dict(rec.pruned),
        "pruned_examples": {k: list(v) for k, v in rec.pruned_examples.items()},
        "constants_source": rec.constants_source,
        "explanation": rec.explanation,
        "search_time_s": rec.search_time_s,
    }
