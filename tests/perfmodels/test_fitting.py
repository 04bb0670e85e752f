"""Fits of perfmodels.fitting recover known constants; hold-out and expectations behave."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from perfmodels import fitting, presets
from perfmodels.io import profile_from_dict, profile_to_dict

SIZES = fitting.message_sizes(4096, 64 << 20)


def test_factors_are_the_textbook_ring_and_tree_forms():
    p = 8  # the ring forms where model and textbook agree
    assert fitting.bytes_factor("all_reduce", p) == 14 / 8
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert fitting.latency_steps(op, p) == 7 and fitting.bytes_factor(op, p) == 7 / 8
    assert fitting.latency_steps("send_recv", p) == 1 and fitting.bytes_factor("send_recv", p) == 1
    assert fitting.latency_steps("broadcast", 5) == 3 and fitting.bytes_factor("broadcast", 5) == 1
    with pytest.raises(ValueError, match="unknown collective"):
        fitting.latency_steps("allreduce", 2)


@pytest.mark.parametrize("op", fitting.OPS)
@pytest.mark.parametrize("p", [2, 4, 8])
def test_synthetic_sweep_recovered_within_2_percent(op, p):
    rows = fitting.synthetic_rows(op, p, alpha_us=25.0, busbw=80.0, sizes=SIZES, trials=7, noise=0.01, seed=p)
    fits, holdout = fitting.fit_collectives(rows)
    assert len(fits) == 1
    fit = fits.iloc[0]
    assert fit["alpha_us"] == pytest.approx(25.0, rel=0.02)
    assert fit["busbw_GBps"] == pytest.approx(80.0, rel=0.02)
    assert fit["r2"] > 0.999
    assert fit["holdout_median_abs_error"] < 0.02
    assert fit["n_points"] == len(SIZES) and fit["n_holdout"] == len(holdout) > 0


def test_exact_data_fit_is_exact():
    rows = fitting.synthetic_rows("all_gather", 4, alpha_us=12.0, busbw=150.0, sizes=SIZES, trials=1)
    fit = fitting.fit_alpha_beta("all_gather", 4, rows["bytes"], rows["seconds"])
    assert fit.alpha_us == pytest.approx(12.0, rel=1e-6)
    assert fit.busbw_GBps == pytest.approx(150.0, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0)


def test_reduce_scatter_measured_like_all_reduce_fits_half_the_busbw():
    """gloo's reduce-scatter is an all-reduce plus a slice: the fit must show it, not assume a ring."""
    p, alpha, busbw = 4, 50.0, 2.0
    ar = fitting.synthetic_rows("all_reduce", p, alpha, busbw, SIZES)
    rs = ar.assign(op="reduce_scatter")  # same times, measured under the reduce-scatter name
    fits, _ = fitting.fit_collectives(pd.concat([ar, rs], ignore_index=True))
    by_op = fits.set_index("op")
    assert by_op.loc["all_reduce", "busbw_GBps"] == pytest.approx(busbw, rel=1e-6)
    assert by_op.loc["reduce_scatter", "busbw_GBps"] == pytest.approx(busbw / 2, rel=1e-6)
    steps = fitting.latency_steps("all_reduce", p) / fitting.latency_steps("reduce_scatter", p)
    assert by_op.loc["reduce_scatter", "alpha_us"] == pytest.approx(steps * alpha, rel=1e-6)


def test_holdout_mask_every_third_never_the_largest():
    assert fitting.holdout_mask(range(11)).nonzero()[0].tolist() == [1, 4, 7]
    assert fitting.holdout_mask(range(5)).nonzero()[0].tolist() == [1]
    assert fitting.holdout_mask(range(2)).nonzero()[0].tolist() == []


def test_holdout_error_reflects_model_mismatch():
    rows = fitting.synthetic_rows("all_reduce", 2, 10.0, 5.0, SIZES)
    # a protocol switch: messages from 1 MiB on take 30% longer than the straight line
    rows.loc[rows["bytes"] >= (1 << 20), "seconds"] *= 1.3
    fits, holdout = fitting.fit_collectives(rows)
    assert fits.iloc[0]["holdout_median_abs_error"] > 0.01
    assert fitting.overall_holdout_error(holdout) == pytest.approx(float(np.median(holdout["rel_error"])))


def test_fit_rejects_bad_input():
    with pytest.raises(ValueError, match=">= 2"):
        fitting.fit_alpha_beta("all_reduce", 2, [1024], [1e-3])
    with pytest.raises(ValueError, match="seconds must be > 0"):
        fitting.fit_alpha_beta("all_reduce", 2, [1024, 2048], [1e-3, 0.0])


def test_gemm_curve_recovered():
    shapes = [(64, 64, 64), (256, 256, 256), (1024, 1024, 1024), (16, 1024, 1024), (1024, 16, 1024),
              (1024, 1024, 16), (64, 1024, 1024), (4096, 256, 512)]
    m, n, k = (np.array(x, dtype=float) for x in zip(*shapes))
    t = fitting.gemm_time_s(m, n, k, 0.08, 48.0, 20.0)
    fit = fitting.fit_gemm(m, n, k, t * (1 + 0.005 * np.sin(np.arange(t.size))))
    assert fit.gemm_tflops_max == pytest.approx(0.08, rel=0.02)
    assert fit.gemm_half_size == pytest.approx(48.0, rel=0.05)
    assert fit.gemm_overhead_us == pytest.approx(20.0, rel=0.1)
    assert fit.median_abs_error < 0.01


def test_memory_bandwidth_from_copy_rows():
    rows = pd.DataFrame({"op": ["copy"] * 4, "bytes": [2 << 20, 2 << 20, 2 << 30, 2 << 30],
                         "seconds": [1e-4, 2e-4, 0.2, 0.2]})
    assert fitting.memory_bandwidth_GBps(rows) == pytest.approx((2 << 30) / 0.2 / 1e9)
    assert fitting.memory_bandwidth_GBps(rows.iloc[:0]) is None


def test_expected_table_ratio_and_expected_formula():
    selene = presets.cluster("selene")
    assert fitting.expected_busbw_GBps(selene, "all_reduce", "intra", 8)[0] == pytest.approx(300 * 0.8)
    assert fitting.expected_busbw_GBps(selene, "all_reduce", "inter", 8)[0] == pytest.approx(
        min(300 * 0.8, 8 * 25 * 0.85))
    assert fitting.expected_busbw_GBps(selene, "all_reduce", "inter", 1)[0] == pytest.approx(25 * 0.85)
    rows = pd.concat([fitting.synthetic_rows("all_reduce", 8, 5.0, 180.0, SIZES),
                      fitting.synthetic_rows("all_reduce", 16, 8.0, 40.0, SIZES, level="inter",
                                             members_per_node=1)])
    fits, _ = fitting.fit_collectives(rows)
    table = fitting.expected_table(fits, selene)
    assert len(table) == 2
    for r in table.itertuples():
        assert r.expected_busbw_GBps > 0
        assert r.ratio == pytest.approx(r.measured_busbw_GBps / r.expected_busbw_GBps)
    assert fitting.expected_table(fits, None).empty


def test_build_profile_round_trips_through_io():
    rows = pd.concat(
        [
            fitting.synthetic_rows("all_reduce", 2, 5.0, 100.0, SIZES),
            fitting.synthetic_rows("all_reduce", 4, 5.0, 10.0, SIZES, level="inter", members_per_node=2),
            fitting.synthetic_rows("all_reduce", 4, 5.0, 5.0, SIZES, level="inter", members_per_node=1),
        ]
    )
    fits, _ = fitting.fit_collectives(rows)
    gemm = fitting.GemmFit(gemm_tflops_max=100.0, gemm_half_size=64.0, gemm_overhead_us=5.0, r2=1.0,
                           median_abs_error=0.0, n_points=5)
    profile = fitting.build_profile(fits, gemm=gemm, hbm_bandwidth_GBps=1500.0, profile_id="t")
    assert len(profile.collectives) == 2  # (all_reduce, inter, 4) keeps the q=1 placement
    inter = next(c for c in profile.collectives if c.level == "inter")
    assert inter.busbw_GBps == pytest.approx(5.0, rel=1e-6)
    back = profile_from_dict(profile_to_dict(profile))
    assert back == profile
    assert math.isclose(back.gemm_tflops_max, 100.0)


def test_latency_bound_sweep_keeps_a_conservative_bandwidth():
    """Messages too small to show the bandwidth: no 1e6 GB/s, but the smallest consistent busbw."""
    sizes = fitting.message_sizes(4096, 65536)
    rows = fitting.synthetic_rows("all_reduce", 2, alpha_us=200.0, busbw=1000.0, sizes=sizes)
    fit = fitting.fit_collectives(rows)[0].iloc[0]
    assert not fit["bandwidth_resolved"]
    largest = rows[rows["bytes"] == max(sizes)]["seconds"].iloc[0]
    bytes_term = float(fitting.bytes_factor("all_reduce", 2)) * max(sizes) / (fit["busbw_GBps"] * 1e9)
    assert bytes_term == pytest.approx(0.05 * largest, rel=1e-6)
    assert fit["alpha_us"] == pytest.approx(200.0, rel=0.05)
    assert fitting.fit_collectives(fitting.synthetic_rows("all_reduce", 2, 20.0, 5.0, SIZES))[0].iloc[0][
        "bandwidth_resolved"]
