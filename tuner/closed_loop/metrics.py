"""How good the predictions were: rank correlation, relative error, where the measured best ranked."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def spearman(predicted: Sequence[float], measured: Sequence[float]) -> float:
    if len(predicted) < 2:
        return float("nan")
    from scipy import stats  # here: scipy.stats costs ~0.4 s to import, and only this function needs it

    return float(stats.spearmanr(predicted, measured).statistic)


def mape(predicted: Sequence[float], measured: Sequence[float]) -> float:
    p, m = np.asarray(predicted, float), np.asarray(measured, float)
    if not len(m):
        return float("nan")
    return float(np.mean(np.abs(p - m) / m))


def predicted_rank_of_measured_best(predicted: Sequence[float], measured: Sequence[float]) -> int:
    """1-based position, in predicted order, of the plan that measured fastest."""
    best = int(np.argmin(measured))
    order = np.argsort(np.asarray(predicted, float), kind="stable")
    return int(np.flatnonzero(order == best)[0]) + 1


def spread_plans(predicted_s: Sequence[float], k: int = 3) -> list[int]:
    """Indices of `k` plans spread evenly over the predicted order (fastest, median, slowest for
    k=3): a rule that looks only at predictions, and that spans both the step-time range and the
    mix of components (fast plans are compute-bound, slow ones communication-bound)."""
    n = len(predicted_s)
    if n <= k:
        return list(range(n))
    order = [int(i) for i in np.argsort(np.asarray(predicted_s, float), kind="stable")]
    picks = [order[round(j * (n - 1) / (k - 1))] for j in range(k)] if k > 1 else [order[0]]
    return list(dict.fromkeys(picks))
