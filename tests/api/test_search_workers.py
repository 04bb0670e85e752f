"""The service's search workers (api/searches.py `WorkerPool`): real, long-lived processes.

What it proves, with real searches in real processes: consecutive searches are answered by the same
warm workers (no process per search); a search that overruns its limit kills exactly its worker and a
fresh one takes its place (503); a worker that dies mid-search is replaced (503 naming it), and so is
one that has run its quota of searches; `stop()` leaves no worker alive; workers whose server is
killed end by themselves (EOF when idle, their alarm when busy). And, with searches in threads and
a stand-in search, that more waiting searches than `max_pending` get 503 with Retry-After.
(Identical concurrent questions sharing one search: tests/api/test_bounds_and_cache.py.)
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from fastapi.testclient import TestClient

from api import create_app, schemas, searches, service
from api.searches import SearchRunner
from api.settings import Settings
from tests.api.conftest import make_settings
from tests.api.test_bounds_and_cache import FAKE_ANSWER, TINY_REC

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc (Linux)")

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAYER = {"kind": "linear", "in_features": 1024, "out_features": 1024, "rows_per_sample": 128}
HOPELESS = {  # 4,096 explicit layers on 1,024 GPUs: a search that runs many seconds past a 0.2 s budget
    "model": {"layers": [LAYER] * 4096},
    "cluster": {"preset": "selene", "num_gpus": 1024},
    "training": {"global_batch_size": 1024},
    "top_k": 3,
}


class StallingJob:
    """A job whose search never ends by itself: reading its model sleeps for an hour (in the worker,
    which imports this module to unpickle it)."""

    time_budget_s = 0.2
    key = "stalling"

    @property
    def model(self):
        time.sleep(3600)


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as ended)."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def _cpu_s(pid: int) -> float:
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") if fields else 0.0


def _wait_until(condition, what: str, timeout_s: float = 60.0) -> None:
    """Bounded wait on a loaded machine, not a timing assertion."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _job(body: dict, budget_s: float = 5.0) -> service.RecommendJob:
    settings = Settings(database_url="sqlite://", max_search_time_s=budget_s, default_search_time_s=budget_s)
    return service.prepare_recommend(schemas.RecommendRequest.model_validate(body), None, settings)


def _runner(workers: int) -> SearchRunner:
    runner = SearchRunner(workers=workers, max_pending=16 * workers, cache=service.ResponseCache(0))
    runner.start()  # the workers start in the background
    _wait_until(lambda: len(runner.worker_pids()) == workers, "the search workers did not start")
    return runner


def test_consecutive_searches_are_answered_by_the_same_warm_worker():
    runner = _runner(1)
    try:
        (pid,) = runner.worker_pids()
        for top_k in (1, 2, 3):  # different questions, nothing cached
            answer = json.loads(asyncio.run(runner.run(_job({**TINY_REC, "top_k": top_k}))))
            assert answer["best"] is not None and len(answer["candidates"]) == top_k
            assert runner.worker_pids() == [pid]
    finally:
        runner.stop()
    assert runner.worker_pids() == [] and not _alive(pid)


def test_the_workers_stay_the_same_across_searches_and_stop_ends_them_all():
    runner = _runner(2)
    pids = runner.worker_pids()
    try:
        for top_k in (1, 2, 3, 4):
            assert json.loads(asyncio.run(runner.run(_job({**TINY_REC, "top_k": top_k}))))["best"]
            assert runner.worker_pids() == pids
    finally:
        runner.stop()
    assert [p for p in pids if _alive(p)] == []


def test_a_worker_is_replaced_after_its_quota_of_searches(monkeypatch):
    monkeypatch.setattr(searches, "WORKER_MAX_SEARCHES", 2)
    runner = _runner(1)
    (first,) = runner.worker_pids()
    try:
        assert json.loads(asyncio.run(runner.run(_job({**TINY_REC, "top_k": 1}))))["best"]
        assert runner.worker_pids() == [first]
        assert json.loads(asyncio.run(runner.run(_job({**TINY_REC, "top_k": 2}))))["best"]
        (second,) = runner.worker_pids()  # its second search was its last
        assert second != first and not _alive(first)
        assert json.loads(asyncio.run(runner.run(_job({**TINY_REC, "top_k": 3}))))["best"]
        assert runner.worker_pids() == [second]
    finally:
        runner.stop()
    assert not _alive(second)


def test_an_overrunning_search_kills_and_replaces_exactly_its_worker(monkeypatch):
    monkeypatch.setattr(searches, "SEARCH_GRACE_S", 1.0)
    runner = _runner(2)
    before = set(runner.worker_pids())
    try:
        with pytest.raises(service.Unavailable, match=r"did not finish within 1\.2 s .* and was stopped"):
            asyncio.run(runner.run(_job(HOPELESS, budget_s=0.2)))
        after = set(runner.worker_pids())
        assert len(after) == 2 and len(before & after) == 1, (before, after)
        (killed,) = before - after
        assert not _alive(killed)
        # the replacement and the other worker answer
        for top_k in (1, 2):
            assert json.loads(asyncio.run(runner.run(_job({**TINY_REC, "top_k": top_k}))))["best"]
        assert set(runner.worker_pids()) == after
    finally:
        runner.stop()
    assert [p for p in before | after if _alive(p)] == []


def test_a_worker_that_dies_mid_search_is_replaced_and_the_request_gets_503(monkeypatch):
    monkeypatch.setattr(searches, "SEARCH_GRACE_S", 60.0)
    runner = _runner(1)
    (pid,) = runner.worker_pids()
    idle_cpu = _cpu_s(pid)
    outcome: list[BaseException] = []

    def ask() -> None:
        try:
            asyncio.run(runner.run(_job(HOPELESS, budget_s=0.2)))
        except BaseException as exc:  # the test reads it
            outcome.append(exc)

    asker = threading.Thread(target=ask)
    try:
        asker.start()
        _wait_until(lambda: _cpu_s(pid) > idle_cpu + 0.3, "the worker never started the search")
        os.kill(pid, signal.SIGKILL)
        asker.join(60)
        assert len(outcome) == 1 and isinstance(outcome[0], service.Unavailable), outcome
        assert "search process ended without an answer (exit code -9) and was replaced" in str(outcome[0])
        (new,) = runner.worker_pids()
        assert new != pid
        assert json.loads(asyncio.run(runner.run(_job(TINY_REC))))["best"]
    finally:
        runner.stop()
        asker.join(60)
    assert not _alive(new)


def test_workers_end_when_their_server_is_killed():
    """The server dies by SIGKILL (no stop(), no atexit): the idle worker sees EOF on its pipe and
    exits, the busy one (in a search that never ends by itself) ends at the alarm armed with its job
    (limit + 2 s)."""
    script = textwrap.dedent("""
        import asyncio, os, signal, threading, time
        from api import searches, service
        from tests.api.test_search_workers import StallingJob
        searches.SEARCH_GRACE_S = 1.0
        runner = searches.SearchRunner(workers=2, max_pending=32, cache=service.ResponseCache(0))
        runner.start()
        while len(runner.worker_pids()) < 2:
            time.sleep(0.05)
        print(" ".join(map(str, runner.worker_pids())), flush=True)
        threading.Thread(target=lambda: asyncio.run(runner.run(StallingJob())), daemon=True).start()
        while runner.pending < 1:
            time.sleep(0.01)
        time.sleep(0.5)  # the job is on its way to a worker, which reads it and stalls
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    pids = [int(p) for p in proc.stdout.split()]
    assert len(pids) == 2
    _wait_until(lambda: not any(_alive(p) for p in pids), "a search worker outlived its server")


def test_more_waiting_searches_than_max_pending_get_503_with_retry_after(tmp_path, monkeypatch):
    calls: list = []

    def slow(job):
        calls.append(job)
        time.sleep(1.0)
        return service.encode(FAKE_ANSWER), True

    monkeypatch.setattr(service, "run_recommend", slow)
    with TestClient(create_app(make_settings(tmp_path, search_isolation="thread", search_workers=1))) as c:
        c.app.state.search_runner.max_pending = 2  # one running, one queued
        results: list = []
        threads = [
            threading.Thread(target=lambda k=k: results.append(
                c.post("/v1/recommend", json={**TINY_REC, "top_k": k})))
            for k in range(1, 6)  # five different questions: none shares another's search
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(r.status_code for r in results) == [200, 200, 503, 503, 503]
    refused = [r for r in results if r.status_code == 503]
    assert all(r.headers["retry-after"] for r in refused)
    assert all("searches are already waiting" in r.json()["detail"] for r in refused)
    assert len(calls) == 2


def test_one_search_worker_per_cpu_unless_the_environment_says(monkeypatch):
    monkeypatch.delenv("GRIDTUNE_SEARCH_WORKERS", raising=False)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert Settings(database_url="sqlite://").search_workers == cpus
    assert Settings.from_env().search_workers == cpus
    monkeypatch.setenv("GRIDTUNE_SEARCH_WORKERS", "3")
    assert Settings.from_env().search_workers == 3
