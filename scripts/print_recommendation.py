"""Print the essentials of a /v1/recommend answer read from stdin (used by quickstart.sh).

    curl -s -X POST http://127.0.0.1:8000/v1/recommend -d @question.json |
        python scripts/print_recommendation.py
"""

import json
import sys

answer = json.load(sys.stdin)
best = answer["best"]
if best is None:
    print("no layout fits:", answer.get("explanation", ""))
    sys.exit(1)
plan = {k: v for k, v in best["plan"].items() if v is not None}
pred = best["prediction"]
if not answer.get("complete", True):
    print(
        f"PARTIAL search: {answer.get('num_not_evaluated', 0):,} plans were not evaluated in the time budget"
    )
print("best plan:", plan)
print(f"iteration {pred['iteration_time_s']:.2f} s, MFU {pred['mfu']:.1%}, "
      f"{pred['memory']['per_gpu_gib']:.1f} GiB per GPU, constants: {pred['constants_source']}")
print(f"evaluated {answer['num_evaluated']:,} plans; why: {answer['explanation']}")
for reason, count in sorted(answer["pruned"].items(), key=lambda kv: -kv[1]):
    print(f"  rejected {count:>10,}: {reason}")
# `launch` holds the best plan's launch for every framework that runs the stack it was ranked for
for kind, launch in answer.get("launch", {}).items():
    if not launch.get("text"):
        continue
    print(f"launch with {kind} ({launch.get('stack', '')} stack):")
    print("  " + launch["text"].replace("\n", "\n  "))
    for note in launch.get("notes", []):
        print(f"  note: {note}")
