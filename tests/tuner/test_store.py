"""The profile/measurement store on SQLite and on a real PostgreSQL server.

Every test runs twice (`store` is parametrized): on a fresh SQLite file and on the server named by
GRIDTUNE_TEST_POSTGRES_URL, in tables with a unique prefix that are dropped afterwards, so
parallel runs never collide. Run: `.venv/bin/python -m pytest tests/tuner/test_store.py -q`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import multiprocessing
import sqlite3
import threading
import uuid

import pytest
import sqlalchemy as sa

from tuner.store import Measurement, Store, StoredProfile, check_json, default_database_url

PROFILE = {
    "profile_id": "",
    "collectives": [
        {"op": "all_reduce", "level": "intra", "group_size": 8, "alpha_us": 12.0, "busbw_GBps": 230.0}
    ],
    "gemm_tflops_max": 250.0,
    "corrections": {"tp_comm_s": 1.1},
    "source": "profile",
    "provenance": {"host": "n1", "nested": {"list": [1, 2.5, None, True, "x"]}},
    "fits": [{"op": "all_reduce", "r2": 0.99}],
    "expected": None,
}


def _measurement(i: int, cluster_id: str | None = "c1") -> dict:
    return {
        "model": {"preset": "tiny-gpt"},
        "cluster": {"preset": "local-cpu", "num_gpus": 4},
        "training": {"global_batch_size": 8, "dtype": "fp32"},
        "plan": {"G_data": 2, "G_intra_r": 2, "micro_batch_size": 1},
        "measured": {"iteration_time_s": 0.1 + i, "compute_s": 0.05, "bytes_per_group": {"data": 1e6}},
        "prediction": {"iteration_time_s": 0.09 + i} if i % 2 else None,
        "cluster_id": cluster_id,
    }


def _prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}_"


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def store(store_url):
    s = Store(store_url, table_prefix=_prefix())
    yield s
    s.drop_tables()
    s.close()


def test_profile_round_trip_keeps_extras_verbatim(store: Store):
    saved = store.add_profile(name="lab-a100", profile=PROFILE, cluster={"preset": "selene", "num_gpus": 64})
    assert isinstance(saved, StoredProfile) and len(saved.id) >= 12
    got = store.get_profile(saved.id)
    assert got is not None
    assert got.profile == PROFILE
    assert got.cluster == {"preset": "selene", "num_gpus": 64}
    assert got.name == "lab-a100"
    assert got.created_at.tzinfo is not None and got.created_at.utcoffset() == dt.timedelta(0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.name = "other"  # type: ignore[misc]


def test_profile_lookup_by_name_takes_newest_and_unknown_is_none(store: Store):
    first = store.add_profile(name="same", profile={"gemm_tflops_max": 1.0})
    second = store.add_profile(name="same", profile={"gemm_tflops_max": 2.0})
    assert store.get_profile("same").id == second.id
    assert store.get_profile(first.id).profile == {"gemm_tflops_max": 1.0}
    assert store.get_profile("no-such-id") is None
    listed = store.list_profiles()
    assert [p.id for p in listed][:2] == [second.id, first.id]
    assert len(store.list_profiles(limit=1)) == 1


def test_measurements_round_trip_filter_and_page(store: Store):
    ids = [store.add_measurement(**_measurement(i, "c1" if i < 5 else "c2")).id for i in range(8)]
    assert len(set(ids)) == 8
    everything = store.list_measurements()
    assert [m.id for m in everything] == sorted(ids, reverse=True)  # newest first
    assert all(isinstance(m, Measurement) for m in everything)
    c1 = store.list_measurements(cluster_id="c1", limit=100)
    assert len(c1) == 5 and {m.cluster_id for m in c1} == {"c1"}
    m = next(m for m in c1 if m.measured["iteration_time_s"] == pytest.approx(1.1))
    assert m.prediction == {"iteration_time_s": pytest.approx(1.09)}
    assert m.measured["bytes_per_group"] == {"data": 1e6}
    assert m.plan == _measurement(1)["plan"]
    assert next(m for m in c1 if m.measured["iteration_time_s"] == pytest.approx(0.1)).prediction is None
    page1 = store.list_measurements(limit=3)
    page2 = store.list_measurements(limit=3, before_id=page1[-1].id)
    assert len(page1) == 3 and len(page2) == 3
    assert max(x.id for x in page2) < min(x.id for x in page1)
    assert store.count_measurements() == 8 and store.count_measurements("c2") == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.measured = {}  # type: ignore[misc]


def test_rejects_what_json_cannot_carry(store: Store):
    bad = _measurement(0)
    bad["measured"] = {"iteration_time_s": float("nan")}
    with pytest.raises(ValueError, match=r"measured\.iteration_time_s must be a finite number"):
        store.add_measurement(**bad)
    with pytest.raises(ValueError, match=r"profile\.a\[1\]"):
        store.add_profile(name="x", profile={"a": [1.0, math.inf]})
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        store.add_profile(name="  ", profile={})
    assert store.count_measurements() == 0


def test_data_survives_reopening(store_url):
    prefix = _prefix()
    first = Store(store_url, table_prefix=prefix)
    try:
        pid = first.add_profile(name="p", profile=PROFILE).id
        mid = first.add_measurement(**_measurement(3)).id
        first.close()
        second = Store(store_url, table_prefix=prefix)
        assert second.get_profile(pid).profile == PROFILE
        assert [m.id for m in second.list_measurements()] == [mid]
        second.close()
    finally:
        first.drop_tables()
        first.close()


def test_prefixes_isolate_stores(store_url):
    a, b = Store(store_url, table_prefix=_prefix()), Store(store_url, table_prefix=_prefix())
    try:
        a.add_measurement(**_measurement(0))
        assert a.count_measurements() == 1 and b.count_measurements() == 0
    finally:
        for s in (a, b):
            s.drop_tables()
            s.close()


def test_concurrent_writer_threads_lose_nothing(store: Store):
    threads_n, per_thread = 8, 25
    errors: list[BaseException] = []
    ids: list[int] = []
    lock = threading.Lock()

    def writer(t: int) -> None:
        try:
            for i in range(per_thread):
                m = store.add_measurement(**_measurement(i, f"thread-{t}"))
                with lock:
                    ids.append(m.id)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(set(ids)) == threads_n * per_thread
    assert store.count_measurements() == threads_n * per_thread
    for t in range(threads_n):
        assert len(store.list_measurements(cluster_id=f"thread-{t}", limit=1000)) == per_thread


def _process_writer(url: str, prefix: str, worker: int, n: int) -> None:
    s = Store(url, table_prefix=prefix)
    for i in range(n):
        s.add_measurement(**_measurement(i, f"proc-{worker}"))
    s.close()


def test_concurrent_writer_processes_lose_nothing(store_url):
    prefix = _prefix()
    owner = Store(store_url, table_prefix=prefix)  # creates the tables before the race
    try:
        ctx = multiprocessing.get_context("spawn")
        procs = [ctx.Process(target=_process_writer, args=(store_url, prefix, w, 20)) for w in range(3)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        assert [p.exitcode for p in procs] == [0, 0, 0]
        assert owner.count_measurements() == 60
        assert {m.cluster_id for m in owner.list_measurements(limit=1000)} == {"proc-0", "proc-1", "proc-2"}
    finally:
        owner.drop_tables()
        owner.close()


def test_stores_starting_at_once_on_a_fresh_database_all_work(store_url):
    """uvicorn --workers N: N processes create the same tables at the same moment."""
    prefix = _prefix()
    barrier = threading.Barrier(4)
    stores: list[Store] = []
    errors: list[BaseException] = []

    def start() -> None:
        try:
            barrier.wait()
            s = Store(store_url, table_prefix=prefix)
            stores.append(s)
            s.add_measurement(**_measurement(0))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors, errors
        assert stores[0].count_measurements() == 4
    finally:
        if stores:
            stores[0].drop_tables()
        for s in stores:
            s.close()


def test_sqlite_runs_in_wal_mode_with_full_sync(tmp_path):
    path = tmp_path / "wal.db"
    s = Store(f"sqlite:///{path}")
    try:
        s.add_measurement(**_measurement(0))
        with s.engine.connect() as conn:
            assert conn.execute(sa.text("PRAGMA journal_mode")).scalar() == "wal"
            assert conn.execute(sa.text("PRAGMA synchronous")).scalar() == 2  # FULL
        # an independent reader (no SQLAlchemy) sees the committed row while the store is open
        raw = sqlite3.connect(path)
        assert raw.execute("SELECT count(*) FROM gridtune_measurements").fetchone() == (1,)
        raw.close()
    finally:
        s.close()


def test_sqlite_in_memory_is_shared_between_threads():
    s = Store("sqlite://")
    try:
        t = threading.Thread(target=lambda: s.add_measurement(**_measurement(0)))
        t.start()
        t.join()
        assert s.count_measurements() == 1
    finally:
        s.close()


def test_default_url_follows_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("GRIDTUNE_DATABASE_URL", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_database_url() == f"sqlite:///{tmp_path}/gridtune/gridtune.db"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_database_url().endswith(f"{tmp_path}/.local/share/gridtune/gridtune.db")
    monkeypatch.setenv("GRIDTUNE_DATABASE_URL", "postgresql+psycopg://u@h/db")
    assert default_database_url() == "postgresql+psycopg://u@h/db"
    # the default folder is created on first use
    monkeypatch.delenv("GRIDTUNE_DATABASE_URL")
    s = Store()
    try:
        assert (tmp_path / ".local/share/gridtune/gridtune.db").exists()
    finally:
        s.close()


def test_check_json_names_the_path():
    check_json("x", {"a": [1, 2.0, None, "s", {"b": True}]})
    with pytest.raises(ValueError, match=r"x\.a\[0\]\.b must be a finite number, got -inf"):
        check_json("x", {"a": [{"b": -math.inf}]})
    with pytest.raises(ValueError, match="non-string key 1"):
        check_json("x", {1: 2})
    with pytest.raises(ValueError, match="not JSON"):
        check_json("x", {"a": object()})


def test_bad_table_prefix_is_refused():
    with pytest.raises(ValueError, match="table_prefix"):
        Store("sqlite://", table_prefix="x; DROP TABLE")
