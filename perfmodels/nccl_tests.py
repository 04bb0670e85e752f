"""Read nccl-tests output (plain text or its JSON mode) into gridtune's tidy measurement rows.

Why: many users already ran `all_reduce_perf`, `all_gather_perf`, ... on their cluster. Importing
those results gives a fitted profile without rerunning anything:

    gridtune profile --import-nccl-tests all_reduce.txt all_gather.json --out my-cluster.json

How: every benchmark line becomes two rows (out-of-place as trial 0, in-place as trial 1) with the
columns of `perfmodels.fitting.RAW_COLUMNS` (op, bytes = the printed size, group_size = number of
ranks, level/members_per_node from the ranks' host names, seconds = time) plus the printed numbers
as they were (count, dtype, redop, root, time_us, algbw_GBps, busbw_GBps, wrong, in_place).
nccl-tests prints `size` as the full buffer (all-gather output, reduce-scatter input), the same
convention as the time model, and `busbw = algbw * factor` with the ring factors of
`perfmodels.fitting.bytes_factor`.

The collective comes from the "# Collective test starting: X" line, the JSON "args"[0], the file
name, or (for old outputs without either) from the printed numbers: a reduction whose count times
the type size equals the size is an all-reduce, one that is p times smaller a reduce-scatter, etc.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from perfmodels.fitting import RAW_COLUMNS

NCCL_COLUMNS = ("count", "dtype", "redop", "root", "time_us", "algbw_GBps", "busbw_GBps", "wrong", "in_place",
                "test")
COLUMNS = (*RAW_COLUMNS, *NCCL_COLUMNS)

_TEST_TO_OP = {
    "all_reduce": "all_reduce", "allreduce": "all_reduce",
    "all_gather": "all_gather", "allgather": "all_gather",
    "reduce_scatter": "reduce_scatter", "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all", "all_to_all": "all_to_all",
    "sendrecv": "send_recv", "send_recv": "send_recv",
    "broadcast": "broadcast",
    "reduce": "reduce", "gather": "gather", "scatter": "scatter", "hypercube": "hypercube",
}
TYPE_BYTES = {
    "int8": 1, "char": 1, "uint8": 1, "int32": 4, "int": 4, "uint32": 4, "int64": 8, "uint64": 8,
    "half": 2, "float16": 2, "float": 4, "float32": 4, "double": 8, "float64": 8, "bfloat16": 2, "bf16": 2,
    "f8e4m3": 1, "f8e5m2": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
}

_PREFIX = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
_RANK = re.compile(r"Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)")
_NTHREAD = re.compile(r"nThread\s+(\d+)\s+nGpus\s+(\d+)")
_TEST = re.compile(r"Collective test starting:\s*(\S+)")
_NCCL_VERSION = re.compile(r"NCCL version\s+(\d+\.\d+\.\d+)")
_NCCL_LIBRARY = re.compile(r"nccl-library=(\d+)")


def op_from_test_name(name: str | None) -> str | None:
    """'all_reduce_perf', './build/alltoall_perf_mpi', 'sendrecv.txt' -> gridtune op names."""
    if not name:
        return None
    base = os.path.basename(str(name)).lower()
    base = re.sub(r"\.(txt|log|out|json)$", "", base)
    base = re.sub(r"_perf(_mpi)?$", "", base)
    if base in _TEST_TO_OP:
        return _TEST_TO_OP[base]
    for key in sorted(_TEST_TO_OP, key=len, reverse=True):  # e.g. "a100_all_gather_perf_2node"
        if re.search(rf"(^|[^a-z]){key}([^a-z]|$)", base):
            return _TEST_TO_OP[key]
    return None


def nccl_version_from_code(code: int) -> str:
    """NCCL_VERSION_CODE (e.g. 23003 or 2708) -> '2.30.3' / '2.7.8'."""
    code = int(code)
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def infer_op(size: int, count: int, dtype: str, redop: str, root: int, nranks: int) -> str | None:
    """Guess the collective of an old output line (no test name) from how size relates to count."""
    ts = TYPE_BYTES.get(dtype.lower())
    if ts is None or count <= 0:
        return None
    per = count * ts
    reducing = redop.lower() not in ("none", "")
    if root >= 0:
        return "reduce" if reducing else "broadcast"
    if reducing:
        if per == size:
            return "all_reduce"
        if per * nranks == size:
            return "reduce_scatter"
        return None
    if per == size:
        return "send_recv"
    return None  # all_gather and all_to_all print the same numbers: needs the test name


def _level(hosts: list[str], nranks: int) -> tuple[str, int, str]:
    """(level, members per node, host string) of a run over `nranks` ranks on `hosts` (by rank)."""
    if not hosts:
        return "intra", nranks, ""
    counts: dict[str, int] = {}
    for h in hosts:
        counts[h] = counts.get(h, 0) + 1
    names = ",".join(counts)
    if len(counts) == 1:
        return "intra", nranks, names
    return "inter", min(counts.values()), names


def _num(token: str) -> float:
    try:
        return float(token)
    except ValueError:
        return math.nan


def _row(*, op: str | None, test: str, size: int, count: int, dtype: str, redop: str, root: int, nranks: int,
         level: str, q: int, hosts: str, nccl_version: str, time_us: float, algbw: float, busbw: float,
         wrong: float, in_place: bool) -> dict[str, Any]:
    return {
        "op": op or "unknown", "bytes": size, "group_size": nranks, "level": level, "members_per_node": q,
        "trial": 1 if in_place else 0, "seconds": time_us * 1e-6, "host": hosts, "torch_version": "",
        "backend": "nccl", "nccl_version": nccl_version, "count": count, "dtype": dtype, "redop": redop,
        "root": root, "time_us": time_us, "algbw_GBps": algbw, "busbw_GBps": busbw, "wrong": wrong,
        "in_place": in_place, "test": test,
    }


class _Run:
    """State of one benchmark run inside a text file (a file may hold several)."""

    def __init__(self, test: str | None, nccl_version: str):
        self.test = test
        self.nccl_version = nccl_version
        self.nranks_declared = 1
        self.hosts: dict[int, str] = {}
        self.prefix: list[str] | None = None
        self.block: list[str] | None = None
        self.lines: list[list[str]] = []


def parse_text(text: str, *, op: str | None = None, source: str = "") -> pd.DataFrame:
    """Parse nccl-tests stdout (one or more runs; mpirun --tag-output prefixes are fine)."""
    runs: list[_Run] = []
    test: str | None = None
    nccl_version = ""
    run: _Run | None = None
    for raw in text.splitlines():
        line = _PREFIX.sub("", raw).rstrip()
        if not line.strip():
            continue
        body = line.lstrip("#").strip()
        if m := _TEST.search(line):
            test = m.group(1)
            continue
        if m := _NCCL_LIBRARY.search(line):
            nccl_version = nccl_version_from_code(int(m.group(1)))
        if m := _NCCL_VERSION.search(line):
            nccl_version = m.group(1)
            if run is not None:
                run.nccl_version = nccl_version
            continue
        if m := _NTHREAD.search(line):
            run = _Run(test, nccl_version)
            run.nranks_declared = int(m.group(1)) * int(m.group(2))
            runs.append(run)
            continue
        if run is None:
            continue
        if m := _RANK.search(line):
            run.hosts[int(m.group(1))] = m.group(4)
            continue
        tokens = body.split()
        if tokens[:2] == ["size", "count"]:  # the header, with or without its leading '#'
            first_time = next(i for i, t in enumerate(tokens) if t in ("time", "cputime"))
            run.prefix = tokens[:first_time]
            rest = [t for t in tokens[first_time:] if t != "timestamp"]
            run.block = rest[: len(rest) // 2]
            continue
        if line.lstrip().startswith("#") or run.prefix is None or not tokens or not tokens[0].isdigit():
            continue
        run.lines.append(tokens)
    rows: list[dict[str, Any]] = []
    for r in runs:
        if not r.lines or r.prefix is None or r.block is None:
            continue
        nranks = max(len(r.hosts), r.nranks_declared)
        hosts = [r.hosts[k] for k in sorted(r.hosts)]
        level, q, host_names = _level(hosts, nranks)
        run_op = op or op_from_test_name(r.test) or op_from_test_name(source)
        npre, nblk = len(r.prefix), len(r.block)
        i_time = 0
        i_alg = r.block.index("algbw")
        i_bus = r.block.index("busbw")
        i_wrong = next((i for i, t in enumerate(r.block) if t in ("#wrong", "error", "wrong")), None)
        for tokens in r.lines:
            head = dict(zip(r.prefix, tokens[:npre]))
            size, count = int(head["size"]), int(head["count"])
            dtype, redop = head.get("type", ""), head.get("redop", "")
            root = int(head.get("root", -1))
            line_op = run_op or infer_op(size, count, dtype, redop, root, nranks)
            values = tokens[npre:]
            blocks = (
                [values[:nblk], values[nblk : 2 * nblk]] if len(values) >= 2 * nblk else [None, values[:nblk]]
            )
            for in_place, blk in ((False, blocks[0]), (True, blocks[1])):
                if not blk or len(blk) < nblk:
                    continue
                rows.append(_row(op=line_op, test=r.test or source, size=size, count=count, dtype=dtype,
                                 redop=redop, root=root, nranks=nranks, level=level, q=q, hosts=host_names,
                                 nccl_version=r.nccl_version, time_us=_num(blk[i_time]),
                                 algbw=_num(blk[i_alg]), busbw=_num(blk[i_bus]),
                                 wrong=_num(blk[i_wrong]) if i_wrong is not None else math.nan,
                                 in_place=in_place))
    return pd.DataFrame(rows, columns=list(COLUMNS))


def parse_json(data: str | Mapping[str, Any], *, op: str | None = None, source: str = "") -> pd.DataFrame:
    """Parse the JSON file nccl-tests writes with its JSON output option (format version 2)."""
    doc = json.loads(data) if isinstance(data, str) else data
    if not isinstance(doc, Mapping) or "results" not in doc:
        raise ValueError(
            f"{source or 'nccl-tests JSON'}: no 'results' list; is this an nccl-tests JSON file?"
        )
    args = doc.get("args") or []
    config = doc.get("config") or {}
    devices = config.get("devices") or []
    nranks = max(len(devices), int(config.get("nthreads", 1)) * int(config.get("ngpus", 1)))
    hosts = [d.get("hostname", "") for d in sorted(devices, key=lambda d: d.get("rank", 0))]
    level, q, host_names = (
        _level(hosts, nranks) if len(hosts) == nranks else ("intra", nranks, ",".join(hosts))
    )
    if len(hosts) != nranks and len(set(hosts)) > 1:
        level, q = "inter", 1
    code = doc.get("nccl_version")
    nccl_version = nccl_version_from_code(int(code)) if code else ""
    test = os.path.basename(str(args[0])) if args else source
    run_op = op or op_from_test_name(test) or op_from_test_name(source)
    rows: list[dict[str, Any]] = []
    for res in doc["results"]:
        size, count = int(res["size"]), int(res["count"])
        dtype, redop = str(res.get("type", "")), str(res.get("redop", ""))
        root = int(str(res.get("root", "-1")).strip() or -1)
        line_op = run_op or infer_op(size, count, dtype, redop, root, nranks)
        for in_place, key in ((False, "out_of_place"), (True, "in_place")):
            blk = res.get(key)
            if not blk:
                continue
            t = blk.get("time", blk.get("cpu_time"))
            wrong = blk.get("nwrong")
            rows.append(
                _row(
                    op=line_op,
                    test=test,
                    size=size,
                    count=count,
                    dtype=dtype,
                    redop=redop,
                    root=root,
                    nranks=nranks,
                    level=level,
                    q=q,
                    hosts=host_names,
                    nccl_version=nccl_version,
                    time_us=_num(str(t)),
                    algbw=_num(str(blk.get("alg_bw"))),
                    busbw=_num(str(blk.get("bus_bw"))),
                    wrong=math.nan if wrong is None else _num(str(wrong)),
                    in_place=in_place,
                )
            )
    return pd.DataFrame(rows, columns=list(COLUMNS))


def parse_file(path: str | os.PathLike[str], *, op: str | None = None) -> pd.DataFrame:
    """Parse one file, text or JSON (sniffed from its first character)."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    source = os.path.basename(str(path))
    if text.lstrip().startswith("{"):
        return parse_json(text, op=op, source=source)
    return parse_text(text, op=op, source=source)


def parse_files(paths: Iterable[str | os.PathLike[str]], *, op: str | None = None) -> pd.DataFrame:
    """Parse several files into one table; raises ValueError naming a file that holds no results."""
    frames = []
    for p in paths:
        if not os.path.exists(p):
            raise ValueError(f"--import-nccl-tests: no such file {str(p)!r}")
        df = parse_file(p, op=op)
        if len(df) == 0:
            raise ValueError(f"--import-nccl-tests: found no nccl-tests result lines in {str(p)!r}")
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=list(COLUMNS))
    return pd.concat(frames, ignore_index=True)
