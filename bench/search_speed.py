"""How fast is the full layout search? Prints the README's search-speed figures.

    .venv/bin/python bench/search_speed.py [--repeats 3]

For GPT-3 175B on 64, 1,024, 16,384 and 65,536 GPUs (Selene) and Llama-3 405B on 16,384 (Eos):
median in-process wall time of `tuner.recommend` over the whole space, plans evaluated, and the
wall time of the whole `gridtune recommend --json` command (process start included).
Targets: 16,384 GPUs under 1 s in-process and under 2 s for the command; 65,536 under 5 s.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perfmodels import presets  # noqa: E402
from perfmodels.specs import Training  # noqa: E402
from tuner import recommend  # noqa: E402

CASES = [
    ("gpt3-175b", "selene", 64, 1536),
    ("gpt3-175b", "selene", 1024, 1536),
    ("gpt3-175b", "selene", 16384, 1536),
    ("gpt3-175b", "selene", 65536, 1536),
    ("llama3-405b", "eos", 16384, 2048),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    recommend(
        presets.model("gpt2-small"), presets.cluster("selene", 8), Training(global_batch_size=64)
    )  # warm
    gridtune = str(Path(sys.executable).with_name("gridtune"))
    print(f"{'model':<12} {'GPUs':>6} {'plans evaluated':>16} {'valid':>10} {'in-process s':>13} "
          f"{'CLI --json s':>13} {'plans/s':>12}  best")
    for model_name, cluster_name, gpus, batch in CASES:
        model, cluster = presets.model(model_name), presets.cluster(cluster_name, gpus)
        training = Training(global_batch_size=batch)
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            rec = recommend(model, cluster, training, top_k=10)
            times.append(time.perf_counter() - t0)
        cli = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = subprocess.run([gridtune, "recommend", "--model", model_name, "--cluster", cluster_name,
                                  "--gpus", str(gpus), "--global-batch-size", str(batch), "--json"],
                                 capture_output=True, text=True)
            cli.append(time.perf_counter() - t0)
            if out.returncode != 0:
                raise SystemExit(out.stderr)
        med = statistics.median(times)
        b = rec.best.plan
        print(f"{model_name:<12} {gpus:>6} {rec.num_evaluated:>16,} {rec.num_valid:>10,} {med:>13.3f} "
              f"{statistics.median(cli):>13.3f} {rec.num_evaluated / med:>12,.0f}  "
              f"{b.G_data}x{b.G_inter}x{b.G_intra_d}x{b.G_intra_r}x{b.G_intra_c} mb{b.micro_batch_size} "
              f"{rec.best.prediction.iteration_time_s:.2f}s/step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
