"""`gridtune profile`: measure this cluster (or import nccl-tests output), fit the model's constants.

    gridtune profile --nproc 4 --quick --out local.json           # fork 4 ranks here (gloo/NCCL)
    torchrun --nnodes 2 --nproc-per-node 8 -m cli profile --out cluster.json   # in place
    srun -N 2 --ntasks-per-node 8 python -m cli profile --out cluster.json     # MASTER_ADDR set
    gridtune profile --import-nccl-tests all_reduce.txt all_gather.json --cluster selene --out sel.json
    gridtune profile --quick --json --upload http://127.0.0.1:8000 --name my-cluster

Writes the profile JSON (--out) and the raw rows next to it (`<stem>.rows.csv`), prints a table
of fitted alpha/busbw per collective, level and group size next to what the preset hardware says
to expect (--cluster; `local-cpu` for gloo runs), or with --json one JSON object including
`holdout_median_abs_error`. torch is imported only inside the handler (measurement runs).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "gib": 1 << 30,
}


def parse_bytes(text: str) -> int:
    """'4194304', '4M', '64KiB', '1G' -> bytes (binary units, as nccl-tests' -e)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a byte count: {text!r} (use e.g. 4194304, 4M, 64KiB)")
    value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value < 1:
        raise argparse.ArgumentTypeError(f"byte count must be positive, got {text!r}")
    return value


def register(subparsers: Any) -> None:
    from cli.formatter import HelpFormatter

    p = subparsers.add_parser(
        "profile",
        help="measure collectives/GEMMs on this cluster (or import nccl-tests) and fit the model's constants",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    p.add_argument("--nproc", type=int, default=None,
                   help="ranks to fork on this machine (default: the visible GPUs, else 2); "
                        "ignored under torchrun/srun, which run in place")
    p.add_argument("--quick", action="store_true", help="short run: fewer sizes, trials and GEMM shapes")
    p.add_argument("--max-bytes", type=parse_bytes, default=None,
                   help="largest message (default 4M with --quick on CPU, 16M on CPU, 1G on GPUs)")
    p.add_argument("--out", default="gridtune-profile.json",
                   help="profile JSON to write; raw rows go to <stem>.rows.csv next to it")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--upload", metavar="URL", nargs="?", const="", default=None,
                   help="POST the profile to URL/v1/clusters (URL defaults to $GRIDTUNE_URL; "
                        "Bearer $GRIDTUNE_API_KEY when set)")
    p.add_argument("--import-nccl-tests", nargs="+", metavar="FILE", default=None,
                   help="fit nccl-tests outputs (plain text or JSON mode) instead of measuring")
    p.add_argument("--cluster", metavar="PRESET", default=None,
                   help="preset whose hardware sets the expected bandwidth (default local-cpu on gloo)")
    p.add_argument("--gpus-per-node", type=int, default=None,
                   help="ranks per node (overrides the preset; on one machine it emulates nodes)")
    p.add_argument("--name", default="", help="profile / cluster name (used as profile_id and for --upload)")
    p.add_argument("--ops", default=None,
                   help="comma list of collectives to measure (default all_reduce,all_gather,reduce_scatter,"
                        "all_to_all,send_recv; broadcast is also known)")
    p.add_argument("--model", metavar="PRESET", default=None,
                   help="time the GEMMs of this model's layers as 1-8-way tensor parallelism shards them "
                        "(instead of generic shapes)")
    p.add_argument("--tokens", type=int, default=None,
                   help="rows of those GEMMs (tokens per micro-batch; default the model's sequence length)")
    p.set_defaults(handler=handle)


def _cluster(preset: str | None, gpus_per_node: int | None) -> Any:
    from perfmodels import presets

    if preset is None:
        return None
    cluster = presets.cluster(preset)
    if gpus_per_node is not None:
        if gpus_per_node < 1:
            raise ValueError(f"--gpus-per-node must be >= 1, got {gpus_per_node}")
        cluster = dataclasses.replace(cluster, gpus_per_node=gpus_per_node,
                                      num_gpus=gpus_per_node * max(1, cluster.num_nodes))
    return cluster


def _measure(args: argparse.Namespace) -> tuple[pd.DataFrame, dict[str, Any]]:
    from engine import microbench  # lazy: torch only when measuring

    backend = microbench.default_backend()
    ops = [o.strip() for o in args.ops.split(",") if o.strip()] if args.ops else None
    shapes = None
    if args.model:
        from perfmodels import presets

        shapes = microbench.model_gemm_shapes(presets.model(args.model), tokens=args.tokens)
    config = microbench.SweepConfig.make(quick=args.quick, max_bytes=args.max_bytes,
                                         device="cuda" if backend == "nccl" else "cpu",
                                         gpus_per_node=args.gpus_per_node, ops=ops, gemm_shapes=shapes,
                                         progress=True)
    if microbench.launched_externally():
        _say(f"gridtune profile: measuring in place ({backend}); the first numbers follow once every rank "
             "has started")
        result = microbench.run_in_place(config)
        if result is None:  # not rank 0: rank 0 writes the files
            raise _NotRankZero
    else:
        nproc = args.nproc
        if nproc is None:
            import torch

            nproc = torch.cuda.device_count() if backend == "nccl" else 2
        _say(f"gridtune profile: starting {nproc} ranks ({backend}); each imports torch and sets up its "
             "process group first (about 10 s), then a progress bar follows")
        result = microbench.run_forked(nproc, config, backend=backend)
    import pandas as pd  # here: ~0.5 s to import, and only measuring makes a frame

    return pd.DataFrame(result["rows"]), result["provenance"]


class _NotRankZero(Exception):
    pass


def _say(text: str) -> None:
    """A status line on stderr (stdout stays one JSON object under --json)."""
    print(text, file=sys.stderr, flush=True)


def fit_warnings(doc: dict[str, Any]) -> list[str]:
    """Fits not to trust: R^2 below 0 means the alpha-beta line explains the timings worse than their mean."""
    out = []
    for f in doc.get("fits", []):
        r2 = f.get("r2")
        if isinstance(r2, (int, float)) and math.isfinite(r2) and r2 < 0:
            out.append(
                f"{f['op']} {f['level']} over {f['group_size']} ranks ({f['members_per_node']} per node): "
                f"R^2 = {r2:.2f} < 0, the timings are noise around their mean; its constants are unreliable "
                "(run without --quick, raise --max-bytes, or quiet the machine)"
            )
    return out


def handle(args: argparse.Namespace) -> int:
    from perfmodels import nccl_tests
    from tuner import profiles

    cluster = _cluster(args.cluster, args.gpus_per_node)
    if args.import_nccl_tests:
        if args.nproc is not None:
            raise ValueError("--import-nccl-tests reads files; it cannot be combined with --nproc")
        rows = nccl_tests.parse_files(args.import_nccl_tests)
        provenance = profiles.import_provenance(rows, args.import_nccl_tests)
    else:
        try:
            rows, provenance = _measure(args)
        except _NotRankZero:
            return 0
        if args.model:
            provenance = {**provenance, "gemm_shapes_from_model": args.model, "gemm_tokens": args.tokens}
        if cluster is None and provenance.get("backend") == "gloo":
            cluster = _cluster("local-cpu", args.gpus_per_node)
        world = int(provenance.get("world_size") or 0)
        if cluster is not None and world > 0:  # the cluster measured is as big as the run, not the preset
            cluster = dataclasses.replace(cluster, num_gpus=world)
    doc = profiles.build_document(rows, provenance=provenance, cluster=cluster, name=args.name)
    warnings = fit_warnings(doc)
    if warnings:
        doc["provenance"] = {**doc["provenance"], "warnings": warnings}
        for line in warnings:
            _say(f"gridtune profile: warning: {line}")
    out = profiles.write_profile(args.out, doc)
    rows_path = profiles.write_rows(profiles.rows_path_for(out), rows)
    uploaded = None
    if args.upload is not None:
        url = args.upload or os.environ.get("GRIDTUNE_URL", "")
        if not url:
            raise ValueError("--upload needs a URL (or GRIDTUNE_URL in the environment)")
        uploaded = profiles.upload(url, doc, name=args.name or doc.get("profile_id", ""), cluster=cluster)
    if args.json:
        print(
            json.dumps({**doc, "profile_path": str(out), "rows_path": str(rows_path), "uploaded": uploaded})
        )
    else:
        _print_tables(doc, out, rows_path, uploaded)
    return 0


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def _print_tables(doc: dict[str, Any], out: Path, rows_path: Path, uploaded: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 130))
    expected = {
        (e["op"], e["level"], e["group_size"], e["members_per_node"]): e for e in doc.get("expected", [])
    }
    table = Table(
        title=f"Collectives ({doc['provenance'].get('backend', '?')}, "
        f"{doc['provenance'].get('world_size', '?')} ranks)",
        caption="ranks: group size; per node: group members on one node; alpha: latency per step (us); "
        "busbw, expected: bus bandwidth (GB/s); ratio: busbw / expected; R2 < 0: do not trust; "
        "holdout: median relative error on sizes left out of the fit",
    )
    for col in ("op", "level", "ranks", "per node", "alpha us", "busbw GB/s", "expected GB/s", "ratio", "R2",
                "holdout"):
        left = col in ("op", "level")
        table.add_column(col, justify="left" if left else "right", no_wrap=True,
                         min_width=14 if col == "op" else None)
    for f in doc.get("fits", []):
        e = expected.get((f["op"], f["level"], f["group_size"], f["members_per_node"]), {})
        ratio = e.get("ratio")
        ratio_s = _fmt(ratio, ".2f")
        if ratio is not None and ratio < 0.5:
            ratio_s = f"[red]{ratio_s}[/]"
        table.add_row(f["op"], f["level"], str(f["group_size"]), str(f["members_per_node"]),
                      _fmt(f["alpha_us"], ".1f"),
                      ("" if f.get("bandwidth_resolved", True) else ">=") + _fmt(f["busbw_GBps"], ".3g"),
                      _fmt(e.get("expected_busbw_GBps"), ".3g"), ratio_s, _fmt(f["r2"], ".3f"),
                      _fmt(f["holdout_median_abs_error"], ".1%"))
        if isinstance(f.get("r2"), (int, float)) and f["r2"] < 0:
            table.rows[-1].style = "red"
    console.print(table)
    gemm = doc.get("gemm_tflops_max")
    if gemm is not None:
        console.print(f"GEMM: {gemm:.4g} TFLOP/s max, half size {doc['gemm_half_size']:.3g}, "
                      f"overhead {doc['gemm_overhead_us']:.3g} us")
    if doc.get("hbm_bandwidth_GBps") is not None:
        console.print(f"memory bandwidth: {doc['hbm_bandwidth_GBps']:.3g} GB/s")
    if any(not f.get("bandwidth_resolved", True) for f in doc.get("fits", [])):
        console.print(
            ">= : messages too small to resolve the bandwidth (raise --max-bytes); a lower bound is kept"
        )
    console.print(f"hold-out median relative error: {_fmt(doc.get('holdout_median_abs_error'), '.1%')}")
    console.print(f"profile: {out}   raw rows: {rows_path}")
    if uploaded is not None:
        console.print(f"uploaded: {json.dumps(uploaded)[:200]}")
    sys.stdout.flush()
