"""Long schemathesis run against a real `gridtune serve`, on SQLite and on PostgreSQL: how many generated
requests, how many 5xx, how many answers that break the documented schema.

Per database, starts the service on a free loopback port (API key set, so the bearer scheme is
exercised; searches capped at 0.3 s and 64 GPUs so each generated search stays small), then runs the
schemathesis CLI (`st run`, all phases: examples, coverage, fuzzing, stateful) with the checks the test
suite uses (tests/api/test_openapi_fuzz.py):

- not_a_server_error: no 5xx;
- status_code_conformance, content_type_conformance, response_schema_conformance: every answer is a
  documented status with a body that matches the documented schema;
- negative_data_rejection: schema-invalid requests are refused.

and prints one line per database: the cases schemathesis ran and the checks that failed (counted
from its event stream, NDJSON, written as each operation finishes, so a run stopped at
`--timeout-s` still reports what it finished), and, from the server's own /metrics, how many
requests it answered and how many of them with a 5xx. PostgreSQL runs on GRIDTUNE_TEST_POSTGRES_URL
(default postgresql+psycopg://postgres@127.0.0.1:5432/test) under a throw-away table prefix;
skipped with a note when no server answers there.

    .venv/bin/python bench/fuzz_service.py       # -n 1200: > 20,000 cases on each database
    .venv/bin/python bench/fuzz_service.py --max-examples 50 --databases sqlite
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # bench/serve_process.py
from serve_process import start_serve, stop_serve  # noqa: E402

KEY = "fuzz-key"
CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_schema_conformance", "negative_data_rejection")
SCHEMA_CHECKS = ("status_code_conformance", "content_type_conformance", "response_schema_conformance")
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def postgres_answers(url: str) -> str:
    """"" when a PostgreSQL server answers at `url`, else why not."""
    try:
        import sqlalchemy as sa

        engine = sa.create_engine(url, connect_args={"connect_timeout": 3})
        try:
            with engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
        finally:
            engine.dispose()
    except Exception as exc:  # no driver, no server, refused: all mean "not here"
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    return ""


def start_server(port: int, db_url: str, env_extra: dict[str, str], log: pathlib.Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "GRIDTUNE_API_KEY": KEY,
           "GRIDTUNE_MAX_SEARCH_S": "0.3", "GRIDTUNE_MAX_GPUS": "64", **env_extra}
    return start_serve(port, ["--database-url", db_url, "--log-level", "warning"], env=env, cwd=ROOT, log=log)


def tally(events: pathlib.Path) -> dict[str, object]:
    """Cases and failed checks from schemathesis' event stream (NDJSON, written as each operation's
    scenario finishes, so a run stopped at its time limit still counts what it did)."""
    cases = 0
    failed: dict[str, int] = {}
    errors = 0
    complete = False
    for line in events.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue  # the last line of a stopped run may be cut
        kind, body = next(iter(event.items()))
        if kind == "ScenarioFinished":
            for checks in ((body.get("recorder") or {}).get("checks") or {}).values():
                cases += 1
                for check in checks:
                    if check.get("status") == "failure":
                        failed[check["name"]] = failed.get(check["name"], 0) + 1
        elif kind == "NonFatalError" or kind == "FatalError":
            errors += 1
        elif kind == "EngineFinished":
            complete = True
    return {"cases": cases, "failed": failed, "errors": errors, "complete": complete}


def run_one(name: str, db_url: str, env_extra: dict[str, str], args: argparse.Namespace,
            tmp: pathlib.Path) -> dict[str, object]:
    port = free_port()
    log = tmp / f"{name}-server.log"
    events = tmp / f"{name}-events.ndjson"
    proc = start_server(port, db_url, env_extra, log)
    t0 = time.monotonic()
    try:
        st = pathlib.Path(sys.executable).with_name("st")
        cmd = [str(st), "run", f"http://127.0.0.1:{port}/openapi.json", "-c", ",".join(CHECKS),
               "-n", str(args.max_examples), "-H", f"Authorization: Bearer {KEY}", "--seed", str(args.seed),
               "-w", str(args.workers), "--continue-on-failure", "--request-timeout", "60",
               "--report", "ndjson", "--report-ndjson-path", str(events)]
        runner = subprocess.Popen(cmd, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        try:
            runner.wait(args.timeout_s)
        except subprocess.TimeoutExpired:  # stop at the time limit; what finished is counted
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait(30)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as r:
            metrics = r.read().decode()
    finally:
        stop_serve(proc)
    served = five_xx = 0
    for line in metrics.splitlines():
        if line.startswith("gridtune_http_requests_total{"):
            count = int(float(line.rsplit(" ", 1)[1]))
            served += count
            five_xx += count if 'status="5' in line else 0
    got = tally(events)
    failed: dict[str, int] = got["failed"]  # type: ignore[assignment]
    return {
        "database": name,
        "cases": got["cases"],
        "complete": got["complete"],
        "with_failures": sum(failed.values()),
        "server_errors": failed.get("not_a_server_error", 0),
        "schema_violations": sum(failed.get(c, 0) for c in SCHEMA_CHECKS),
        "other_failures": {k: v for k, v in failed.items() if k != "not_a_server_error"
                           and k not in SCHEMA_CHECKS},
        "errors": got["errors"],
        "served": served,
        "served_5xx": five_xx,
        "tracebacks_in_server_log": log.read_text(errors="replace").count("Traceback"),
        "seconds": time.monotonic() - t0,
    }


def report(row: dict[str, object], args: argparse.Namespace) -> None:
    print(f"{row['database']}: {row['cases']:,} cases ({row['with_failures']} with failures) "
          f"in {row['seconds']:.0f} s (schemathesis -n "
          f"{args.max_examples}, seed {args.seed}); 5xx: {row['server_errors']}; schema "
          f"violations: {row['schema_violations']}; other failed checks: {row['other_failures'] or 0}; "
          f"errors: {row['errors']}; tracebacks in the server log: {row['tracebacks_in_server_log']}; "
          f"{'all phases done' if row['complete'] else 'stopped at --timeout-s'}; the server answered "
          f"{row['served']:,} requests, {row['served_5xx']} of them 5xx", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-examples", type=int, default=1200, help="schemathesis -n per operation")
    parser.add_argument("--databases", default="sqlite,postgres")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=3600.0,
                        help="one database's run stops here; the cases finished by then are counted")
    args = parser.parse_args(argv)
    pg_url = os.environ.get("GRIDTUNE_TEST_POSTGRES_URL", "").strip() or DEFAULT_POSTGRES_URL
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = pathlib.Path(tmp_name)
        for name in args.databases.split(","):
            if name == "sqlite":
                rows.append(run_one("sqlite", f"sqlite:///{tmp / 'fuzz.db'}", {}, args, tmp))
                report(rows[-1], args)
            elif name == "postgres":
                why = postgres_answers(pg_url)
                if why:
                    print(f"postgres: skipped, no server at {pg_url} ({why})")
                    continue
                prefix = f"fz{uuid.uuid4().hex[:8]}_"
                try:
                    rows.append(run_one("postgres", pg_url, {"GRIDTUNE_TABLE_PREFIX": prefix}, args, tmp))
                    report(rows[-1], args)
                finally:
                    from tuner.store import Store

                    Store(pg_url, table_prefix=prefix, create=False).drop_tables()
            else:
                raise SystemExit(f"unknown database {name!r} (sqlite, postgres)")
    return 0 if all(r["with_failures"] == 0 and r["served_5xx"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
