"""A real `gridtune serve` (uvicorn) process: concurrent writers, SIGKILL mid-write, restart, read back.

What it proves: a 201 from POST /v1/measurements means the row is on disk (SQLite WAL, synchronous
FULL, one committed transaction per write): a server killed with SIGKILL while 8 clients are still
writing, restarted on the same file, lists every measurement it acknowledged, and concurrent
writers lose nothing. It also exercises the environment settings (GRIDTUNE_API_KEY,
--database-url) of the real command line. Run:
`.venv/bin/python -m pytest tests/api/test_server_process.py -q`.
"""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from api import examples

ROOT = pathlib.Path(__file__).resolve().parents[2]
KEY = "process-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(db_url: str, port: int, log: pathlib.Path) -> subprocess.Popen:
    env = {**os.environ, "GRIDTUNE_API_KEY": KEY, "OMP_NUM_THREADS": "1"}
    env.pop("GRIDTUNE_DATABASE_URL", None)
    cmd = [
        sys.executable,
        "-c",
        "import sys; from cli import main; sys.exit(main(sys.argv[1:]))",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--database-url",
        db_url,
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60  # start-up wait, not a timing assertion
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"server did not answer /healthz:\n{log.read_text()[-3000:]}")


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(30)


def _all_measurements(base: str) -> list[dict]:
    """Every stored measurement, paging through GET /v1/measurements."""
    stored: list[dict] = []
    before = None
    while True:
        params = {"limit": 1000, **({"before_id": before} if before else {})}
        page = httpx.get(f"{base}/v1/measurements", params=params, timeout=30).json()
        stored += page["items"]
        before = page["next_before_id"]
        if before is None:
            return stored


def test_sigkill_and_restart_keeps_every_acknowledged_write(tmp_path):
    db = tmp_path / "gridtune.db"
    url = f"sqlite:///{db}"
    log = tmp_path / "server.log"
    port = _free_port()
    proc = _start(url, port, log)
    base = f"http://127.0.0.1:{port}"
    acked: list[int] = []
    lock = threading.Lock()
    stop = threading.Event()
    unexpected: list[str] = []
    try:
        assert httpx.post(f"{base}/v1/measurements", json=examples.MEASUREMENT).status_code == 401
        profile = httpx.post(f"{base}/v1/clusters", json=examples.CLUSTER_CREATE, headers=AUTH, timeout=30)
        assert profile.status_code == 201, profile.text
        profile_id = profile.json()["id"]

        def writer(w: int) -> None:
            with httpx.Client(base_url=base, headers=AUTH, timeout=30) as client:
                i = 0
                while not stop.is_set():
                    body = {**examples.MEASUREMENT, "cluster_id": f"writer-{w}",
                            "measured": {"iteration_time_s": 1.0 + i, "writer": w, "seq": i}}
                    try:
                        r = client.post("/v1/measurements", json=body)
                    except httpx.HTTPError:
                        return  # the server is gone (killed): this write was never acknowledged
                    if r.status_code != 201:
                        unexpected.append(f"{r.status_code} {r.text[:200]}")
                        return
                    with lock:
                        acked.append(r.json()["id"])
                    i += 1

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        while len(acked) < 80 and time.monotonic() < deadline and not unexpected:
            time.sleep(0.02)
        _kill(proc)  # SIGKILL while the writers are still sending
        stop.set()
        for t in threads:
            t.join(60)
        assert not unexpected, unexpected
        assert len(acked) >= 80
        assert len(set(acked)) == len(acked)
    finally:
        stop.set()
        _kill(proc)

    port2 = _free_port()
    proc2 = _start(url, port2, log)
    try:
        base2 = f"http://127.0.0.1:{port2}"
        stored = _all_measurements(base2)
        stored_ids = {m["id"] for m in stored}
        missing = set(acked) - stored_ids
        assert not missing, (
            f"{len(missing)} acknowledged measurements lost after SIGKILL: {sorted(missing)[:10]}"
        )
        # at most the writes in flight at the kill (one per writer) were stored without an answer
        assert len(stored_ids) - len(acked) <= 8
        # each writer's acknowledged rows are all there, in order
        for w in range(8):
            seqs = sorted(m["measured"]["seq"] for m in stored if m["cluster_id"] == f"writer-{w}")
            assert seqs == list(range(len(seqs)))
        got = httpx.get(f"{base2}/v1/clusters/{profile_id}", timeout=30)
        assert (
            got.status_code == 200 and got.json()["profile"]["provenance"] == examples.PROFILE["provenance"]
        )
        # and the restarted server still answers the model routes
        assert httpx.post(f"{base2}/v1/predict", json=examples.PREDICT, timeout=30).status_code == 200
    finally:
        _kill(proc2)
