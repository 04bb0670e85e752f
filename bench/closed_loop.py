"""Local closed-loop figures for 2 and 4 processes (`gridtune validate`, docs/architecture.md):
not a test, prints numbers.

    .venv/bin/python bench/closed_loop.py [--nproc 2 4] [--rounds 2]

For each process count it runs `gridtune validate --json` (quick profile, every valid plan of
tiny-gpt measured with the engine, calibration from three plans) on a throw-away SQLite store and
prints Spearman, the measured-best plan's predicted rank, MAPE before/after calibration and the
wall time. Expect a few minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, nargs="+", default=[2, 4])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--model", default="tiny-gpt")
    args = p.parse_args(argv)
    from cli import main as gridtune

    print(
        f"{'nproc':>5} {'plans':>5} {'spearman':>8} {'best@':>5} {'MAPE':>7} {'holdout':>8} "
        f"{'calibrated':>10} "
        f"{'wall s':>7}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.nproc:
            out = io.StringIO()
            t0 = time.perf_counter()
            with contextlib.redirect_stdout(out):
                code = gridtune(
                    [
                        "validate",
                        "--nproc",
                        str(n),
                        "--model",
                        args.model,
                        "--rounds",
                        str(args.rounds),
                        "--json",
                        "--database",
                        f"sqlite:///{tmp}/bench.db",
                        "--cluster-id",
                        f"bench/{n}",
                    ]
                )
            if code:
                print(f"{n:>5} failed with exit code {code}")
                continue
            d = json.loads(out.getvalue())
            print(
                f"{n:>5} {len(d['plans']):>5} {d['spearman']:>8.3f} {d['measured_best_predicted_rank']:>5} "
                f"{d['mape_uncalibrated']:>7.1%} {d['mape_uncalibrated_holdout']:>8.1%} "
                f"{d['mape_calibrated']:>10.1%} "
                f"{time.perf_counter() - t0:>7.0f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
