"""How well do fitted profiles predict? Synthetic recovery and gloo hold-out error on this machine.

    OMP_NUM_THREADS=1 .venv/bin/python bench/profile_accuracy.py [--repeats 3] [--nproc 2 4] [--full]

Prints (1) the worst relative error of alpha and busbw recovered from synthetic sweeps with known
constants and 1% noise, for every collective and group sizes 2/4/8; (2) for each --nproc, a real
`gridtune profile --quick` sweep on forked gloo ranks: the hold-out median relative error per
collective and group size (fit on all sizes but every third, predict those), the overall median,
and the fitted reduce-scatter / all-reduce busbw ratio (about 0.5 on gloo, whose reduce-scatter is
an all-reduce plus a slice). Timings on a shared 2-core machine vary between runs; --repeats shows
the spread.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from perfmodels import fitting


def synthetic_recovery() -> tuple[float, float]:
    sizes = fitting.message_sizes(4096, 64 << 20)
    worst_a = worst_b = 0.0
    for op in fitting.OPS:
        for p in (2, 4, 8):
            rows = fitting.synthetic_rows(op, p, 25.0, 80.0, sizes, trials=7, noise=0.01, seed=p)
            fit = fitting.fit_collectives(rows)[0].iloc[0]
            worst_a = max(worst_a, abs(fit["alpha_us"] / 25.0 - 1))
            worst_b = max(worst_b, abs(fit["busbw_GBps"] / 80.0 - 1))
    return worst_a, worst_b


def gloo_holdout(nproc: int, quick: bool) -> tuple[pd.DataFrame, float, float, float]:
    from engine.microbench import SweepConfig, run_forked

    cfg = SweepConfig.make(quick=quick, progress=False)
    t0 = time.perf_counter()
    out = run_forked(nproc, cfg, backend="gloo")
    elapsed = time.perf_counter() - t0
    rows = pd.DataFrame(out["rows"])
    fits, holdout = fitting.fit_collectives(rows)
    per = holdout.groupby(["op", "group_size"]).rel_error.median().unstack("group_size")
    f = fits.set_index(["op", "group_size"])
    ratio = float(
        np.median(
            [
                f.loc[("reduce_scatter", p), "busbw_GBps"] / f.loc[("all_reduce", p), "busbw_GBps"]
                for p in sorted(set(fits["group_size"]))
            ]
        )
    )
    return per, fitting.overall_holdout_error(holdout), ratio, elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--nproc", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--full", action="store_true", help="the full sweep instead of --quick")
    args = ap.parse_args()
    a, b = synthetic_recovery()
    print(
        f"synthetic recovery (1% noise, 6 ops x p in 2/4/8): worst alpha error {a:.2%}, worst busbw error "
        f"{b:.2%}"
    )
    pd.set_option("display.width", 160)
    for nproc in args.nproc:
        overall = []
        for rep in range(args.repeats):
            per, err, ratio, elapsed = gloo_holdout(nproc, quick=not args.full)
            overall.append(err)
            print(f"\n{nproc} gloo ranks, run {rep + 1}: hold-out median error {err:.1%} "
                  f"(reduce_scatter/all_reduce busbw {ratio:.2f}; sweep {elapsed:.1f} s)")
            print(per.map(lambda v: f"{v:.1%}").to_string())
        if args.repeats > 1:
            print(f"{nproc} ranks over {args.repeats} runs: median {np.median(overall):.1%}, "
                  f"min {min(overall):.1%}, max {max(overall):.1%}")


if __name__ == "__main__":
    main()
