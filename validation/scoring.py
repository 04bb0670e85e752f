"""Score one published run: the model's prediction for the layout and stack the row states.

A case whose row leaves options empty carries several candidates. It is scored with the MEDIAN
predicted step time over the candidates that fit in memory (over all of them when none fits), and
the spread (slowest / fastest of that same set) says how much the unknowns matter. The fastest
fitting candidate is also returned, labelled as such: it is what a tuned run would have picked, and
it flatters the model, so it is never the headline figure.

Fit verdict: the run is predicted to fit when at least one candidate fits; an OOM row is caught when
none does. Memory is the median predicted `memory.total_gib` over the same set as the time.

Run the tests: `PYTHONPATH=. .venv/bin/python -m pytest -q tests/validation/test_scoring.py`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from perfmodels.plans import from_plans
from perfmodels.specs import Plan, combination_problems
from perfmodels.steptime import predict_many
from validation.cases import Case


@dataclass(frozen=True, kw_only=True)
class CaseScore:
    """The predictions for one case (seconds and GiB)."""

    median_time_s: float
    spread: float
    """max / min predicted time over the candidates the median is taken over (1.0: one candidate)."""
    fastest_fitting_time_s: float | None
    """The fastest candidate that fits (what a tuned run would pick); None when none fits."""
    memory_gib: float
    capacity_gib: float
    fits: bool
    candidates: int
    fitting: int


def candidate_predictions(case: Case) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(time s, memory GiB, capacity GiB) of every valid candidate of the case (ValueError when none)."""
    times, mems, caps = [], [], []
    problems: list[str] = []
    for training in case.trainings:
        by_order: dict[tuple[str, ...], list[Plan]] = defaultdict(list)
        for plan in case.plans:
            why = combination_problems(case.model, case.cluster, training, plan)
            if why:
                problems.extend(why)
            else:
                by_order[plan.order].append(plan)
        for group in by_order.values():
            batch = predict_many(case.model, case.cluster, training, from_plans(group))
            times.append(np.asarray(batch.iteration_time_s, float))
            mems.append(np.asarray(batch.memory.total_gib, float))
            caps.append(np.broadcast_to(np.asarray(batch.memory.capacity_gib, float), len(group)))
    if not times:
        raise ValueError(f"no valid plan ({problems[0] if problems else 'no candidates'})")
    return np.concatenate(times), np.concatenate(mems), np.concatenate(caps)


def summarize(times: np.ndarray, mems: np.ndarray, caps: np.ndarray) -> CaseScore:
    """Median / spread / fastest-fitting over candidate predictions (the arithmetic of `score_case`)."""
    fits = mems <= caps
    pool = fits if fits.any() else np.ones_like(fits)
    t, m = times[pool], mems[pool]
    return CaseScore(median_time_s=float(np.median(t)), spread=float(t.max() / t.min()),
                     fastest_fitting_time_s=float(times[fits].min()) if fits.any() else None,
                     memory_gib=float(np.median(m)), capacity_gib=float(np.max(caps)), fits=bool(fits.any()),
                     candidates=int(times.size), fitting=int(fits.sum()))


def score_case(case: Case) -> CaseScore:
    return summarize(*candidate_predictions(case))
