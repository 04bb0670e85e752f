"""The accuracy figures over scored cases (the README's, printed by bench/validate_published.py):
error by source and framework, rankings, memory verdicts.

Pure arithmetic on (`Case`, `CaseScore`) pairs, so `bench/validate_published.py` only reads files
and prints. Figures:
- iteration-time absolute percentage error of the median-candidate prediction (the headline), and
  of the fastest fitting candidate beside it (labelled: it flatters the model);
- per source and per framework: MAPE, median and p90;
- ranking groups (one model, cluster, GPU count, batch and framework; rows whose layout is stated;
  at least 3 runs): Spearman of predicted vs measured times and the predicted rank of the measured best;
- false OOM (ran, but no candidate fits), OOM rows caught, memory MAPE where a peak was measured.

Run the tests: `PYTHONPATH=. .venv/bin/python -m pytest -q tests/validation/test_summary.py`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from scipy.stats import spearmanr

from validation.cases import Case
from validation.scoring import CaseScore

MIN_GROUP = 3


@dataclass(frozen=True, kw_only=True)
class ErrorStats:
    rows: int
    mape: float
    median: float
    p90: float


def error_stats(ape: Iterable[float]) -> ErrorStats:
    a = np.asarray(list(ape), float)
    if a.size == 0:
        return ErrorStats(rows=0, mape=float("nan"), median=float("nan"), p90=float("nan"))
    return ErrorStats(rows=int(a.size), mape=float(a.mean()), median=float(np.median(a)),
                      p90=float(np.quantile(a, 0.9)))


@dataclass(frozen=True, kw_only=True)
class GroupRank:
    group: str
    runs: int
    spearman: float
    measured_best_predicted_rank: int
    mape: float
    worst_over_best: float


def ape(case: Case, score: CaseScore, *, fastest: bool = False) -> float | None:
    """Absolute percentage error of one timed case (None when it has no measured time)."""
    if not case.measured_time_s:
        return None
    pred = score.fastest_fitting_time_s if fastest else score.median_time_s
    if pred is None:  # nothing fits: the fastest-fitting figure falls back to the median set
        pred = score.median_time_s
    return abs(pred - case.measured_time_s) / case.measured_time_s


def by_key(scored: list[tuple[Case, CaseScore]], key: str) -> dict[str, ErrorStats]:
    """Error statistics per `source` or `framework`."""
    buckets: dict[str, list[float]] = defaultdict(list)
    for case, score in scored:
        e = ape(case, score)
        if e is not None:
            buckets[getattr(case, key)].append(e)
    return {k: error_stats(v) for k, v in sorted(buckets.items())}


def rank_agreement(measured: np.ndarray, predicted: np.ndarray) -> tuple[float, int]:
    """(Spearman of predicted vs measured, predicted rank of the measured best; ties rank it first)."""
    measured, predicted = np.asarray(measured, float), np.asarray(predicted, float)
    best = int(np.argmin(measured))
    return float(spearmanr(predicted, measured).statistic), int((predicted < predicted[best]).sum()) + 1


def ranking_groups(scored: list[tuple[Case, CaseScore]], *, min_runs: int = MIN_GROUP) -> list[GroupRank]:
    groups: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for case, score in scored:
        if case.measured_time_s and case.layout_stated:
            groups[case.group].append((case.measured_time_s, score.median_time_s))
    out = []
    for name, items in sorted(groups.items()):
        if len(items) < min_runs:
            continue
        meas = np.array([m for m, _ in items])
        pred = np.array([p for _, p in items])
        rho, rank = rank_agreement(meas, pred)
        out.append(GroupRank(group=name, runs=len(items), spearman=rho, measured_best_predicted_rank=rank,
                             mape=float(np.mean(np.abs(pred - meas) / meas)),
                             worst_over_best=float(meas.max() / meas.min())))
    return out


@dataclass(frozen=True, kw_only=True)
class MemoryVerdicts:
    false_oom: list[str]
    """Cases that ran (have a measured time) but no candidate is predicted to fit."""
    oom_rows: int
    oom_caught: int
    memory: ErrorStats
    """Predicted memory vs measured `peak_memory_gib`, where given."""
    assumed_card: int
    """Cases whose card memory was not stated (fit verdict on the family's largest card)."""


def memory_verdicts(scored: list[tuple[Case, CaseScore]]) -> MemoryVerdicts:
    false_oom = [c.case_id for c, s in scored if c.measured_time_s and not s.fits]
    oom = [(c, s) for c, s in scored if c.expect_oom]
    mem_err = [abs(s.memory_gib - c.measured_memory_gib) / c.measured_memory_gib
               for c, s in scored if c.measured_memory_gib]
    return MemoryVerdicts(
        false_oom=false_oom,
        oom_rows=len(oom),
        oom_caught=sum(1 for _, s in oom if not s.fits),
        memory=error_stats(mem_err),
        assumed_card=sum(1 for c, _ in scored if c.card_memory.assumed),
    )
