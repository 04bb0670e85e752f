"""How fast is the layout search, against a baseline commit, and is its answer the exhaustive one?

    .venv/bin/python bench/search_speed.py [--baseline 7d17dd7] [--rounds 5] [--no-exhaustive] [--pairs 21]

For each case (GPT-3 175B on 1,024 and 16,384 Selene GPUs, Llama-3 405B on 16,384 Eos GPUs, and the
mixture of experts DeepSeek-V3 on 16,384 Eos GPUs):

- in-process wall time of `tuner.recommend` (top 10), median over `--rounds` rounds; each round runs
  the baseline commit and this tree one after the other (alternately, on the same machine), each in
  a fresh interpreter that warms up with one search and times the median of three;
- the speed-up (baseline / this tree);
- whether the default search's top 10 (plans, predicted times to the last bit, merged placements and
  ZeRO stages) is the exhaustive search's (`SearchOptions(exhaustive=True)`), and how many plans each
  scored, checked, and proved out;
- the whole `gridtune recommend --json` command (process start included), median of `--rounds`;
- the MoE / dense ratio at 16,384 GPUs: of the medians above (each side timed in its own processes),
  and of the two searches alternating in one interpreter (`--pairs`), which the machine's speed
  drifting between processes does not move;
- the minor page faults per search (`tuner.allocator`).

The baseline is checked out into a temporary `git worktree` (removed at the end). Cases the
baseline cannot express (a mixture of experts before the MoE work) show "-".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = [
    ("gpt3-175b", "selene", 1024, 1536),
    ("gpt3-175b", "selene", 16384, 1536),
    ("llama3-405b", "eos", 16384, 2048),
    ("deepseek-v3", "eos", 16384, 8192),
]

TIMER = r"""
import json, resource, statistics, sys, time
sys.path.insert(0, sys.argv[1])
from perfmodels import presets
from perfmodels.specs import Training
from tuner import recommend
try:
    model = presets.model(sys.argv[2])
except Exception as exc:
    print(json.dumps({"error": str(exc)}))
    raise SystemExit(0)
cluster = presets.cluster(sys.argv[3], int(sys.argv[4]))
training = Training(global_batch_size=int(sys.argv[5]))
recommend(model, cluster, training, top_k=10)
times = []
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    t0 = time.perf_counter()
    rec = recommend(model, cluster, training, top_k=10)
    times.append(time.perf_counter() - t0)
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / 3
print(json.dumps({"s": statistics.median(times), "complete": getattr(rec, "complete", True),
                  "best_s": rec.best.prediction.iteration_time_s, "faults": faults}))
"""


PAIRED = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
from perfmodels import presets
from perfmodels.specs import Training
from tuner import recommend
runs = []
for name, cluster, gpus, batch in json.loads(sys.argv[3]):
    args = (presets.model(name), presets.cluster(cluster, gpus), Training(global_batch_size=batch))
    recommend(*args, top_k=10)
    runs.append(args)
seconds = [[], []]
for _ in range(int(sys.argv[2])):
    for k, args in enumerate(runs):
        t0 = time.perf_counter()
        recommend(*args, top_k=10)
        seconds[k].append(time.perf_counter() - t0)
print(json.dumps(seconds))
"""


def paired_ratio(tree: Path, moe: tuple, dense: tuple, pairs: int) -> tuple[float, float, float, float]:
    """(MoE median s, dense median s, ratio of the medians, median of the pairs' ratios): the two
    searches alternating in one interpreter, so that the machine's speed, which drifts between
    processes, is the same for both sides of each ratio."""
    out = subprocess.run([sys.executable, "-c", PAIRED, str(tree), str(pairs), json.dumps([moe, dense])],
                         capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if out.returncode != 0:
        raise SystemExit(f"paired timing in {tree} failed:\n{out.stderr[-2000:]}")
    m, d = json.loads(out.stdout.strip().splitlines()[-1])
    return (statistics.median(m), statistics.median(d), statistics.median(m) / statistics.median(d),
            statistics.median(a / b for a, b in zip(m, d)))


def time_tree(tree: Path, case: tuple) -> dict:
    out = subprocess.run([sys.executable, "-c", TIMER, str(tree), *map(str, case)], capture_output=True,
                         text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if out.returncode != 0:
        raise SystemExit(f"timing {case} in {tree} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def same_as_exhaustive(case: tuple) -> str:
    from perfmodels import presets
    from perfmodels.specs import Training
    from tuner import SearchOptions, recommend

    model_name, cluster_name, gpus, batch = case
    model, cluster = presets.model(model_name), presets.cluster(cluster_name, gpus)
    training = Training(global_batch_size=batch)
    bounded = recommend(model, cluster, training, top_k=10)
    t0 = time.perf_counter()
    everything = SearchOptions(exhaustive=True, time_budget_s=600)
    full = recommend(model, cluster, training, top_k=10, search=everything)
    full_s = time.perf_counter() - t0

    def rows(rec):
        return [(c.plan, c.prediction.iteration_time_s, c.equivalent_placements, c.equivalent_zero_stages)
                for c in rec.candidates]

    same = rows(bounded) == rows(full) and full.complete
    return (f"{'yes' if same else 'NO'} (scored {bounded.num_valid:,} of the exhaustive {full.num_valid:,}; "
            f"checked {bounded.num_evaluated:,}, proved out {bounded.num_proved_slower:,}; exhaustive "
            f"{full_s:.1f} s)")


def cli_seconds(case: tuple, rounds: int) -> float:
    gridtune = str(Path(sys.executable).with_name("gridtune"))
    model_name, cluster_name, gpus, batch = case
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        command = [gridtune, "recommend", "--model", model_name, "--cluster", cluster_name, "--gpus",
                   str(gpus), "--global-batch-size", str(batch), "--json"]
        out = subprocess.run(command, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        if out.returncode != 0:
            raise SystemExit(out.stderr)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="7d17dd7", help="git ref to compare with (default 7d17dd7)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-exhaustive", action="store_true", help="skip the exhaustive comparison (slow)")
    ap.add_argument("--pairs", type=int, default=21,
                    help="MoE / dense pairs timed alternating in one interpreter (default 21)")
    args = ap.parse_args(argv)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="gridtune-baseline-") as tmp:
        base = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.baseline],
                       check=True, capture_output=True)
        try:
            samples: dict[tuple, dict[str, list]] = {case: {"base": [], "this": []} for case in CASES}
            for _ in range(args.rounds):
                for case in CASES:
                    for which, tree in (("base", base), ("this", ROOT)):
                        samples[case][which].append(time_tree(tree, case))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                           capture_output=True)
    print(f"baseline {args.baseline}, this tree {head}; in-process medians over {args.rounds} alternating "
          "rounds")
    print(f"{'case':<28} {'baseline s':>11} {'this s':>9} {'speed-up':>9} {'CLI --json s':>13}  "
          "same top 10 as exhaustive")
    this_s = {}
    for case in CASES:
        base_runs = [r for r in samples[case]["base"] if "s" in r]
        this = statistics.median(r["s"] for r in samples[case]["this"])
        this_s[case] = this
        base = statistics.median(r["s"] for r in base_runs) if base_runs else None
        ratio = f"{base / this:>8.1f}x" if base else f"{'-':>9}"
        label = f"{case[0]} @{case[2]:,}"
        same = "-" if args.no_exhaustive else same_as_exhaustive(case)
        print(f"{label:<28} {base if base else float('nan'):>11.3f} {this:>9.3f} {ratio} "
              f"{cli_seconds(case, args.rounds):>13.3f}  {same}")
    moe, dense = this_s[CASES[3]], this_s[CASES[1]]
    per_round = [m["s"] / d["s"] for m, d in zip(samples[CASES[3]]["this"], samples[CASES[1]]["this"])]
    print(f"DeepSeek-V3 / GPT-3 175B at 16,384 GPUs (this tree): {moe / dense:.2f}x of the medians, "
          f"{statistics.median(per_round):.2f}x the median of each round's ratio")
    m_s, d_s, of_medians, of_pairs = paired_ratio(ROOT, CASES[3], CASES[1], args.pairs)
    print(f"  the two alternating in one interpreter, {args.pairs} pairs: DeepSeek-V3 {m_s:.3f} s, "
          f"GPT-3 175B {d_s:.3f} s, {of_medians:.2f}x of the medians, {of_pairs:.2f}x the median of the "
          "pairs' ratios")
    for case in CASES:
        faults = {w: statistics.median(r.get("faults", float("nan")) for r in samples[case][w])
                  for w in ("base", "this") if any("s" in r for r in samples[case][w])}
        print(f"page faults per search, {case[0]} @{case[2]:,}: "
              + ", ".join(f"{w} {v:,.0f}" for w, v in faults.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
