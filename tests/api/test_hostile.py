"""Hostile input and exhausted resources against a real `gridtune serve` (uvicorn in a subprocess),
on SQLite files and on the PostgreSQL server of GRIDTUNE_TEST_POSTGRES_URL.

What each test proves is in its name; none asserts a duration (waits have generous deadlines).
Run: `.venv/bin/python -m pytest tests/api/test_hostile.py -q`.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sqlite3
import subprocess
import sys
import threading
import uuid

import httpx
import pytest
import sqlalchemy as sa

from api import examples
from tests.api import serverproc

SURROGATE = "\ud800"
SMALL_MEASUREMENT = {
    "model": {"preset": "tiny-gpt"},
    "cluster": {"preset": "local-cpu", "num_gpus": 4},
    "training": {"global_batch_size": 8, "dtype": "fp32"},
    "plan": {"G_data": 2, "G_intra_r": 2, "micro_batch_size": 1},
    "measured": {"iteration_time_s": 0.5},
}


def _raw(body: object) -> bytes:
    """JSON text as a client would send it; json.dumps writes an unpaired surrogate as the escape \\ud800."""
    return json.dumps(body).encode()


def _post(url: str, path: str, body: object, **kw: object) -> httpx.Response:
    return httpx.post(url + path, content=_raw(body), headers={"content-type": "application/json"},
                      timeout=60, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def sqlite_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    with serverproc.running_server(tmp / "server.log", database_url=f"sqlite:///{tmp / 'gridtune.db'}",
                                   env={"GRIDTUNE_MAX_PAGE_MB": "1"}) as srv:
        yield srv


@pytest.fixture(scope="module")
def postgres_server(tmp_path_factory, postgres_url):
    tmp = tmp_path_factory.mktemp("hostile-pg")
    prefix = f"h{uuid.uuid4().hex[:8]}_"
    with serverproc.running_server(
        tmp / "server.log",
        database_url=postgres_url,
        env={"GRIDTUNE_TABLE_PREFIX": prefix, "GRIDTUNE_DB_LOCK_TIMEOUT_S": "1"},
    ) as srv:
        yield srv, prefix
    from tuner.store import Store

    Store(postgres_url, table_prefix=prefix, create=False).drop_tables()


@pytest.fixture(params=["sqlite", "postgres"])
def server(request):
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_server")
    return request.getfixturevalue("postgres_server")[0]


# -- unpaired surrogates ------------------------------------------------------------------


def test_unpaired_surrogates_are_422_naming_the_field_and_never_stored(server):
    cases = [
        ("/v1/clusters", {**examples.CLUSTER_CREATE, "name": "gpu" + SURROGATE}, "name"),
        ("/v1/predict", {**examples.PREDICT, "cluster": {"profile_id": SURROGATE}}, "profile_id"),
        (
            "/v1/measurements",
            {**SMALL_MEASUREMENT, "measured": {"iteration_time_s": 0.5, SURROGATE: 1}},
            "measured",
        ),
        ("/v1/measurements", {**SMALL_MEASUREMENT, "prediction": {"x": "a" + SURROGATE}}, "prediction"),
        (
            "/v1/clusters",
            {
                **examples.CLUSTER_CREATE,
                "profile": {**examples.CLUSTER_CREATE["profile"], "provenance": {"host": SURROGATE}},
            },
            "provenance",
        ),
    ]
    for path, body, field in cases:
        r = _post(server.url, path, body)
        assert r.status_code == 422, (path, r.status_code, r.text[:300])
        assert field in r.text and "surrogate" in r.text, r.text[:300]
    for path in ("/v1/measurements", "/v1/clusters"):
        r = httpx.get(server.url + path, timeout=30)
        assert r.status_code == 200, r.text[:300]
        assert SURROGATE not in r.text


def test_a_row_stored_before_the_fix_cannot_break_a_read(tmp_path):
    """A surrogate that reached the database (older versions stored it) is read back as U+FFFD."""
    from tuner.store import Store

    url = f"sqlite:///{tmp_path / 'old.db'}"
    store = Store(url)
    with store.engine.begin() as conn:  # what gridtune 0.1 let through
        conn.execute(
            store.measurements.insert().values(
                cluster_id="c",
                model={},
                cluster={},
                training={},
                plan={},
                measured={"iteration_time_s": 1, SURROGATE: 2},
                prediction={"k": SURROGATE},
                created_at=sa.func.now(),
            )
        )
        conn.execute(
            store.profiles.insert().values(
                id="p1",
                name="old",
                profile={"provenance": {"h": SURROGATE}},
                cluster=None,
                created_at=sa.func.now(),
            )
        )
    store.close()
    with serverproc.running_server(tmp_path / "server.log", database_url=url) as srv:
        for path in ("/v1/measurements", "/v1/clusters", "/v1/clusters/p1"):
            r = httpx.get(srv.url + path, timeout=30)
            assert r.status_code == 200, (path, r.text[:300])
            assert (
                "\ufffd" in r.json()["items"][0]["measured"]
                if path == "/v1/measurements"
                else "\ufffd" in r.text
            )


# -- PostgreSQL NUL and int4 ids ---------------------------------------------------------------


def test_nul_characters_and_huge_page_cursors_are_not_500_on_postgres(postgres_server):
    srv, _ = postgres_server
    r = _post(srv.url, "/v1/clusters", {**examples.CLUSTER_CREATE, "name": "a\x00b"})
    assert r.status_code == 422 and "NUL" in r.text, r.text[:300]
    r = _post(srv.url, "/v1/measurements", {**SMALL_MEASUREMENT, "cluster_id": "c\x00"})
    assert r.status_code == 422 and "NUL" in r.text, r.text[:300]
    r = _post(srv.url, "/v1/predict", {**examples.PREDICT, "cluster": {"profile_id": "p\x00"}})
    assert r.status_code == 422, r.text[:300]
    assert httpx.get(srv.url + "/v1/clusters/x%00y", timeout=30).status_code == 404
    r = httpx.get(srv.url + "/v1/measurements", params={"cluster_id": "a\x00"}, timeout=30)
    assert r.status_code == 200 and r.json()["items"] == []
    assert _post(srv.url, "/v1/measurements", SMALL_MEASUREMENT).status_code == 201
    r = _post(
        srv.url,
        "/v1/measurements",
        {**SMALL_MEASUREMENT, "measured": {"iteration_time_s": 1, "note": "a\x00b"}},
    )
    assert r.status_code == 201, r.text[
        :300
    ]  # NUL inside free-form JSON is data, and PostgreSQL's json keeps it
    for before in (2**31 - 1, 2**31, 2**62):
        r = httpx.get(srv.url + "/v1/measurements", params={"before_id": before}, timeout=30)
        assert r.status_code == 200 and r.json()["items"], (before, r.text[:300])


# -- a locked database answers 503, reads and liveness stay up ---------------------------------


def _writers(url: str, n: int) -> list[int]:
    codes: list[int] = []
    lock = threading.Lock()

    def one() -> None:
        try:
            code = _post(url, "/v1/measurements", SMALL_MEASUREMENT).status_code
        except httpx.HTTPError as exc:
            code = -1
            print("writer error", exc)
        with lock:
            codes.append(code)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    return codes, threads  # type: ignore[return-value]


def test_a_write_lock_held_elsewhere_gives_503_while_reads_and_liveness_answer(tmp_path):
    db = tmp_path / "locked.db"
    with serverproc.running_server(tmp_path / "server.log", database_url=f"sqlite:///{db}",
                                   env={"GRIDTUNE_DB_LOCK_TIMEOUT_S": "1"}) as srv:
        assert _post(srv.url, "/v1/measurements", SMALL_MEASUREMENT).status_code == 201
        other = sqlite3.connect(db, timeout=1)
        other.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
        try:
            codes, threads = _writers(srv.url, 60)
            assert httpx.get(srv.url + "/livez", timeout=30).status_code == 200
            assert httpx.get(srv.url + "/v1/measurements", timeout=30).status_code == 200  # reads go on
            r = httpx.get(srv.url + "/readyz", timeout=30)
            assert r.status_code == 503 and "locked" in r.json()["reason"], r.text
            for t in threads:
                t.join(120)
        finally:
            other.rollback()
            other.close()
        assert set(codes) <= {201, 503}, sorted(codes)
        assert 503 in codes
        assert _post(srv.url, "/v1/measurements", SMALL_MEASUREMENT).status_code == 201  # recovers
        log = srv.log.read_text()
    assert "Traceback" not in log and len(log) < 20_000, log[-2000:]  # one line per second at most


def test_a_table_lock_on_postgres_gives_503_while_other_tables_answer(postgres_server, postgres_url):
    srv, prefix = postgres_server
    engine = sa.create_engine(postgres_url)
    with engine.connect() as conn:
        trans = conn.begin()
        conn.execute(sa.text(f'LOCK TABLE "{prefix}measurements" IN ACCESS EXCLUSIVE MODE'))
        try:
            codes, threads = _writers(srv.url, 60)
            assert httpx.get(srv.url + "/v1/clusters", timeout=30).status_code == 200
            assert httpx.get(srv.url + "/livez", timeout=30).status_code == 200
            for t in threads:
                t.join(120)
        finally:
            trans.rollback()
    engine.dispose()
    assert set(codes) <= {201, 503}, sorted(codes)
    assert 503 in codes
    assert _post(srv.url, "/v1/measurements", SMALL_MEASUREMENT).status_code == 201


# -- a 500 says Connection: close --------------------------------------------------------------


def test_a_server_error_says_connection_close(tmp_path):
    port = serverproc.free_port()
    code = (
        "import uvicorn; from api.server import uvicorn_config, ServerLimits; "
        "from tests.api.buggy_app import create; "
        f"uvicorn.Server(uvicorn_config(create('sqlite:///{tmp_path / 'b.db'}'), host='127.0.0.1', "
        f"port={port}, "
        "workers=1, log_level='warning', limits=ServerLimits())).run()"
    )
    with serverproc.running_server(
        tmp_path / "server.log", command=[sys.executable, "-c", code], port=port
    ) as srv:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
            s.sendall(b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while b"\r\n\r\n" not in data:
                data += s.recv(65536)
        head = data.split(b"\r\n\r\n")[0].lower()
        assert head.startswith(b"http/1.1 500") and b"connection: close" in head, head


# -- bounded pages, bounded fields, bounded echoes ------------------------------------


def test_list_pages_are_bounded_in_bytes_and_free_form_fields_in_size(sqlite_server):
    srv = sqlite_server
    big = "x" * 200_000
    ids = []
    for i in range(6):
        r = _post(srv.url, "/v1/measurements", {**SMALL_MEASUREMENT, "cluster_id": "pages",
                                                "measured": {"iteration_time_s": 1.0 + i, "blob": big}})
        assert r.status_code == 201, r.text[:300]
        ids.append(r.json()["id"])
    r = _post(
        srv.url,
        "/v1/measurements",
        {**SMALL_MEASUREMENT, "measured": {"iteration_time_s": 1, "b": "y" * 300_000}},
    )
    assert r.status_code == 422 and "measured is" in r.text and "at most" in r.text, r.text[:300]
    seen: list[int] = []
    before = None
    while True:
        params = {"cluster_id": "pages", "limit": 1000, **({"before_id": before} if before else {})}
        r = httpx.get(srv.url + "/v1/measurements", params=params, timeout=30)
        assert r.status_code == 200
        assert len(r.content) <= 1.3 * 2**20  # GRIDTUNE_MAX_PAGE_MB=1 (plus at most one row)
        page = r.json()
        seen += [m["id"] for m in page["items"]]
        before = page["next_before_id"]
        if before is None:
            break
    assert sorted(seen) == sorted(ids)


def test_a_huge_bad_value_gets_a_small_422(sqlite_server):
    r = _post(sqlite_server.url, "/v1/clusters", {**examples.CLUSTER_CREATE, "name": "n" * 5_000_000})
    assert r.status_code == 422
    assert len(r.content) < 4000 and "name" in r.text


# -- slow clients ---------------------------------------------------------------------------


def _drain(sockets: list[socket.socket]) -> list[bytes]:
    """The status line each socket got before the server closed it (b"" for a bare close or reset)."""
    answers = []
    for s in sockets:
        data = b""
        with contextlib.suppress(OSError):
            while chunk := s.recv(65536):
                data += chunk
        answers.append(data.split(b"\r\n")[0])
        s.close()
    return answers


def test_slow_clients_are_timed_out_and_capped_without_starving_the_server(tmp_path):
    with serverproc.running_server(tmp_path / "server.log", database_url=f"sqlite:///{tmp_path / 's.db'}",
                                   extra_args=["--request-timeout", "1", "--limit-concurrency", "20",
                                               "--max-connections", "52"]) as srv:
        # a flood: more connections than limit + slack (52); each is answered 503 (or refused) and closed
        flood = []
        for _ in range(80):
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
            s.sendall(b"POST /v1/measurements HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            flood.append(s)
        answers = _drain(flood)
        assert set(answers) <= {b"HTTP/1.1 408 Request Timeout", b"HTTP/1.1 503 Service Unavailable", b""}, (
            set(answers)
        )
        # a few slow clients under the limit: half-sent headers, half-sent body; each gets 408 and is closed
        slow = []
        for head in (
            b"GET /livez HTTP/1.1\r\nHo",
            b"POST /v1/measurements HTTP/1.1\r\nHost: x\r\nContent-Length: 99\r\n\r\n{",
        ):
            for _ in range(3):
                s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
                s.sendall(head)
                slow.append(s)
        assert _drain(slow) == [b"HTTP/1.1 408 Request Timeout"] * 6
        assert httpx.get(srv.url + "/livez", timeout=30).status_code == 200
        log = srv.log.read_text()
    assert "Too many open files" not in log and len(log) < 20_000, log[-2000:]


# -- readiness and schema recovery -----------------------------------------------------------


def test_readiness_says_no_when_the_sqlite_file_is_immutable(tmp_path):
    db = tmp_path / "ro.db"
    with serverproc.running_server(tmp_path / "server.log", database_url=f"sqlite:///{db}") as srv:
        assert httpx.get(srv.url + "/readyz", timeout=30).status_code == 200
        if subprocess.run(["chattr", "+i", str(db)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not permitted here")
        try:
            r = httpx.get(srv.url + "/readyz", timeout=30)
            assert (
                r.status_code == 503 and r.json()["ready"] is False and "read-only" in r.json()["reason"]
            ), r.text
            assert httpx.get(srv.url + "/healthz", timeout=30).status_code == 503
            assert httpx.get(srv.url + "/livez", timeout=30).status_code == 200
        finally:
            subprocess.run(["chattr", "-i", str(db)], check=True)
        assert httpx.get(srv.url + "/readyz", timeout=30).status_code == 200


def test_tables_dropped_under_a_running_service_come_back(postgres_server, postgres_url):
    """What a dropped and recreated PostgreSQL database looks like to the service: no tables at all."""
    srv, prefix = postgres_server
    engine = sa.create_engine(postgres_url)
    with engine.begin() as conn:
        for table in ("measurements", "profiles", "alembic_version"):
            conn.execute(sa.text(f'DROP TABLE IF EXISTS "{prefix}{table}"'))
    engine.dispose()
    r = _post(srv.url, "/v1/measurements", SMALL_MEASUREMENT)
    assert r.status_code == 201, r.text[:300]
    assert httpx.get(srv.url + "/v1/clusters", timeout=30).status_code == 200
    r = httpx.get(srv.url + "/readyz", timeout=30)
    assert r.status_code == 200 and r.json()["ready"], r.text


def test_an_old_database_is_adopted_by_the_migrations(tmp_path):
    """A file created by gridtune 0.1 (create_all, no alembic table) keeps its rows and gets stamped."""
    from tuner.store import Store

    url = f"sqlite:///{tmp_path / 'v01.db'}"
    old = Store(url, create=False)
    old.metadata.create_all(old.engine)
    with old.engine.begin() as conn:
        conn.execute(old.profiles.insert().values(id="p", name="kept", profile={}, cluster=None,
                                                  created_at=sa.func.now()))
    old.close()
    store = Store(url)
    assert store.schema_revision() == store.head_revision()
    assert store.get_profile("p").name == "kept"


# -- the schema says what the API does; plausible ranges --------------------------------


def test_openapi_cluster_rules_and_options_agree_with_the_api(sqlite_server):
    srv = sqlite_server
    spec = httpx.get(srv.url + "/openapi.json", timeout=30).json()
    any_of = spec["components"]["schemas"]["ClusterIn"]["anyOf"]  # what the schema says a cluster needs
    only_profile = {"profile": {"collectives": []}}
    assert not any(set(rule["required"]) <= set(only_profile) for rule in any_of)  # invalid by the schema...
    assert any(set(rule["required"]) <= set(examples.PREDICT_EXPLICIT["cluster"]) for rule in any_of)
    r = _post(srv.url, "/v1/predict", {**examples.PREDICT, "cluster": only_profile})
    assert r.status_code == 422 and "cluster needs a 'preset'" in r.text, r.text[:300]  # ...and by the API
    for path, expected in (("/v1/clusters", {"GET", "POST"}), ("/v1/measurements", {"GET", "POST"}),
                           ("/v1/predict", {"POST"})):
        r = httpx.options(srv.url + path, timeout=30)
        assert r.status_code == 204
        assert expected <= {m.strip() for m in r.headers["allow"].split(",")}, r.headers["allow"]
    r = httpx.delete(srv.url + "/v1/clusters", timeout=30)
    assert r.status_code == 405 and {"GET", "POST"} <= {m.strip() for m in r.headers["allow"].split(",")}


def test_physically_absurd_constants_are_422_naming_the_plausible_range(sqlite_server):
    body = {
        **examples.PREDICT,
        "cluster": {**examples.PREDICT_EXPLICIT["cluster"], "inter_node_bandwidth_GBps": 1e-300},
    }
    r = _post(sqlite_server.url, "/v1/predict", body)
    assert r.status_code == 422
    assert "inter_node_bandwidth_GBps" in r.text and "plausible range 0.001 to 100000" in r.text, r.text[:400]
    assert httpx.get(sqlite_server.url + "/docs", timeout=30).status_code == 200


# -- offline docs, launch in the recommend answer ------------------------


def test_docs_pages_load_their_assets_from_this_server(sqlite_server):
    for page, asset in (("/docs", "swagger-ui-bundle.js"), ("/redoc", "redoc.standalone.js")):
        html = httpx.get(sqlite_server.url + page, timeout=30).text
        assert "cdn.jsdelivr.net" not in html and "unpkg.com" not in html
        (src,) = [part.split('"')[0] for part in html.split('src="')[1:] if asset in part.split('"')[0]]
        assert src.startswith("/")
        r = httpx.get(sqlite_server.url + src, timeout=30)
        assert r.status_code == 200 and len(r.content) > 100_000


def test_recommend_answers_carry_the_launch_of_the_best_plan(sqlite_server):
    body = {"model": {"preset": "tiny-gpt"}, "cluster": {"preset": "local-cpu", "num_gpus": 4},
            "training": {"global_batch_size": 8, "dtype": "fp32"}, "top_k": 3}
    rec = _post(sqlite_server.url, "/v1/recommend", body).json()
    assert rec["complete"] is True and set(rec["launch"]) == {"gridtune"}  # the stack it ranked
    assert "engine.init(G_data=" in rec["launch"]["gridtune"]["text"]
    assert rec["launch"]["gridtune"]["config"]["plan"]["G_data"] == rec["best"]["plan"]["G_data"]
    presets = httpx.get(sqlite_server.url + "/v1/presets", timeout=30).json()
    assert (
        "selene" in presets["clusters"]
        and "A100-80GB" in presets["gpus"]
        and "gpt3-175b" in presets["models"]
    )
