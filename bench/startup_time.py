"""How long do whole `gridtune` commands take, process start and imports included? (issue 25)

    .venv/bin/python bench/startup_time.py [--repeats 5] [--baseline 7dfcb6b]

Times each command as a subprocess, `python -m cli ...` (the `gridtune` console script runs the same
`cli.main`) with PYTHONPATH and the working directory set to the tree measured, and prints the median
wall time over --repeats runs: `--version`, `--help`, `recommend --help`, `presets`,
`python -c "import tuner"`, and `recommend --json` for GPT-3 175B on Selene at 1,024 and 16,384 GPUs
(global batch 1536). One untimed run of each command comes first (bytecode compiled, files cached).

With `--baseline REF` (a git ref) it also checks REF out in a temporary `git worktree`, times the
same commands there the same way, alternating baseline and current runs so that both see the same
load, prints both medians and the speed-up (baseline / current), and says whether the two
`recommend --json` answers name the same best plan. The temporary worktree is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPT3 = ["--model", "gpt3-175b", "--cluster", "selene", "--global-batch-size", "1536", "--json"]
PY = [sys.executable]
CLI = [sys.executable, "-m", "cli"]
# (label, argv)
COMMANDS: list[tuple[str, list[str]]] = [
    ("gridtune --version", [*CLI, "--version"]),
    ("gridtune --help", [*CLI, "--help"]),
    ("gridtune recommend --help", [*CLI, "recommend", "--help"]),
    ("gridtune presets", [*CLI, "presets"]),
    ('python -c "import tuner"', [*PY, "-c", "import tuner"]),
    ("gridtune recommend --json, 1,024 GPUs", [*CLI, "recommend", *GPT3, "--gpus", "1024"]),
    ("gridtune recommend --json, 16,384 GPUs", [*CLI, "recommend", *GPT3, "--gpus", "16384"]),
]


def run_once(argv: list[str], tree: Path) -> tuple[float, str]:
    """Wall seconds of one run of `argv` in `tree`, and its stdout; exits on a failed command."""
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "120"}
    t0 = time.perf_counter()
    out = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if out.returncode != 0:
        sys.exit(f"startup_time: {' '.join(argv[1:])} failed in {tree} (exit {out.returncode}):\n"
                 f"{out.stderr[-2000:]}")
    return seconds, out.stdout


def best_plan(stdout: str) -> object:
    """The best plan of a `recommend --json` answer (None for other commands)."""
    try:
        return json.loads(stdout.strip().splitlines()[-1])["best"]["plan"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def measure(trees: dict[str, Path], repeats: int) -> dict[str, dict[str, list[float]]]:
    """{label: {tree name: [seconds, ...]}}, the trees alternating within each repeat."""
    times: dict[str, dict[str, list[float]]] = {}
    for label, argv in COMMANDS:
        plans = {}
        for name, tree in trees.items():  # warm-up: compiles the tree's bytecode, caches its files
            plans[name] = best_plan(run_once(argv, tree)[1])
        if len(trees) > 1 and "--json" in argv:
            same = len({json.dumps(p, sort_keys=True) for p in plans.values()}) == 1
            print(f"  {label}: {'same best plan' if same else 'DIFFERENT best plans'} in "
                  f"{' and '.join(trees)}", file=sys.stderr)
        times[label] = {name: [] for name in trees}
        for _ in range(repeats):
            for name, tree in trees.items():
                times[label][name].append(run_once(argv, tree)[0])
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5, help="timed runs of each command per tree (default 5)")
    ap.add_argument("--baseline", metavar="REF", help="also time the tree at this git ref, e.g. 7dfcb6b")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    current = f"current ({head}{', uncommitted changes' if dirty else ''})"
    print(f"python {sys.version.split()[0]} ({sys.executable}); {os.cpu_count()} CPUs; "
          f"load average {os.getloadavg()[0]:.2f}; median of {args.repeats} runs")
    if not args.baseline:
        times = measure({current: ROOT}, args.repeats)
        print(f"{'command':<42} {'median s':>9} {'min s':>8}")
        for label, by_tree in times.items():
            t = by_tree[current]
            print(f"{label:<42} {statistics.median(t):>9.3f} {min(t):>8.3f}")
        return 0
    sha = subprocess.run(["git", "rev-parse", "--verify", "--short", f"{args.baseline}^{{commit}}"], cwd=ROOT,
                         capture_output=True, text=True)
    if sha.returncode != 0:
        ap.error(f"--baseline: {args.baseline!r} is not a commit here: {sha.stderr.strip()}")
    tmp = Path(tempfile.mkdtemp(prefix="gridtune-baseline-"))
    tree = tmp / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(tree), args.baseline], cwd=ROOT,
                   check=True)
    try:
        baseline = f"baseline ({sha.stdout.strip()})"
        times = measure({baseline: tree, current: ROOT}, args.repeats)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'command':<42} {'baseline s':>11} {'current s':>10} {'speed-up':>9}")
    for label, by_tree in times.items():
        b, c = statistics.median(by_tree[baseline]), statistics.median(by_tree[current])
        print(f"{label:<42} {b:>11.3f} {c:>10.3f} {b / c:>8.2f}x")
    print(f"baseline = {args.baseline} ({sha.stdout.strip()}), current = {head}"
          f"{' with uncommitted changes' if dirty else ''}; medians in seconds, "
          "speed-up = baseline / current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
