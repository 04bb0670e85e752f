"""How well does the model predict published training runs? Prints the README's accuracy figures.

    PYTHONPATH=. .venv/bin/python bench/validate_published.py [--data-dir DIR] [--csv extra.csv ...]
        [--json] [--verbose]

Reads every CSV in `validation/data` (the vendored published runs; `--data-dir` reads another folder
instead) plus each `--csv` file. Each row is scored on the layout and stack it states; where it
leaves options empty, with the MEDIAN prediction over its candidates (the spread says how much the
unknowns matter). Figures: iteration-time MAPE overall, per source and per framework (with median and
p90), the fastest-fitting-candidate MAPE beside it (labelled: it flatters the model); per ranking
group (rows with a stated layout, same model, sequence, precision, cluster, GPU count, batch and
framework, >= 3 runs) the
Spearman of predicted vs measured times and the predicted rank of the measured best; false OOM (runs
that ran but are predicted not to fit; `--verbose` lists them), OOM rows caught, memory MAPE where a
peak was measured; skipped rows with reasons; plans/s of the vectorized evaluator. Exit 1 when no row
is usable.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perfmodels.io import json_safe  # noqa: E402
from perfmodels.plans import from_columns  # noqa: E402
from perfmodels.steptime import predict_many  # noqa: E402
from validation import loader, summary  # noqa: E402
from validation.cases import Case, Skipped  # noqa: E402
from validation.scoring import CaseScore, score_case  # noqa: E402


def plans_per_second() -> float:
    """Plans per second the vectorized evaluator scores (GPT-3 175B on 1024 Selene GPUs, 200k plans)."""
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


def _score_all(cases: list[Case], skipped: list[Skipped]) -> list[tuple[Case, CaseScore]]:
    scored = []
    for case in cases:
        try:
            scored.append((case, score_case(case)))
        except ValueError as exc:
            skipped.append(Skipped(case_id=case.case_id, reason=str(exc)))
    return scored


def _spread_stats(spreads: list[float]) -> dict:
    if not spreads:
        return {"rows": 0, "median": None, "max": None}
    return {"rows": len(spreads), "median": float(np.median(spreads)), "max": float(np.max(spreads))}


def build_report(scored: list[tuple[Case, CaseScore]], skipped: list[Skipped], pps: float) -> dict:
    timed = [(c, s) for c, s in scored if c.measured_time_s]
    median = summary.error_stats(summary.ape(c, s) for c, s in timed)
    fastest = summary.error_stats(summary.ape(c, s, fastest=True) for c, s in timed)
    mem = summary.memory_verdicts(scored)
    return {
        "rows_used": len(timed),
        "rows_skipped": len(skipped),
        "multi_candidate_rows": sum(1 for c, _ in timed if c.candidate_count > 1),
        "candidate_spread": _spread_stats([s.spread for c, s in timed if c.candidate_count > 1]),
        "iteration_time_median_candidate": asdict(median),
        "iteration_time_fastest_fitting_candidate": asdict(fastest),
        "per_source": {k: asdict(v) for k, v in summary.by_key(timed, "source").items()},
        "per_framework": {k: asdict(v) for k, v in summary.by_key(timed, "framework").items()},
        "groups": [asdict(g) for g in summary.ranking_groups(timed)],
        "false_oom": len(mem.false_oom),
        "false_oom_cases": mem.false_oom,
        "oom_rows": mem.oom_rows,
        "oom_caught": mem.oom_caught,
        "memory": asdict(mem.memory),
        "card_memory_assumed_rows": mem.assumed_card,
        "plans_per_second": pps,
        "skipped": [{"case": s.case_id, "reason": s.reason} for s in skipped],
        "rows": [
            {
                "case": c.case_id,
                "group": c.group,
                "framework": c.framework,
                "measured_s": c.measured_time_s,
                "predicted_median_s": s.median_time_s,
                "spread": s.spread,
                "predicted_fastest_fitting_s": s.fastest_fitting_time_s,
                "memory_gib": s.memory_gib,
                "capacity_gib": s.capacity_gib,
                "measured_memory_gib": c.measured_memory_gib,
                "fits": s.fits,
                "candidates": s.candidates,
                "unknown": list(c.unknown),
                "card_memory_note": c.card_memory.assumed,
            }
            for c, s in scored
        ],
    }




def _stats_line(label: str, st: dict) -> str:
    return f"{label}: {st['mape']:.1%} (median {st['median']:.1%}, p90 {st['p90']:.1%}, n={st['rows']})"


def print_report(report: dict, *, verbose: bool) -> None:
    if verbose:
        for r in sorted(report["rows"], key=lambda r: r["case"]):
            if r["measured_s"]:
                err = (r["predicted_median_s"] - r["measured_s"]) / r["measured_s"]
                print(f"{r['case']:<24} {r['group'][:52]:<52} meas {r['measured_s']:9.3f}s "
                      f"pred {r['predicted_median_s']:9.3f}s {err:+6.1%} spread {r['spread']:4.2f}x "
                      f"n={r['candidates']:<5d} mem {r['memory_gib']:5.1f}/{r['capacity_gib']:.0f} GiB"
                      + (f" unknown: {','.join(r['unknown'])}" if r["unknown"] else ""))
    print(f"rows used: {report['rows_used']}  skipped: {report['rows_skipped']}  "
          f"(with unknown options, scored as the median over candidates: {report['multi_candidate_rows']})")
    print(_stats_line("iteration-time MAPE (median candidate)", report["iteration_time_median_candidate"]))
    print(_stats_line("  for comparison, fastest fitting candidate (flatters the model)",
                      report["iteration_time_fastest_fitting_candidate"]))
    spread = report["candidate_spread"]
    if spread["rows"]:
        print(f"  spread of the candidates (slowest / fastest) on rows with unknown options: median "
              f"{spread['median']:.2f}x, max {spread['max']:.2f}x")
    print("per source:")
    for name, st in report["per_source"].items():
        print("  " + _stats_line(name[:90], st))
    print("per framework:")
    for name, st in report["per_framework"].items():
        print("  " + _stats_line(name, st))
    print("ranking groups (stated layouts, >= 3 runs):")
    for g in report["groups"]:
        print(
            f"  {g['group'][:70]:<70} n={g['runs']:3d} spearman={g['spearman']:+.3f} "
            f"best@{g['measured_best_predicted_rank']} mape={g['mape']:.1%} "
            f"spread={g['worst_over_best']:.2f}x"
        )
    print(f"false OOM (ran, predicted not to fit): {report['false_oom']}")
    if verbose:
        for cid in report["false_oom_cases"]:
            print(f"  false OOM: {cid}")
    print(f"OOM rows: {report['oom_rows']}, caught: {report['oom_caught']}")
    mem = report["memory"]
    if mem["rows"]:
        print(_stats_line("memory MAPE (measured peak_memory_gib)", mem))
    else:
        print("memory MAPE: no row states peak_memory_gib")
    if report["card_memory_assumed_rows"]:
        print(
            f"card memory not stated on {report['card_memory_assumed_rows']} rows: their fit verdict uses "
            "the "
            f"largest card of the GPU family"
        )
    print(f"vectorized evaluator: {report['plans_per_second']:,.0f} plans/s")
    for s in report["skipped"]:
        print(f"skipped {s['case']}: {s['reason']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, default=loader.DATA_DIR,
                    help="folder whose *.csv files are read (default: the vendored validation/data)")
    ap.add_argument("--csv", type=Path, action="append", default=[], help="extra CSV files (held-out runs)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--verbose", action="store_true", help="every row, and the false-OOM runs")
    args = ap.parse_args(argv)
    missing = [p for p in args.csv if not p.is_file()]
    if missing:
        print(f"--csv {missing[0]}: no such file", file=sys.stderr)
        return 1
    loaded = loader.load(loader.default_paths(args.data_dir) + list(args.csv))
    scored = _score_all(loaded.cases, loaded.skipped)
    if not any(c.measured_time_s or c.expect_oom for c, _ in scored):
        reasons = "; ".join(f"{s.case_id}: {s.reason}" for s in loaded.skipped[:10])
        print(f"no usable rows in --data-dir {args.data_dir} or --csv {[str(p) for p in args.csv]}"
              + (f" ({reasons})" if reasons else " (no CSV files found)"), file=sys.stderr)
        return 1
    report = build_report(scored, loaded.skipped, plans_per_second())
    if args.json:
        print(json.dumps(json_safe(report), indent=2, allow_nan=False))
    else:
        print_report(report, verbose=args.verbose)
    return 0


if __name__ == "__main__":
    sys.exit(main())
