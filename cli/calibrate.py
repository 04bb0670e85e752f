"""`gridtune calibrate`: fit the constants of your stack on your cluster to runs you measured.

    gridtune calibrate --runs runs.csv --cluster selene --stack megatron-core --name my-selene
    gridtune calibrate --runs runs.jsonl --log train.log --cluster selene --out my-selene.json
    gridtune predict ... --profile my-selene          # or --profile my-selene.json

`--runs FILE`: a CSV in the format of `validation/data` (the columns the validation loader reads:
model shape, GPUs, layout, stack, `metric_name`/`metric_value`, optional `peak_memory_gib`), or JSON
lines of the objects `POST /v1/calibrations` takes: `{"model", "training", "plan",
"iteration_time_s", "peak_memory_gib"?}`. `--log FILE`: a training log of Megatron-LM / NeMo,
torchtitan or DeepSpeed (`tuner.logs` reads the configuration and the step times from it).

Prints every fitted parameter (value, prior, whether the runs identified it), each run's measured
time beside the prediction before and after, and the leave-one-out error, which becomes the band
later predictions claim. Stores the result in the service store under `--name` (default
calibration-STACK-GPU; `$GRIDTUNE_DATABASE_URL` or `--database-url`), or writes it to `--out`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from cli.common import HelpFormatter, cluster_from_args
from perfmodels.calibration import Run, calibrate_runs
from perfmodels.constants import BY_NAME
from perfmodels.specs import Cluster
from perfmodels.stacks import STACK_PRESETS
from tuner.closed_loop.runs import (
    calibration_document,
    default_name,
    read_jsonl,
    run_from_dict,
    sized_cluster,
)


def register(sub: argparse._SubParsersAction) -> None:
    from perfmodels import presets

    p = sub.add_parser("calibrate", help="fit your stack's constants on your cluster to measured runs",
                       description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--runs", type=Path, action="append", default=[], metavar="FILE",
                   help="measured runs: a CSV of the validation/data format, or JSON lines of run objects")
    p.add_argument("--log", type=Path, action="append", default=[], metavar="FILE",
                   help="a training log (Megatron-LM/NeMo, torchtitan, DeepSpeed)")
    p.add_argument("--log-config", type=Path, metavar="FILE.toml",
                   help="the torchtitan job TOML of the --log files (what their lines do not state)")
    p.add_argument("--model", metavar="PRESET", help="the model of --log files that do not describe it "
                   "(DeepSpeed runs the user's own module)")
    p.add_argument("--model-file", type=Path, metavar="FILE.json", help="the same as a JSON model object")
    p.add_argument("--global-batch-size", type=int, help="the batch of --log files that do not state it")
    g = p.add_argument_group("cluster (a CSV's own hardware columns when none is given)")
    g.add_argument("--cluster", metavar="PRESET",
                   help=f"cluster preset: {', '.join(presets.cluster_names())}")
    g.add_argument("--cluster-file", type=Path, metavar="FILE.json",
                   help="JSON file with the cluster's fields")
    g.add_argument("--gpus", type=int, help="GPUs of the cluster (each run may use part of it)")
    g.add_argument("--gpus-per-node", type=int)
    g.add_argument("--gpu", metavar="NAME", help="GPU preset")
    g.add_argument("--intra-node-bandwidth", type=float, metavar="GBPS")
    g.add_argument("--inter-node-bandwidth", type=float, metavar="GBPS")
    g.add_argument("--profile", type=Path, metavar="NAME|FILE.json",
                   help="a microbenchmark profile of the cluster to calibrate on top of")
    p.add_argument("--stack", choices=sorted(STACK_PRESETS),
                   help="the training stack of runs that do not name one (a CSV row's stack columns, a "
                   "JSON run's training.stack, a log's framework otherwise)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--name",
                     help="store under this name in the service store (default: calibration-STACK-GPU)")
    out.add_argument("--out", type=Path, metavar="FILE.json",
                     help="write the calibrated profile here instead")
    p.add_argument("--database-url", default=None, help="SQLAlchemy URL (default: $GRIDTUNE_DATABASE_URL)")
    p.add_argument("--json", action="store_true", help="print the answer as one JSON object")
    p.set_defaults(handler=run)


def _given_cluster(args: argparse.Namespace) -> Cluster | None:
    if not (args.cluster or args.cluster_file or args.gpu or args.profile):
        return None
    return cluster_from_args(args)


def csv_runs(path: Path, cluster: Cluster | None, stack: str | None) -> list[Run]:
    """The timed rows of a validation-format CSV as runs; on `cluster` (sized per row) when given."""
    from validation import loader

    loaded = loader.load_file(path)
    runs = []
    for case in loaded.cases:
        if not case.measured_time_s:
            continue
        where = f"{path.name}: row {case.case_id.rsplit(':', 1)[-1]}"
        run_cluster = case.cluster
        if cluster is not None:
            if case.cluster.gpu.name != cluster.gpu.name:
                raise ValueError(f"{where}: gpu_type is {case.cluster.gpu.name!r}, the cluster has "
                                 f"{cluster.gpu.name!r}; calibrate one GPU type at a time")
            run_cluster = sized_cluster(cluster, case.cluster.num_gpus, where)
        trainings = case.trainings
        if stack:
            trainings = tuple(dict.fromkeys(dataclasses.replace(t, stack=stack) for t in trainings))
        runs.append(Run(model=case.model, cluster=run_cluster, trainings=trainings, plans=case.plans,
                        measured_s=float(case.measured_time_s), peak_memory_gib=case.measured_memory_gib))
    if not runs:
        reasons = "; ".join(f"{s.case_id}: {s.reason}" for s in loaded.skipped[:3])
        raise ValueError(f"{path}: no timed run could be read" + (f" ({reasons})" if reasons else ""))
    return runs


def _log_defaults(args: argparse.Namespace) -> dict:
    defaults: dict = {}
    if args.model and args.model_file:
        raise ValueError("give either --model or --model-file, not both")
    if args.model:
        defaults["model"] = {"preset": args.model}
    elif args.model_file:
        try:
            defaults["model"] = json.loads(args.model_file.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"--model-file {str(args.model_file)!r}: {exc}") from None
    if args.global_batch_size:
        defaults["global_batch_size"] = args.global_batch_size
    return defaults


def gather_runs(args: argparse.Namespace) -> tuple[Cluster, list[Run]]:
    """Every run of every --runs and --log file, on the given cluster (or the CSV's own)."""
    if not args.runs and not args.log:
        raise ValueError("give --runs FILE (a CSV or JSON lines of runs) or --log FILE")
    cluster = _given_cluster(args)
    runs: list[Run] = []
    objects: list[dict] = []
    for path in args.runs:
        if not path.is_file():
            raise ValueError(f"--runs {str(path)!r} does not exist")
        if path.suffix.lower() == ".csv":
            runs += csv_runs(path, cluster, args.stack)
        else:
            objects += read_jsonl(path)
    if args.log:
        from tuner.logs import parse_log

        defaults = _log_defaults(args)
        for path in args.log:
            objects += parse_log(path, config=args.log_config, defaults=defaults)
    if objects and cluster is None:
        raise ValueError("runs from JSON lines or logs need the cluster: --cluster PRESET (with --gpus), "
                         "--cluster-file FILE or --gpu NAME --gpus N")
    for obj in objects:
        runs.append(run_from_dict(len(runs), obj, cluster, stack=args.stack))  # type: ignore[arg-type]
    base = cluster if cluster is not None else max((r.cluster for r in runs), key=lambda c: c.num_gpus)
    return base, runs


def run(args: argparse.Namespace) -> int:
    base, runs = gather_runs(args)
    cal = calibrate_runs(runs)
    doc = calibration_document(cal, runs, base)
    name = args.name or default_name(runs)
    where: str
    if args.out:
        doc["profile_id"] = args.out.stem
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
        where, ident = str(args.out), str(args.out)
    else:
        from tuner.store import Store

        store = Store(args.database_url)
        try:
            stored = store.add_profile(name=name, profile=doc, cluster=doc["calibration"]["cluster"])
        finally:
            store.close()
        where, ident = f"the service store as {name!r} (id {stored.id})", name
    if args.json:
        json.dump({"profile": ident, **doc["calibration"]}, sys.stdout)
        sys.stdout.write("\n")
        return 0
    section = doc["calibration"]
    print(f"calibrated {section['stack']} on {section['gpu']} from {len(runs)} run(s)")
    print(f"{'parameter':<24} {'value':>11} {'prior':>11}  unit      fitted")
    for pname, p in section["parameters"].items():
        print(f"{pname:<24} {p['value']:>11.4g} {p['prior']:>11.4g}  {BY_NAME[pname].unit:<9} "
              f"{'yes' if p['fitted'] else 'no (kept at its prior)'}")
    print(f"{'run':>4} {'measured s':>11} {'before s':>10} {'err':>7} {'after s':>10} {'err':>7}")
    for i, r in enumerate(section["runs"]):
        m, b, a = r["measured_s"], r["predicted_s_before"], r["predicted_s_after"]
        print(f"{i:>4} {m:>11.4g} {b:>10.4g} {(b - m) / m:>+7.1%} {a:>10.4g} {(a - m) / m:>+7.1%}")
    print(f"MAPE {section['mape_before']:.1%} before -> {section['mape_after']:.1%} after; leave-one-out "
          f"{section['loo_mape']:.1%}: later predictions claim +/-{section['uncertainty_rel']:.0%}")
    print(f"stored in {where}; use it with `gridtune predict/recommend ... --profile {ident}`")
    return 0
