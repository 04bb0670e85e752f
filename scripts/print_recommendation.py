"""Print the essentials of a /v1/recommend answer read from stdin (used by quickstart.sh)."""

import json
import sys

answer = json.load(sys.stdin)
best = answer["best"]
plan = {k: v for k, v in best["plan"].items() if v is not None}
pred = best["prediction"]
print("best plan:", plan)
print(f"iteration {pred['iteration_time_s']:.2f} s, MFU {pred['mfu']:.1%}, "
      f"{pred['memory']['per_gpu_gib']:.1f} GiB per GPU, constants: {pred['constants_source']}")
print(f"evaluated {answer['num_evaluated']:,} plans; why: {answer['explanation']}")
for reason, count in sorted(answer["pruned"].items(), key=lambda kv: -kv[1]):
    print(f"  rejected {count:>10,}: {reason}")
