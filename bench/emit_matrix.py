"""Every launch emitter over every preset model x three cluster sizes x each stack it launches:
rank the layouts for that stack, emit the best plan's launch, and check that
1. the frameworks' own code accepts it (bench/framework_checks.py: megatron-core, DeepSpeed,
   torchtitan, PyTorch FSDP, the engine, and Megatron-LM's arguments.py rule table);
2. the layout the launch states (read back from the emitted text/config) is the plan ranked best;
3. `perfmodels.predict` on that plan fits in the GPU's memory and matches the ranked prediction.
A (model, size, stack) where no layout fits is counted apart (nothing is emitted for it).

Run: `PYTHONPATH=. .venv/bin/python bench/emit_matrix.py [--sizes 16,128,1024] [--cluster eos]`
(needs the frameworks extra: pip install -e '.[frameworks]'). Prints one line per failure and the
pass counts per emitter; exits 1 when any launch fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import framework_checks as fc

from perfmodels import presets
from perfmodels.specs import Training
from perfmodels.steptime import predict
from tuner.launch import TARGETS, launch_for
from tuner.launch.common import layout_of
from tuner.search import recommend

ISSUE_CASES = (  # issue 24's five cases, as a new user types them (plus the emitter each case named)
    "--model llama3-70b --cluster eos --gpus 256 --global-batch-size 512 --stack megatron-core "
    "--emit megatron",
    "--model llama3-405b --cluster eos --gpus 1024 --global-batch-size 1024 --emit megatron",
    "--model-file {long8b} --cluster eos --gpus 64 --global-batch-size 64 --emit megatron",
    "--model gpt3-175b --cluster selene --gpus 1024 --global-batch-size 1536 --emit megatron",
    "--model llama3-70b --cluster eos --gpus 256 --global-batch-size 512 --stack nemo --dtype fp8 "
    "--emit megatron",
    "--model llama3-70b --cluster eos --gpus 256 --global-batch-size 512 --stack nemo --dtype fp8 "
    "--emit nemo",
    "--model gpt3-175b --cluster selene --gpus 1024 --global-batch-size 1536 --emit deepspeed",
    "--model llama3-70b --cluster eos --gpus 256 --global-batch-size 512 --emit torchtitan",
    "--model llama3-8b --cluster eos --gpus 64 --global-batch-size 256 --emit fsdp",
)


def issue_cases(tmp: Path) -> int:
    """Run each case through `gridtune recommend --json` and check the launch it carries (the text
    --emit prints) against the best plan it shows and the frameworks; print the layout and verdict."""
    import contextlib
    import io
    import json
    import shlex

    from cli import build_parser
    from cli import main as cli_main
    from cli.common import cluster_from_args, model_from_args, training_from_args
    from perfmodels.io import plan_from_dict
    from tuner.launch import Launch, stack_for_emit

    long8b = tmp / "llama3-8b-128k.json"
    long8b.write_text(json.dumps({"preset": "llama3-8b", "seq_length": 131072}))
    failed = 0
    print("\nissue 24 cases (gridtune recommend ... --json; the launch is the text --emit prints):")
    for case in ISSUE_CASES:
        argv = ["recommend", *shlex.split(case.format(long8b=long8b)), "--json", "--top", "1"]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli_main(argv)
        kind = argv[argv.index("--emit") + 1]
        if rc != 0:
            failed += 1
            print(f"  FAIL rc={rc} {case}: {err.getvalue().strip()[-300:]}")
            continue
        rec = json.loads(out.getvalue())
        launch_dict = rec["launch"][kind]
        plan = plan_from_dict(rec["best"]["plan"])
        # the specs the CLI ranked with, from the same arguments
        args = build_parser().parse_args(argv)
        if args.stack is None:
            args.stack = stack_for_emit(kind)
        model, cluster, training = model_from_args(args), cluster_from_args(args), training_from_args(args)
        launch = Launch(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in launch_dict.items()})
        problems = fc.check(kind, launch, model, cluster, training, plan) if launch.text else ["no launch"]
        world = layout_of(model, training, plan, uneven=False).world
        said = fc.emitted_layout(kind, launch, world) if launch.text else {}
        if said != fc.plan_layout(plan, training.global_batch_size):
            problems.append(f"emitted layout {said} is not the best plan's")
        pred = predict(model, cluster, training, plan)
        if pred.memory.per_gpu_gib > cluster.gpu.memory_gib:
            problems.append(f"predict: {pred.memory.per_gpu_gib:.1f} GiB does not fit")
        failed += bool(problems)
        verdict = "passes" if not problems else "FAILS: " + "; ".join(problems)
        print(
            f"  gridtune recommend {case.format(long8b='llama3-8b-128k.json')}\n"
            f"    best {plan.grid_string()} mb={plan.micro_batch_size} {plan.schedule} "
            f"v{plan.virtual_stages} "
            f"recompute={plan.recompute} zero={plan.zero_stage} sp={plan.sequence_parallel}; predict "
            f"{pred.memory.per_gpu_gib:.1f} of {cluster.gpu.memory_gib:g} GiB; {kind} launch {verdict}"
        )
    return failed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cluster", default="eos")
    p.add_argument("--sizes", default="16,128,1024", help="GPU counts")
    p.add_argument("--models", default="", help="comma-separated presets (default: all)")
    p.add_argument("--budget", type=float, default=30.0, help="search time budget per case (s)")
    p.add_argument("--dtype", default="bf16", choices=["fp32", "bf16", "fp16", "fp8"])
    p.add_argument("--no-cases", action="store_true", help="skip the issue's five cases")
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m] or presets.model_names()
    sizes = [int(x) for x in args.sizes.split(",")]
    from tuner.types import SearchOptions

    passed, total, no_plan, missing = Counter(), Counter(), Counter(), {}
    covered: Counter[str] = Counter()  # what the checked launches exercised
    failures: list[str] = []
    t0 = time.perf_counter()
    for kind in TARGETS:
        reason = fc.missing(kind)
        if reason:
            missing[kind] = reason
    for name in models:
        model = presets.model(name)
        for gpus in sizes:
            cluster = presets.cluster(args.cluster, gpus)
            gb = max(256, 2 * gpus)
            stacks = sorted({s for t in TARGETS.values() for s in t.stacks})
            for stack in stacks:
                training = Training(global_batch_size=gb, stack=stack, dtype=args.dtype)
                rec = recommend(
                    model, cluster, training, top_k=1, search=SearchOptions(time_budget_s=args.budget)
                )
                kinds = [k for k, t in TARGETS.items() if stack in t.stacks and k not in missing]
                if rec.best is None:
                    for kind in kinds:
                        no_plan[kind] += 1
                    continue
                plan = rec.best.plan
                pred = predict(model, cluster, training, plan)
                for kind in kinds:
                    total[kind] += 1
                    where = f"{kind:10s} {stack:18s} {name:12s} {gpus:5d} GPUs {plan.grid_string()}"
                    try:
                        launch = launch_for(kind, model, cluster, training, plan)
                    except ValueError as exc:
                        failures.append(f"{where}: not emitted: {exc}")
                        continue
                    problems = fc.check(kind, launch, model, cluster, training, plan)
                    world = layout_of(model, training, plan, uneven=False).world
                    said, ranked = fc.emitted_layout(kind, launch, world), fc.plan_layout(plan, gb)
                    if said != ranked:
                        diff = {k: (said[k], ranked[k]) for k in ranked if said.get(k) != ranked[k]}
                        problems.append(
                            f"emitted layout differs from the ranked best (emitted, ranked): {diff}"
                        )
                    if pred.memory.per_gpu_gib > cluster.gpu.memory_gib:
                        problems.append(
                            f"predict says {pred.memory.per_gpu_gib:.1f} GiB > {cluster.gpu.memory_gib:g}"
                        )
                    if (
                        abs(pred.iteration_time_s - rec.best.prediction.iteration_time_s)
                        > 1e-6 * pred.iteration_time_s
                    ):
                        problems.append("predict disagrees with the ranked prediction")
                    if problems:
                        failures.append(f"{where}: " + "; ".join(problems))
                    else:
                        passed[kind] += 1
                        megatron_like = kind in ("megatron", "nemo")
                        # Megatron's first/last-stage counts only where a Megatron launcher cuts the
                        # layers (the engine and DeepSpeed split any count their own way)
                        lay = layout_of(model, training, plan, uneven=megatron_like)
                        covered["pipeline"] += lay.pp > 1
                        covered["interleaved"] += lay.vpp > 1
                        covered["uneven first/last stages"] += bool(lay.uneven and megatron_like)
                        covered["custom pipeline layout"] += bool(lay.pipeline_layout and megatron_like)
                        covered["tensor parallel"] += lay.tp > 1
                        covered["sequence parallel"] += bool(plan.sequence_parallel)
                        covered["ZeRO-1"] += plan.zero_stage == 1
                        covered["ZeRO-2"] += plan.zero_stage == 2
                        covered["ZeRO-3 / FSDP"] += plan.zero_stage == 3
                        covered["full recompute"] += plan.recompute == "full"
                        covered["selective recompute"] += plan.recompute == "selective"
    for line in failures:
        print("FAIL", line)
    print(
        f"\nemit matrix ({args.dtype}): {len(models)} models x {len(sizes)} sizes ({args.sizes} x "
        f"{args.cluster}) x every stack each emitter launches, {time.perf_counter() - t0:.0f} s"
    )
    print(f"{'emitter':12s} {'stacks':40s} {'passed':>8s} {'launches':>9s} {'rate':>7s} {'no fit':>7s}")
    for kind, target in TARGETS.items():
        if kind in missing:
            print(f"{kind:12s} skipped: {missing[kind]}")
            continue
        n = total[kind]
        rate = f"{passed[kind] / n:.1%}" if n else "-"
        print(
            f"{kind:12s} {', '.join(target.stacks):40s} {passed[kind]:8d} {n:9d} {rate:>7s} "
            f"{no_plan[kind]:7d}"
        )
    all_n, all_p = sum(total.values()), sum(passed.values())
    print(f"{'all':12s} {'':40s} {all_p:8d} {all_n:9d} {all_p / max(all_n, 1):7.1%}")
    print("passing launches with: " + ", ".join(f"{k} {v}" for k, v in covered.items()))
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        case_failures = issue_cases(Path(tmp)) if not args.no_cases else 0
    return 0 if all_p == all_n and not case_failures else 1


if __name__ == "__main__":
    sys.exit(main())
