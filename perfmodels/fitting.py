"""Fit the performance model's constants to microbenchmark rows (pure numpy/scipy/pandas).

Why: the time model (`perfmodels.collectives`, `perfmodels.compute`) needs per-cluster constants;
preset link bandwidths say what the hardware *should* do, a profile says what it *does*. This
module turns tidy measurement rows (from `engine.microbench` or `perfmodels.nccl_tests`) into

- alpha-beta constants per (collective, link level, group size), fitted in the exact form the time
  model evaluates: `t = latency_steps(op, p) * alpha + bytes_factor(op, p) * N / busbw` with the
  time model's own step counts and byte factors (`perfmodels.collectives`; ring forms without it),
  by bounded robust least squares on relative error, with R^2;
- a hold-out score: fit on all message sizes but every third one, predict the held-out ones, report
  the median |pred - meas| / meas, then refit on every size for the saved constants;
- the GEMM efficiency curve `t = 2mnk / (peak * sf) + overhead`, `sf = 1/(1 + h/m + h/n + h/k)`;
- memory bandwidth from large copies;
- next to every fitted bus bandwidth, what the cluster preset says to expect, and the ratio.

Nothing here assumes a collective's algorithm: on gloo, reduce-scatter is an all-reduce plus a
slice, so fitted with the reduce-scatter ring factor its busbw comes out about half the
all-reduce one. The fit sees that instead of assuming the ring formula.

Run the synthetic self-check with `python -m pytest tests/perfmodels/test_fitting.py`.

pandas and scipy.optimize are imported inside the functions that use them (together ~1 s): what
reads a stored profile (`tuner.profiles.read_profile`, `gridtune recommend --profile`, the service)
imports this module for its names and never fits.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from perfmodels import collectives
from perfmodels.compute import GemmCurve
from perfmodels.compute import gemm_time_s as compute_gemm_time_s
from perfmodels.specs import Cluster, CollectiveFit, Profile

if TYPE_CHECKING:
    import pandas as pd

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast")
"""Collectives the time model knows; N is the full buffer (all-gather output, reduce-scatter input)."""

RAW_COLUMNS = (
    "op", "bytes", "group_size", "level", "members_per_node", "trial", "seconds",
    "host", "torch_version", "backend", "nccl_version",
)
"""Columns every raw row has (CSV order). GEMM/memory rows add m, n, k, dtype (empty elsewhere)."""

EXTRA_COLUMNS = ("m", "n", "k", "dtype")
GEMM_OP = "gemm"
COPY_OP = "copy"
"""Memory-bandwidth rows: `bytes` counts bytes read plus bytes written (2x the buffer for a copy)."""

_GROUP_KEYS = ["op", "level", "group_size", "members_per_node"]


# --------------------------------------------------------------------------------------------
# Cost factors: those of perfmodels.collectives, so fitted constants mean what the model uses
# --------------------------------------------------------------------------------------------


def _check_op(op: str) -> None:
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}; known: {list(OPS)}")


def latency_steps(op: str, p: np.ndarray | int) -> np.ndarray:
    """Number of alpha terms of `op` on p ranks, exactly as the time model counts them
    (`perfmodels.collectives`, which takes NCCL's tree where it has fewer steps than the ring)."""
    _check_op(op)
    return np.asarray(collectives.latency_steps(op, np.asarray(p, dtype=float)), dtype=float)


def bytes_factor(op: str, p: np.ndarray | int) -> np.ndarray:
    """Fraction of the full buffer each rank moves over its busiest link (nccl-tests busbw factor)."""
    _check_op(op)
    return np.asarray(collectives.bytes_factor(op, np.asarray(p, dtype=float)), dtype=float)


def collective_time_s(op: str, p: np.ndarray | int, nbytes: np.ndarray | float, alpha_us: float,
                      busbw_GBps: float) -> np.ndarray:
    """Alpha-beta time of `op` on p ranks for N bytes of full buffer: the time model's own formula
    (`perfmodels.collectives.collective_time_s`), so what is fitted is what is costed."""
    _check_op(op)
    return np.asarray(
        collectives.collective_time_s(
            op,
            np.asarray(nbytes, dtype=float),
            np.asarray(p, dtype=float),
            np.asarray(alpha_us),
            np.asarray(busbw_GBps),
        ),
        dtype=float,
    )


def busbw_GBps(
    op: str, p: np.ndarray | int, nbytes: np.ndarray | float, seconds: np.ndarray | float
) -> np.ndarray:
    """nccl-tests' bus bandwidth: algbw (N / t) times the op's bytes factor, in GB/s (1e9)."""
    return bytes_factor(op, p) * np.asarray(nbytes, dtype=float) / np.asarray(seconds, dtype=float) / 1e9


# --------------------------------------------------------------------------------------------
# Alpha-beta fit
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AlphaBeta:
    alpha_us: float
    busbw_GBps: float
    r2: float
    n_points: int
    bandwidth_resolved: bool = True


def r_squared(measured: np.ndarray, predicted: np.ndarray) -> float:
    measured = np.asarray(measured, dtype=float)
    ss_res = float(np.sum((measured - predicted) ** 2))
    ss_tot = float(np.sum((measured - measured.mean()) ** 2))
    if ss_tot <= 0:
        return 1.0 if ss_res <= 1e-30 else 0.0
    return 1.0 - ss_res / ss_tot


_MAX_BUSBW_GBPS = 1e6
_MIN_BANDWIDTH_SHARE = 0.05


def fit_alpha_beta(op: str, group_size: int, nbytes: Sequence[float], seconds: Sequence[float]) -> AlphaBeta:
    """Fit alpha (us) and busbw (GB/s) of `op` on `group_size` ranks to (bytes, seconds) points.

    Linear in (alpha, 1/busbw); solved with `scipy.optimize.least_squares` on relative residuals
    (message sizes span three orders of magnitude, and the hold-out metric is relative), with a
    soft-L1 loss so one size disturbed by the OS scheduler does not drag the line, and bounds
    alpha >= 0, busbw <= 1e6 GB/s. Pass one point per size (medians over trials).
    """
    x = np.asarray(nbytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if x.size != t.size or x.size < 2:
        raise ValueError(
            f"fit_alpha_beta({op}, p={group_size}) needs >= 2 (bytes, seconds) points, got {x.size}"
        )
    if np.any(t <= 0) or np.any(x < 0):
        raise ValueError(f"fit_alpha_beta({op}, p={group_size}): seconds must be > 0 and bytes >= 0")
    steps = float(latency_steps(op, group_size))
    factor = float(bytes_factor(op, group_size))
    if factor <= 0:  # a group of one moves nothing
        raise ValueError(f"fit_alpha_beta({op}): group_size={group_size} moves no bytes")
    # columns: alpha in us, inverse bandwidth in ns/byte (= 1 / busbw_GBps)
    a_col = steps * 1e-6 * np.ones_like(x)
    b_col = factor * x * 1e-9

    def residual(params: np.ndarray) -> np.ndarray:
        return (a_col * params[0] + b_col * params[1]) / t - 1.0

    # starting point: two-point line through the smallest and the largest message
    i_lo, i_hi = int(np.argmin(x)), int(np.argmax(x))
    inv_bw0 = max((t[i_hi] - t[i_lo]) / max(b_col[i_hi] - b_col[i_lo], 1e-30), 1.0 / _MAX_BUSBW_GBPS)
    alpha0 = max((t[i_lo] - b_col[i_lo] * inv_bw0) / max(a_col[i_lo], 1e-30), 1e-3)
    lower = [0.0, 1.0 / _MAX_BUSBW_GBPS]
    x0 = np.array([alpha0, inv_bw0])
    f_scale = 0.1
    from scipy.optimize import least_squares  # lazy (module docstring)

    sol = least_squares(residual, x0, bounds=(lower, [np.inf, np.inf]), loss="soft_l1", f_scale=f_scale,
                        x_scale=np.maximum(np.abs(x0), [1e-3, 1e-6]))
    alpha_us, inv_bw = float(sol.x[0]), float(sol.x[1])
    resolved = True
    floor = _MIN_BANDWIDTH_SHARE * t[i_hi] / b_col[i_hi] if b_col[i_hi] > 0 else inv_bw
    if inv_bw < floor:
        # The bytes term is under 5% of the largest message's time: the sweep (too small, or
        # latency-bound) cannot tell the bandwidth. Keep the smallest bandwidth consistent with it
        # (bytes term = 5% there), which is conservative, and refit alpha alone.
        resolved, inv_bw = False, floor
        sol = least_squares(lambda a: residual(np.array([a[0], inv_bw])), [max(alpha_us, 1e-3)],
                            bounds=([0.0], [np.inf]), loss="soft_l1", f_scale=f_scale)
        alpha_us = float(sol.x[0])
    pred = a_col * alpha_us + b_col * inv_bw
    return AlphaBeta(alpha_us=alpha_us, busbw_GBps=1.0 / inv_bw, r2=r_squared(t, pred), n_points=int(x.size),
                     bandwidth_resolved=resolved)


def holdout_mask(sizes: Sequence[float]) -> np.ndarray:
    """Which of the sorted distinct sizes are held out: every third one (indices 1, 4, 7, ...).

    The largest size is never held out, so the score measures interpolation between measured sizes
    (the model's use) rather than extrapolation beyond them.
    """
    s = np.asarray(sizes)
    idx = np.arange(s.size)
    return (idx % 3 == 1) & (idx < s.size - 1)


def median_points(rows: pd.DataFrame) -> pd.DataFrame:
    """One point per (op, level, group size, members per node, bytes): the median over trials."""
    cols = [*_GROUP_KEYS, "bytes"]
    return rows.groupby(cols, as_index=False, sort=True)["seconds"].median()


def collective_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of `rows` that are collectives with a group of at least two ranks."""
    if rows is None or len(rows) == 0:
        import pandas as pd  # lazy (module docstring)

        return pd.DataFrame(columns=list(RAW_COLUMNS))
    out = rows[rows["op"].isin(OPS) & (rows["group_size"].astype(int) >= 2)].copy()
    out["group_size"] = out["group_size"].astype(int)
    out["members_per_node"] = out["members_per_node"].astype(int)
    out["bytes"] = out["bytes"].astype(float)
    out["seconds"] = out["seconds"].astype(float)
    return out


def fit_collectives(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Fit every (op, level, group size, members per node) in `rows`.

    Returns `(fits, holdout)`: one fit row per group with alpha_us, busbw_GBps, r2, n_points, the
    hold-out median relative error and the bus bandwidth measured at the largest message; and one
    row per held-out point (bytes, measured, predicted, rel_error) for reports.
    """
    import pandas as pd  # lazy (module docstring)

    pts = median_points(collective_rows(rows))
    fit_rows: list[dict] = []
    held_rows: list[dict] = []
    for key, g in pts.groupby(_GROUP_KEYS, sort=True):
        op, level, p, q = key
        g = g.sort_values("bytes")
        x, t = g["bytes"].to_numpy(float), g["seconds"].to_numpy(float)
        if x.size < 2:
            continue
        mask = holdout_mask(x)
        hold_err = math.nan
        if mask.any() and (~mask).sum() >= 2:
            part = fit_alpha_beta(op, int(p), x[~mask], t[~mask])
            pred = collective_time_s(op, int(p), x[mask], part.alpha_us, part.busbw_GBps)
            rel = np.abs(pred - t[mask]) / t[mask]
            hold_err = float(np.median(rel))
            for b, meas, pr, e in zip(x[mask], t[mask], pred, rel):
                held_rows.append({"op": op, "level": level, "group_size": int(p), "members_per_node": int(q),
                                  "bytes": float(b), "measured_s": float(meas), "predicted_s": float(pr),
                                  "rel_error": float(e)})
        full = fit_alpha_beta(op, int(p), x, t)
        fit_rows.append({
            "op": op, "level": level, "group_size": int(p), "members_per_node": int(q),
            "alpha_us": full.alpha_us, "busbw_GBps": full.busbw_GBps, "r2": full.r2,
            "holdout_median_abs_error": hold_err, "n_points": full.n_points,
            "bandwidth_resolved": full.bandwidth_resolved,
            "n_holdout": int(mask.sum()) if not math.isnan(hold_err) else 0,
            "largest_bytes": float(x[-1]),
            "largest_busbw_GBps": float(busbw_GBps(op, int(p), x[-1], t[-1])),
        })
    fits = pd.DataFrame(
        fit_rows,
        columns=[
            *_GROUP_KEYS,
            "alpha_us",
            "busbw_GBps",
            "r2",
            "holdout_median_abs_error",
            "n_points",
            "bandwidth_resolved",
            "n_holdout",
            "largest_bytes",
            "largest_busbw_GBps",
        ],
    )
    holdout = pd.DataFrame(
        held_rows, columns=[*_GROUP_KEYS, "bytes", "measured_s", "predicted_s", "rel_error"]
    )
    return fits, holdout


def overall_holdout_error(holdout: pd.DataFrame) -> float:
    """Median relative error over every held-out point of every fit (NaN when nothing was held out)."""
    if holdout is None or len(holdout) == 0:
        return math.nan
    return float(np.median(holdout["rel_error"].to_numpy(float)))


# --------------------------------------------------------------------------------------------
# GEMM efficiency curve and memory bandwidth
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class GemmFit:
    gemm_tflops_max: float
    gemm_half_size: float
    gemm_overhead_us: float
    r2: float
    median_abs_error: float
    n_points: int


def gemm_time_s(m: np.ndarray, n: np.ndarray, k: np.ndarray, gemm_tflops_max: float, gemm_half_size: float,
                gemm_overhead_us: float) -> np.ndarray:
    """The time model's GEMM curve (`perfmodels.compute.gemm_time_s`) with these three constants."""
    curve = GemmCurve(
        tflops_max=gemm_tflops_max, half_size=gemm_half_size, overhead_s=gemm_overhead_us * 1e-6
    )
    return compute_gemm_time_s(m, n, k, curve)


def fit_gemm(m: Sequence[float], n: Sequence[float], k: Sequence[float], seconds: Sequence[float]) -> GemmFit:
    """Fit (peak TFLOP/s, half size, overhead us) by bounded least squares on relative error.

    Multi-start over the half size (the problem is not convex in it); keeps the lowest cost.
    Needs shapes that vary one dimension at a time (skinny ones) for the half size to be
    identifiable; `engine.microbench.default_gemm_shapes` provides them.
    """
    m, n, k, t = (np.asarray(a, dtype=float) for a in (m, n, k, seconds))
    if t.size < 3:
        raise ValueError(f"fit_gemm needs >= 3 shapes, got {t.size}")
    flops = 2.0 * m * n * k
    peak0 = float(np.max(flops / t)) / 1e12 * 1.5

    def residual(params: np.ndarray) -> np.ndarray:
        return gemm_time_s(m, n, k, params[0], params[1], params[2]) / t - 1.0

    from scipy.optimize import least_squares  # lazy (module docstring)

    best = None
    for h0 in (4.0, 32.0, 256.0):
        x0 = np.array([peak0, h0, float(np.min(t)) * 1e6 * 0.2])
        sol = least_squares(residual, x0, bounds=([1e-9, 1e-3, 0.0], [1e6, 1e6, 1e7]),
                            x_scale=np.maximum(x0, [1e-9, 1.0, 1.0]), loss="soft_l1", f_scale=0.1)
        if best is None or sol.cost < best.cost:
            best = sol
    assert best is not None
    peak, half, over = (float(v) for v in best.x)
    pred = gemm_time_s(m, n, k, peak, half, over)
    return GemmFit(gemm_tflops_max=peak, gemm_half_size=half, gemm_overhead_us=over, r2=r_squared(t, pred),
                   median_abs_error=float(np.median(np.abs(pred - t) / t)), n_points=int(t.size))


def fit_gemm_rows(rows: pd.DataFrame) -> GemmFit | None:
    """GEMM fit from raw rows (op == "gemm", columns m, n, k, seconds); None when there are none."""
    if rows is None or len(rows) == 0 or "m" not in rows:
        return None
    g = rows[rows["op"] == GEMM_OP]
    if len(g) == 0:
        return None
    g = g.astype({"m": float, "n": float, "k": float, "seconds": float})
    med = g.groupby(["m", "n", "k"], as_index=False)["seconds"].median()
    if len(med) < 3:
        return None
    return fit_gemm(med["m"], med["n"], med["k"], med["seconds"])


def memory_bandwidth_GBps(rows: pd.DataFrame) -> float | None:
    """Streaming bandwidth from copy rows: bytes moved / median time at the largest buffer (GB/s)."""
    if rows is None or len(rows) == 0:
        return None
    c = rows[rows["op"] == COPY_OP]
    if len(c) == 0:
        return None
    med = c.astype({"bytes": float, "seconds": float}).groupby("bytes")["seconds"].median()
    largest = float(med.index.max())
    return largest / float(med.loc[largest]) / 1e9


# --------------------------------------------------------------------------------------------
# What the preset hardware says to expect
# --------------------------------------------------------------------------------------------


def expected_busbw_GBps(cluster: Cluster, op: str, level: str, members_per_node: int) -> tuple[float, str]:
    """Bus bandwidth the cluster's preset numbers predict (the time model's own formula, so the
    table and the model agree), and where the formula came from."""
    return float(
        collectives.expected_busbw_GBps(cluster, op, level, int(members_per_node))
    ), "perfmodels.collectives"


def expected_table(fits: pd.DataFrame, cluster: Cluster | None) -> pd.DataFrame:
    """Measured (fitted asymptotic) busbw next to the preset's expectation and their ratio."""
    import pandas as pd  # lazy (module docstring)

    cols = [*_GROUP_KEYS, "measured_busbw_GBps", "expected_busbw_GBps", "ratio", "expected_source"]
    if cluster is None or fits is None or len(fits) == 0:
        return pd.DataFrame(columns=cols)
    out = []
    for r in fits.itertuples(index=False):
        exp, src = expected_busbw_GBps(cluster, r.op, r.level, int(r.members_per_node))
        out.append({"op": r.op, "level": r.level, "group_size": int(r.group_size),
                    "members_per_node": int(r.members_per_node), "measured_busbw_GBps": float(r.busbw_GBps),
                    "expected_busbw_GBps": exp, "ratio": float(r.busbw_GBps) / exp if exp > 0 else math.nan,
                    "expected_source": src})
    return pd.DataFrame(out, columns=cols)


# --------------------------------------------------------------------------------------------
# Profile
# --------------------------------------------------------------------------------------------


def build_profile(fits: pd.DataFrame, *, gemm: GemmFit | None = None, hbm_bandwidth_GBps: float | None = None,
                  profile_id: str = "") -> Profile:
    """A `Profile` with one `CollectiveFit` per (op, level, group size).

    `CollectiveFit` has no members-per-node key; where a cross-node group size was measured with
    several placements, the one with the fewest members per node is kept (the outer data-parallel
    case, and the conservative one); the full table stays in the profile JSON's "fits".
    """
    collectives: list[CollectiveFit] = []
    if fits is not None and len(fits):
        ordered = fits.sort_values(["op", "level", "group_size", "members_per_node"])
        for _, g in ordered.groupby(["op", "level", "group_size"], sort=True):
            r = g.iloc[0]
            collectives.append(
                CollectiveFit(
                    op=str(r["op"]),
                    level=str(r["level"]),
                    group_size=int(r["group_size"]),
                    alpha_us=float(r["alpha_us"]),
                    busbw_GBps=float(r["busbw_GBps"]),
                    r2=float(r["r2"]),
                )
            )
    return Profile(
        profile_id=profile_id,
        collectives=tuple(collectives),
        gemm_tflops_max=gemm.gemm_tflops_max if gemm else None,
        gemm_half_size=gemm.gemm_half_size if gemm else None,
        gemm_overhead_us=gemm.gemm_overhead_us if gemm else None,
        hbm_bandwidth_GBps=hbm_bandwidth_GBps,
    )


# --------------------------------------------------------------------------------------------
# Synthetic sweeps (tests, bench)
# --------------------------------------------------------------------------------------------


def message_sizes(min_bytes: int, max_bytes: int, factor: float = 2.0) -> list[int]:
    """Geometric sizes from min to max (inclusive when max is on the grid)."""
    if min_bytes < 1 or max_bytes < min_bytes or factor <= 1:
        raise ValueError(f"bad size sweep: min_bytes={min_bytes} max_bytes={max_bytes} factor={factor}")
    out, s = [], float(min_bytes)
    while s <= max_bytes * (1 + 1e-9):
        out.append(round(s))
        s *= factor
    return out


def synthetic_rows(
    op: str,
    group_size: int,
    alpha_us: float,
    busbw: float,
    sizes: Iterable[int],
    *,
    trials: int = 5,
    noise: float = 0.0,
    level: str = "intra",
    members_per_node: int | None = None,
    seed: int = 0,
) -> pd.DataFrame:
    """Rows of a sweep whose truth is the alpha-beta model, with optional multiplicative noise."""
    import pandas as pd  # lazy (module docstring)

    rng = np.random.default_rng(seed)
    sizes = np.asarray(list(sizes), dtype=float)
    t = collective_time_s(op, group_size, sizes, alpha_us, busbw)
    rows = []
    for trial in range(trials):
        noisy = t * (1.0 + noise * rng.standard_normal(t.size)) if noise else t
        for b, s in zip(sizes, noisy):
            rows.append({"op": op, "bytes": int(b), "group_size": group_size, "level": level,
                         "members_per_node": members_per_node or group_size, "trial": trial,
                         "seconds": float(max(s, 1e-12)), "host": "synthetic", "torch_version": "",
                         "backend": "synthetic", "nccl_version": ""})
    return pd.DataFrame(rows, columns=list(RAW_COLUMNS))
