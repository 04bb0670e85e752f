"""/readyz says what a write will do: an immutable SQLite file and a PostgreSQL lock on one table,
under a running `gridtune serve`.

Before: with the SQLite file made immutable, /readyz said 503 while POST /v1/measurements answered
201 (into the WAL, lost at the next checkpoint); with an ACCESS EXCLUSIVE lock on one PostgreSQL
table, /readyz said "cannot take writes" while writes to the other table succeeded.
"""

from __future__ import annotations

import json
import subprocess
import uuid

import httpx
import pytest
import sqlalchemy as sa

from api import examples
from tests.api import serverproc
from tests.api.test_hostile import SMALL_MEASUREMENT


def _post(url: str, path: str, body: object) -> httpx.Response:
    return httpx.post(url + path, content=json.dumps(body).encode(),
                      headers={"content-type": "application/json"}, timeout=60)


def _count(url: str) -> int:
    return len(httpx.get(url + "/v1/measurements", params={"limit": 1000}, timeout=30).json()["items"])


def test_a_write_to_an_immutable_sqlite_file_fails_as_readiness_says(tmp_path):
    db = tmp_path / "immutable.db"
    with serverproc.running_server(tmp_path / "server.log", database_url=f"sqlite:///{db}") as srv:
        assert _post(srv.url, "/v1/measurements", SMALL_MEASUREMENT).status_code == 201
        ready = httpx.get(srv.url + "/readyz", timeout=30)
        assert ready.status_code == 200 and all(ready.json()["writable"].values()), ready.text
        assert {"profiles", "measurements"} <= set(ready.json()["writable"]), ready.text
        if subprocess.run(["chattr", "+i", str(db)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not permitted here")
        try:
            ready = httpx.get(srv.url + "/readyz", timeout=30)
            assert ready.status_code == 503 and "immutable" in ready.json()["reason"], ready.text
            assert not any(ready.json()["writable"].values()), ready.text
            for path, body in (("/v1/measurements", SMALL_MEASUREMENT),
                               ("/v1/clusters", examples.CLUSTER_CREATE)):
                r = _post(srv.url, path, body)
                assert r.status_code == 503, (path, r.status_code, r.text[:300])
                assert r.json()["detail"] == ready.json()["reason"], r.text  # the same words
                assert r.headers["retry-after"]
            assert _count(srv.url) == 1  # reads go on; the refused write is nowhere
            assert httpx.get(srv.url + "/livez", timeout=30).status_code == 200
        finally:
            subprocess.run(["chattr", "-i", str(db)], check=True)
        assert _post(srv.url, "/v1/measurements", SMALL_MEASUREMENT).status_code == 201
        assert httpx.get(srv.url + "/readyz", timeout=30).status_code == 200
        assert _count(srv.url) == 2


def test_a_lock_on_one_postgres_table_is_described_per_table(tmp_path, postgres_url):
    prefix = f"rw{uuid.uuid4().hex[:8]}_"
    with serverproc.running_server(
        tmp_path / "server.log", database_url=postgres_url,
        env={"GRIDTUNE_TABLE_PREFIX": prefix, "GRIDTUNE_DB_LOCK_TIMEOUT_S": "1"},
    ) as srv:
        engine = sa.create_engine(postgres_url)
        try:
            assert httpx.get(srv.url + "/readyz", timeout=30).status_code == 200
            for locked, other, write_locked, write_other in (
                ("measurements", "profiles", ("/v1/measurements", SMALL_MEASUREMENT),
                 ("/v1/clusters", examples.CLUSTER_CREATE)),
                ("profiles", "measurements", ("/v1/clusters", examples.CLUSTER_CREATE),
                 ("/v1/measurements", SMALL_MEASUREMENT)),
            ):
                with engine.connect() as conn:
                    trans = conn.begin()
                    conn.execute(sa.text(f'LOCK TABLE "{prefix}{locked}" IN ACCESS EXCLUSIVE MODE'))
                    try:
                        ready = httpx.get(srv.url + "/readyz", timeout=30)
                        assert ready.status_code == 503, ready.text
                        writable = ready.json()["writable"]
                        assert writable[locked] is False and writable[other] is True, ready.text
                        assert sum(not ok for ok in writable.values()) == 1, ready.text  # only that one
                        reason = ready.json()["reason"]
                        assert f"{locked} cannot take writes" in reason and f"{other} takes writes" in reason
                        r = _post(srv.url, *write_other)  # what readiness says: this table takes writes...
                        assert r.status_code == 201, (write_other[0], r.text[:300])
                        r = _post(srv.url, *write_locked)  # ...and this one does not
                        assert r.status_code == 503, (write_locked[0], r.status_code, r.text[:300])
                    finally:
                        trans.rollback()
                ready = httpx.get(srv.url + "/readyz", timeout=30)
                assert ready.status_code == 200 and all(ready.json()["writable"].values()), ready.text
        finally:
            engine.dispose()
            from tuner.store import Store

            Store(postgres_url, table_prefix=prefix, create=False).drop_tables()
