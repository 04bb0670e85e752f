"""How well does the model predict published training runs? Prints the issue's figures.

    .venv/bin/python bench/validate_published.py [--data-dir ../shared/validation] [--csv extra.csv ...]
        [--json] [--verbose]

Figures: iteration-time MAPE over every row with a usable metric; per ranking group (one model on
one cluster, GPU count, batch and framework, at least 3 runs) the Spearman correlation of
predicted and measured times and the predicted rank of the measured-best layout; OOM rows
(held-out sets) classified by the memory model; and how many plans per second the vectorized
evaluator scores. Rows that cannot be used are listed with the reason.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perfmodels import published  # noqa: E402
from perfmodels.plans import from_columns, from_plans  # noqa: E402
from perfmodels.specs import combination_problems  # noqa: E402
from perfmodels.steptime import predict_many  # noqa: E402


def score_case(case: published.Case) -> tuple[float, float, bool]:
    """(predicted time of the plan a tuned run would use, its memory GiB, fits): the fastest plan that
    fits; when none of the candidate plans fits, the one needing the least memory (an OOM call)."""
    plans = [p for p in case.plans if not combination_problems(case.model, case.cluster, case.training, p)]
    if not plans:
        raise ValueError(f"{case.case_id}: no valid plan")
    by_order: dict[tuple, list] = defaultdict(list)
    for p in plans:
        by_order[p.order].append(p)
    best = (float("inf"), 0.0, True)
    leanest = (float("inf"), float("inf"), False)  # when nothing fits: the plan needing least memory
    for group in by_order.values():
        batch = predict_many(case.model, case.cluster, case.training, from_plans(group))
        fits = batch.memory.total_gib <= batch.memory.capacity_gib
        t = np.where(fits, batch.iteration_time_s, np.inf)
        i = int(np.argmin(t))
        if fits[i] and t[i] < best[0]:
            best = (float(batch.iteration_time_s[i]), float(batch.memory.total_gib[i]), True)
        j = int(np.argmin(batch.memory.total_gib))
        if batch.memory.total_gib[j] < leanest[1]:
            leanest = (float(batch.iteration_time_s[j]), float(batch.memory.total_gib[j]), False)
    return best if np.isfinite(best[0]) else leanest


def plans_per_second() -> float:
    from perfmodels import presets
    from perfmodels.specs import Training

    model, cluster = presets.model("gpt3-175b"), presets.cluster("selene", 1024)
    training = Training(global_batch_size=1536)
    n = 200_000
    rng = np.random.default_rng(0)
    cols = {
        "G_data": 2 ** rng.integers(0, 5, n), "G_inter": 2 ** rng.integers(0, 4, n),
        "G_intra_d": 2 ** rng.integers(0, 2, n), "G_intra_r": 2 ** rng.integers(0, 4, n),
        "G_intra_c": np.ones(n, int), "micro_batch_size": 2 ** rng.integers(0, 3, n),
        "recompute": rng.integers(0, 3, n), "zero_stage": rng.integers(0, 4, n),
    }
    arrays = from_columns(**cols)
    predict_many(model, cluster, training, arrays.take(np.arange(100)))
    t0 = time.perf_counter()
    predict_many(model, cluster, training, arrays)
    return n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "validation")
    ap.add_argument("--csv", type=Path, action="append", default=[], help="extra CSV files (held-out runs)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    paths = sorted(args.data_dir.glob("*.csv")) + list(args.csv)
    loaded = published.load(paths)
    rows = []
    for case in loaded.cases:
        try:
            pred, mem, fits = score_case(case)
        except ValueError as exc:
            loaded.skipped.append(published.Skipped(case_id=case.case_id, reason=str(exc)))
            continue
        rows.append({"case": case.case_id, "group": case.group, "measured_s": case.measured_time_s,
                     "predicted_s": pred, "memory_gib": mem, "fits": fits, "expect_oom": case.expect_oom,
                     "plan": case.plans[0].grid_string() if len(case.plans) == 1 else f"best of {len(case.plans)}"})
    timed = [r for r in rows if r["measured_s"]]
    if not timed and not any(r["expect_oom"] for r in rows):
        print("no usable rows: " + "; ".join(f"{s.case_id}: {s.reason}" for s in loaded.skipped[:10]), file=sys.stderr)
        return 1
    ape = np.array([abs(r["predicted_s"] - r["measured_s"]) / r["measured_s"] for r in timed] or [np.nan])
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in timed:
        groups[r["group"]].append(r)
    group_stats = []
    for name, items in sorted(groups.items()):
        if len(items) < 3:
            continue
        meas = np.array([r["measured_s"] for r in items])
        pred = np.array([r["predicted_s"] for r in items])
        rho = float(spearmanr(pred, meas).statistic)
        best = int(np.argmin(meas))
        rank_of_best = int((pred < pred[best]).sum()) + 1
        group_stats.append({"group": name, "runs": len(items), "spearman": rho,
                            "measured_best_predicted_rank": rank_of_best,
                            "mape": float(np.mean(np.abs(pred - meas) / meas)),
                            "worst_over_best": float(meas.max() / meas.min())})
    oom = [r for r in rows if r["expect_oom"]]
    oom_correct = sum(1 for r in oom if not r["fits"])
    false_oom = sum(1 for r in timed if not r["fits"])
    pps = plans_per_second()
    report = {
        "rows_used": len(timed), "rows_skipped": len(loaded.skipped), "mape": float(ape.mean()),
        "median_ape": float(np.median(ape)), "p90_ape": float(np.quantile(ape, 0.9)),
        "groups": group_stats, "oom_rows": len(oom), "oom_predicted": oom_correct,
        "measured_runs_predicted_oom": false_oom, "plans_per_second": pps,
        "skipped": [{"case": s.case_id, "reason": s.reason} for s in loaded.skipped],
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    if args.verbose:
        for r in sorted(rows, key=lambda r: r["case"]):
            if r["measured_s"]:
                err = (r["predicted_s"] - r["measured_s"]) / r["measured_s"]
                print(f"{r['case']:<24} {r['group'][:48]:<48} meas {r['measured_s']:9.3f}s pred {r['predicted_s']:9.3f}s "
                      f"{err:+6.1%} mem {r['memory_gib']:5.1f} {r['plan']}")
    print(f"rows used: {len(timed)}  skipped: {len(loaded.skipped)}")
    print(f"iteration-time MAPE: {report['mape']:.1%}  (median {report['median_ape']:.1%}, p90 {report['p90_ape']:.1%})")
    print("ranking groups (>= 3 runs):")
    for g in group_stats:
        print(f"  {g['group'][:70]:<70} n={g['runs']:3d} spearman={g['spearman']:+.3f} "
              f"best@{g['measured_best_predicted_rank']} mape={g['mape']:.1%} spread={g['worst_over_best']:.2f}x")
    if oom:
        print(f"OOM rows: {len(oom)}, predicted OOM: {oom_correct}")
    print(f"measured (ran) rows the memory model calls OOM: {false_oom}")
    print(f"vectorized evaluator: {pps:,.0f} plans/s")
    if args.verbose:
        for s in loaded.skipped:
            print(f"skipped {s.case_id}: {s.reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
