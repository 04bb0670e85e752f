"""How the service keeps requests bounded and cheap: the answer cache, shared searches, the search
queue limit and time-out (503, never a pinned server), settings from the environment, and the
`gridtune serve` command line.

Most tests replace the search by a stand-in (monkeypatched `api.service.run_recommend`, with
searches in threads so the stand-in is seen), so they do not depend on how fast the real tuner is;
one runs a real, hopeless search in a search worker process and checks that the worker is killed.
"""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest
from fastapi.testclient import TestClient

from api import create_app, examples, searches, service
from api.settings import Settings
from tests.api.conftest import make_settings

# --------------------------------------------------------------------------------------------
# the answer cache
# --------------------------------------------------------------------------------------------


def test_cache_is_bounded_in_bytes_and_lru():
    cache = service.ResponseCache(max_bytes=400)
    for i in range(10):
        cache.put(f"k{i}", b"x" * 60)
    assert cache.size <= 400
    assert cache.get("k0") is None and cache.get("k9") == b"x" * 60
    cache.put("huge", b"y" * 300)  # more than a quarter of the budget: never cached
    assert cache.get("huge") is None
    off = service.ResponseCache(max_bytes=0)
    off.put("a", b"1")
    assert off.get("a") is None


def test_repeated_predictions_come_from_the_cache(client, monkeypatch):
    calls = []
    real = service.predict

    def counting(body, profiles):
        calls.append(1)
        return real(body, profiles)

    monkeypatch.setattr(service, "predict", counting)
    first = client.post("/v1/predict", json=examples.PREDICT)
    second = client.post("/v1/predict", json=examples.PREDICT)
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json()
    assert len(calls) == 1
    other = {**examples.PREDICT, "training": {"global_batch_size": 768, "dtype": "bf16"}}
    assert client.post("/v1/predict", json=other).json() != first.json()
    assert len(calls) == 2
    # errors are never cached: the same bad question gets the same 422 every time
    bad = {**examples.PREDICT, "plan": {"G_data": 3}}
    assert client.post("/v1/predict", json=bad).status_code == 422
    assert client.post("/v1/predict", json=bad).status_code == 422


def test_a_name_that_points_at_a_newer_profile_gets_a_fresh_answer(client):
    def upload(tflops: float) -> str:
        body = {"name": "lab", "cluster": {"preset": "selene", "num_gpus": 1024},
                "profile": {**examples.PROFILE, "gemm_tflops_max": tflops}}
        return client.post("/v1/clusters", json=body).json()["id"]

    first = upload(250.0)
    by_name = {**examples.PREDICT, "cluster": {"profile_id": "lab"}}
    a = client.post("/v1/predict", json=by_name).json()
    second = upload(125.0)
    b = client.post("/v1/predict", json=by_name).json()
    assert (a["profile_id"], b["profile_id"]) == (first, second)
    assert b["breakdown"]["compute_s"] > a["breakdown"]["compute_s"]


def test_cache_can_be_switched_off(tmp_path, monkeypatch):
    calls = []
    real = service.predict
    monkeypatch.setattr(service, "predict", lambda body, profiles: calls.append(1) or real(body, profiles))
    with TestClient(create_app(make_settings(tmp_path, cache_mb=0))) as c:
        for _ in range(3):
            assert c.post("/v1/predict", json=examples.PREDICT).status_code == 200
    assert len(calls) == 3


# --------------------------------------------------------------------------------------------
# searches: shared, cached, bounded
# --------------------------------------------------------------------------------------------

TINY_REC = {
    "model": {"preset": "tiny-gpt"},
    "cluster": {"preset": "local-cpu", "num_gpus": 4},
    "training": {"global_batch_size": 8, "dtype": "fp32"},
    "top_k": 2,
}
FAKE_ANSWER = {
    "best": None, "candidates": [], "num_evaluated": 0, "num_valid": 0, "pruned": {}, "pruned_examples": {},
    "constants_source": "preset", "profile_id": None, "explanation": "stand-in", "search_time_s": 0.0,
}


@pytest.fixture
def thread_client(tmp_path):
    with TestClient(create_app(make_settings(tmp_path, search_isolation="thread"))) as c:
        yield c


def _fake_search(delay_s: float, calls: list, *, complete: bool = True):
    def run(job):
        calls.append(job)
        time.sleep(delay_s)
        return service.encode(FAKE_ANSWER), complete

    return run


def test_identical_concurrent_searches_share_one_run_and_are_cached(thread_client, monkeypatch):
    client = thread_client
    calls: list = []
    monkeypatch.setattr(
        service, "run_recommend", _fake_search(1.5, calls)
    )  # long enough for all four to arrive
    results: list = []

    def ask():
        results.append(client.post("/v1/recommend", json=TINY_REC))

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.status_code for r in results] == [200] * 4
    assert all(r.json()["explanation"] == "stand-in" for r in results)
    assert len(calls) == 1
    assert client.post("/v1/recommend", json=TINY_REC).status_code == 200
    assert len(calls) == 1  # answered from the cache
    assert client.post("/v1/recommend", json={**TINY_REC, "top_k": 3}).status_code == 200
    assert len(calls) == 2


def test_searches_cut_short_by_their_budget_are_not_reused(thread_client, monkeypatch):
    client = thread_client
    calls: list = []
    monkeypatch.setattr(service, "run_recommend", _fake_search(0.0, calls, complete=False))
    for _ in range(2):
        assert client.post("/v1/recommend", json=TINY_REC).status_code == 200
    assert len(calls) == 2


def test_a_search_over_its_time_is_answered_503_not_left_hanging(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(service, "run_recommend", _fake_search(2.0, calls))
    monkeypatch.setattr(searches, "SEARCH_GRACE_S", 0.1)
    monkeypatch.setattr(searches, "STARTUP_SLACK_S", 0.0)
    settings = make_settings(
        tmp_path, max_search_time_s=0.05, default_search_time_s=0.05, search_isolation="thread"
    )
    with TestClient(create_app(settings)) as c:
        r = c.post("/v1/recommend", json=TINY_REC)
        assert r.status_code == 503, r.text
        assert "did not finish" in r.json()["detail"] and r.headers["retry-after"]
        assert c.get("/healthz").status_code == 200  # the server still answers


def test_a_hopeless_search_process_is_killed_and_answered_503(tmp_path, monkeypatch):
    """4,096 explicit layers on 1,024 GPUs: one batch of the search runs for minutes. Its process
    is killed at budget + grace, the client gets a 503, and nothing keeps running."""
    monkeypatch.setattr(searches, "SEARCH_GRACE_S", 1.0)
    settings = make_settings(tmp_path, max_search_time_s=0.2, default_search_time_s=0.2)
    layers = [{"kind": "linear", "in_features": 1024, "out_features": 1024, "rows_per_sample": 128}] * 4096
    body = {"model": {"layers": layers}, "cluster": {"preset": "selene", "num_gpus": 1024},
            "training": {"global_batch_size": 1024}, "top_k": 3}
    with TestClient(create_app(settings)) as c:
        r = c.post("/v1/recommend", json=body)
        assert r.status_code == 503, r.text[:500]
        assert "did not finish within" in r.json()["detail"]
        assert c.get("/healthz").status_code == 200
    # the search process is gone (killed at its limit); bounded wait on a loaded machine
    deadline = time.monotonic() + 60
    while [p for p in multiprocessing.active_children() if p.name == "gridtune-search"]:
        assert time.monotonic() < deadline, "a search process outlived its limit"
        time.sleep(0.1)


def test_real_searches_in_processes_answer_and_report_input_errors(client):
    r = client.post("/v1/recommend", json=TINY_REC)
    assert r.status_code == 200, r.text
    assert r.json()["best"] is not None
    # an error raised inside the search process comes back as the same 422 a thread would give
    bad = {**TINY_REC, "search": {"G_data": [3]}}
    r = client.post("/v1/recommend", json=bad)
    assert r.status_code in (200, 422), r.text
    if r.status_code == 200:  # the tuner reports pinned-out grids as pruned instead of failing
        assert r.json()["best"] is None and r.json()["num_valid"] == 0


def test_a_full_search_queue_is_answered_503(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(service, "run_recommend", _fake_search(0.0, calls))
    with TestClient(create_app(make_settings(tmp_path, search_isolation="thread"))) as c:
        c.app.state.search_runner.max_pending = 0
        r = c.post("/v1/recommend", json=TINY_REC)
        assert r.status_code == 503 and "retry later" in r.json()["detail"]
        assert calls == []


def test_search_errors_reach_every_waiter_as_422(thread_client, monkeypatch):
    client = thread_client
    def bad(job):
        time.sleep(0.2)
        raise service.InputError(("body",), "no plan can run: stand-in reason")

    monkeypatch.setattr(service, "run_recommend", bad)
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(client.post("/v1/recommend", json=TINY_REC)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.status_code for r in results] == [422] * 3
    assert all("stand-in reason" in r.json()["detail"][0]["msg"] for r in results)


# --------------------------------------------------------------------------------------------
# settings and the command line
# --------------------------------------------------------------------------------------------


def test_settings_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("GRIDTUNE_DATABASE_URL", f"sqlite:///{tmp_path}/x.db")
    monkeypatch.setenv("GRIDTUNE_API_KEY", "k")
    monkeypatch.setenv("GRIDTUNE_MAX_GPUS", "4096")
    monkeypatch.setenv("GRIDTUNE_CACHE_MB", "0")
    s = Settings.from_env()
    assert (s.database_url, s.api_key, s.max_recommend_gpus, s.cache_mb) == (
        f"sqlite:///{tmp_path}/x.db",
        "k",
        4096,
        0,
    )
    monkeypatch.setenv("GRIDTUNE_API_KEY", "")
    assert Settings.from_env().api_key is None
    monkeypatch.setenv("GRIDTUNE_MAX_GPUS", "lots")
    with pytest.raises(ValueError, match="GRIDTUNE_MAX_GPUS must be an integer, got 'lots'"):
        Settings.from_env()


def test_env_bound_on_gpus_applies_to_recommend(tmp_path):
    with TestClient(create_app(make_settings(tmp_path, max_recommend_gpus=512))) as c:
        r = c.post("/v1/recommend", json=examples.RECOMMEND)
        assert r.status_code == 422
        assert (
            "cluster.num_gpus=1,024 is more than this service searches (512 GPUs at most"
            in r.json()["detail"][0]["msg"]
        )


def test_the_cli_and_the_service_bound_searches_alike(capsys):
    """One bound on searched GPUs (1,048,576), the same words in both."""
    from api.settings import Settings
    from cli import main
    from tuner.search import MAX_GPUS

    assert Settings(database_url="sqlite://").max_recommend_gpus == MAX_GPUS == 1 << 20
    assert main(["recommend", "--model", "gpt3-175b", "--cluster", "selene", "--gpus", "2000000",
                 "--global-batch-size", "1536"]) == 2
    assert (
        "cluster.num_gpus=2,000,000 is more than a search covers (1,048,576 GPUs at most"
        in capsys.readouterr().err
    )


def test_serve_command_line(capsys):
    from cli import build_parser, main

    args = build_parser().parse_args(["serve", "--port", "9001", "--host", "0.0.0.0", "--database-url", "sqlite://"])
    assert (args.port, args.host, args.database_url, args.workers) == (9001, "0.0.0.0", "sqlite://", 1)
    assert main(["serve", "--port", "70000"]) == 2
    assert "--port must be in 0..65535, got 70000" in capsys.readouterr().err


def test_oversized_bodies_are_refused_413(tmp_path):
    with TestClient(create_app(make_settings(tmp_path, max_body_mb=0.001))) as c:  # ~1 KB
        big = {**examples.MEASUREMENT, "measured": {"iteration_time_s": 1.0, "pad": "x" * 5000}}
        r = c.post("/v1/measurements", json=big)
        assert r.status_code == 413 and "larger than 1,048 bytes" in r.json()["detail"]

        def chunks():  # no Content-Length: counted while streaming
            yield b'{"model": {"preset": "gpt3-175b"}, "pad": "'
            for _ in range(10):
                yield b"y" * 500
            yield b'"}'

        r = c.post("/v1/predict", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413, r.text
        assert c.get("/v1/measurements").json()["items"] == []
        assert c.post("/v1/predict", json=examples.PREDICT).status_code == 200  # small ones still pass
        assert 'status="413"' in c.get("/metrics").text
