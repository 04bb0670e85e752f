"""The durable store of cluster profiles and measured training steps (SQLAlchemy 2).

Why: the closed loop (DESIGN.md section 4) needs somewhere to keep the constants that
`gridtune profile` fits and the step times that `engine.train` measures, so that later predictions
for that cluster can use them. One `Store` works on an embedded SQLite file (the default, no server
to run) and on any SQLAlchemy URL, e.g. PostgreSQL for a shared service:

    from tuner.store import Store
    store = Store("sqlite:////tmp/gridtune.db")          # or Store() for the default file
    p = store.add_profile(name="my-a100s", profile={...}, cluster={"preset": "selene"})
    store.add_measurement(model={...}, cluster={...}, training={...}, plan={...},
                          measured={"iteration_time_s": 1.23}, cluster_id=p.id)
    for m in store.list_measurements(cluster_id=p.id, limit=100):
        print(m.created_at, m.measured["iteration_time_s"])

Durability: every write is one transaction that has committed before the method returns. On
SQLite the file runs in WAL mode with `synchronous=FULL`, so an acknowledged write survives the
process being killed (SIGKILL) and, with FULL, an OS crash; concurrent writers (threads or
processes) wait on `busy_timeout` instead of failing. JSON payloads are stored as given (the
profile's extra keys "provenance", "fits", "expected" included).

`table_prefix` lets several stores share one database (tests use a unique prefix per run so
parallel runs against one PostgreSQL server never collide; `drop_tables()` cleans up).
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import pathlib
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

ENV_DATABASE_URL = "GRIDTUNE_DATABASE_URL"
SQLITE_BUSY_TIMEOUT_MS = 30_000
MAX_LIST_LIMIT = 10_000


def default_database_path() -> pathlib.Path:
    """The SQLite file used when GRIDTUNE_DATABASE_URL is unset: $XDG_DATA_HOME/gridtune/gridtune.db."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return pathlib.Path(base) / "gridtune" / "gridtune.db"


def default_database_url() -> str:
    """GRIDTUNE_DATABASE_URL if set, else a SQLite URL for `default_database_path()`."""
    url = os.environ.get(ENV_DATABASE_URL, "").strip()
    return url or f"sqlite:///{default_database_path()}"


def _utcnow() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def _as_utc(value: _dt.datetime) -> _dt.datetime:
    # SQLite hands back naive datetimes; everything is written in UTC.
    if value.tzinfo is None:
        return value.replace(tzinfo=_dt.timezone.utc)
    return value.astimezone(_dt.timezone.utc)


def check_json(where: str, value: Any, _depth: int = 0) -> None:
    """Reject what JSON cannot carry (NaN, infinities, non-string keys, odd types), naming the path.

    Stored payloads must read back as valid JSON: a NaN written by one client would otherwise break
    every later listing.
    """
    if _depth > 64:
        raise ValueError(f"{where} is nested more than 64 levels deep")
    if value is None or isinstance(value, (bool, str, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where} must be a finite number, got {value!r}")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{where} has a non-string key {key!r}")
            check_json(f"{where}.{key}", item, _depth + 1)
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_json(f"{where}[{i}]", item, _depth + 1)
        return
    raise ValueError(f"{where} holds a {type(value).__name__}, which is not JSON: {value!r}")


# --------------------------------------------------------------------------------------------
# What the store hands out
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StoredProfile:
    """A cluster profile as uploaded (`POST /v1/clusters`, `gridtune profile --upload`).

    `profile` is the JSON of `perfmodels.io.profile_to_dict` plus any extra keys, verbatim;
    `cluster` the optional Cluster JSON (preset or fields) it was measured on.
    """

    id: str
    name: str
    profile: dict[str, Any]
    cluster: dict[str, Any] | None
    created_at: _dt.datetime


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """One measured training step configuration, as the engine sent it back.

    `cluster_id` is the stored profile's id when the run named one, else the cluster's name;
    `measured` holds at least `iteration_time_s` and the per-component times; `prediction` what
    the model had predicted for it (optional), so calibration can compare the two.
    """

    id: int
    cluster_id: str | None
    model: dict[str, Any]
    cluster: dict[str, Any]
    training: dict[str, Any]
    plan: dict[str, Any]
    measured: dict[str, Any]
    prediction: dict[str, Any] | None
    created_at: _dt.datetime


# --------------------------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------------------------


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    try:
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute("PRAGMA foreign_keys=ON")
    finally:
        cur.close()


def _make_engine(url: str) -> Engine:
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return sa.create_engine(url, pool_pre_ping=True, future=True)
    database = parsed.database or ""
    in_memory = database in ("", ":memory:") or database.startswith("file::memory:")
    if in_memory:
        # One shared connection, or every thread would see its own empty database.
        engine = sa.create_engine(
            url, connect_args={"check_same_thread": False}, poolclass=sa.pool.StaticPool, future=True
        )
    else:
        pathlib.Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
            pool_size=8,
            max_overflow=16,
            future=True,
        )
    sa.event.listen(engine, "connect", _sqlite_pragmas)
    return engine


class Store:
    """Profiles and measurements in any SQLAlchemy database; thread-safe; one instance per process.

    Tables are created on construction (idempotent). Methods raise `KeyError` only from
    `get_profile(..., required=True)`; bad payloads raise `ValueError` naming the field.
    """

    def __init__(self, url: str | None = None, *, table_prefix: str = "gridtune_", create: bool = True) -> None:
        if not table_prefix.replace("_", "").isalnum():
            raise ValueError(f"table_prefix must be letters, digits and '_', got {table_prefix!r}")
        self.url = url or default_database_url()
        self.table_prefix = table_prefix
        self.engine = _make_engine(self.url)
        self._in_memory = self.engine.dialect.name == "sqlite" and isinstance(self.engine.pool, sa.pool.StaticPool)
        self.metadata = sa.MetaData()
        self.profiles = sa.Table(
            f"{table_prefix}profiles",
            self.metadata,
            sa.Column("id", sa.String(64), primary_key=True),
            sa.Column("name", sa.String(200), nullable=False, index=True),
            sa.Column("profile", sa.JSON, nullable=False),
            sa.Column("cluster", sa.JSON(none_as_null=True), nullable=True),
            sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        )
        self.measurements = sa.Table(
            f"{table_prefix}measurements",
            self.metadata,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("cluster_id", sa.String(200), nullable=True, index=True),
            sa.Column("model", sa.JSON, nullable=False),
            sa.Column("cluster", sa.JSON, nullable=False),
            sa.Column("training", sa.JSON, nullable=False),
            sa.Column("plan", sa.JSON, nullable=False),
            sa.Column("measured", sa.JSON, nullable=False),
            sa.Column("prediction", sa.JSON(none_as_null=True), nullable=True),
            sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        )
        self._lock = threading.Lock()
        if create:
            self.create_tables()

    # -- lifecycle -------------------------------------------------------------------------

    def create_tables(self) -> None:
        """Create the tables if missing. Several processes may start at once (uvicorn --workers):
        the loser of a CREATE TABLE race sees the winner's tables on the next try."""
        with self._lock:
            for attempt in range(8):
                try:
                    self.metadata.create_all(self.engine, checkfirst=True)
                    return
                except sa.exc.DBAPIError:
                    if attempt == 7:
                        raise
                    time.sleep(0.05 * (attempt + 1))

    def drop_tables(self) -> None:
        """Drop this store's tables (tests clean up with it)."""
        self.metadata.drop_all(self.engine, checkfirst=True)

    def close(self) -> None:
        self.engine.dispose()

    def release_connections(self) -> None:
        """Close pooled connections (server shutdown); the store still works afterwards.

        An in-memory SQLite database lives in its one connection, so that one is kept.
        """
        if not self._in_memory:
            self.engine.dispose()

    def ping(self) -> bool:
        """True when the database answers a trivial query (used by /healthz)."""
        try:
            with self.engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
            return True
        except sa.exc.SQLAlchemyError:
            return False

    @property
    def backend(self) -> str:
        return self.engine.dialect.name

    # -- profiles --------------------------------------------------------------------------

    def add_profile(
        self, *, name: str, profile: Mapping[str, Any], cluster: Mapping[str, Any] | None = None
    ) -> StoredProfile:
        """Store a profile under a fresh id; returns it once committed."""
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            raise ValueError(f"name must be a non-empty string of at most 200 characters, got {name!r}")
        check_json("profile", dict(profile))
        if cluster is not None:
            check_json("cluster", dict(cluster))
        row = {
            "id": uuid.uuid4().hex[:16],
            "name": name,
            "profile": dict(profile),
            "cluster": dict(cluster) if cluster is not None else None,
            "created_at": _utcnow(),
        }
        with self.engine.begin() as conn:
            conn.execute(self.profiles.insert().values(**row))
        return StoredProfile(**row)

    def get_profile(self, profile_id: str) -> StoredProfile | None:
        """The profile with this id, else the newest one with this name, else None."""
        t = self.profiles
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(t).where(t.c.id == profile_id)).mappings().first()
            if row is None:
                row = (
                    conn.execute(sa.select(t).where(t.c.name == profile_id).order_by(t.c.created_at.desc()).limit(1))
                    .mappings()
                    .first()
                )
        return self._profile(row) if row is not None else None

    def list_profiles(self, *, limit: int = 100) -> list[StoredProfile]:
        """Newest first."""
        limit = max(1, min(int(limit), MAX_LIST_LIMIT))
        t = self.profiles
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(t).order_by(t.c.created_at.desc(), t.c.id).limit(limit)).mappings().all()
        return [self._profile(r) for r in rows]

    @staticmethod
    def _profile(row: Mapping[str, Any]) -> StoredProfile:
        return StoredProfile(
            id=row["id"],
            name=row["name"],
            profile=dict(row["profile"]),
            cluster=dict(row["cluster"]) if row["cluster"] is not None else None,
            created_at=_as_utc(row["created_at"]),
        )

    # -- measurements ----------------------------------------------------------------------

    def add_measurement(
        self,
        *,
        model: Mapping[str, Any],
        cluster: Mapping[str, Any],
        training: Mapping[str, Any],
        plan: Mapping[str, Any],
        measured: Mapping[str, Any],
        cluster_id: str | None = None,
        prediction: Mapping[str, Any] | None = None,
    ) -> Measurement:
        """Store one measurement; returns it (with its id) once the transaction has committed."""
        payload = {
            "model": dict(model),
            "cluster": dict(cluster),
            "training": dict(training),
            "plan": dict(plan),
            "measured": dict(measured),
            "prediction": dict(prediction) if prediction is not None else None,
        }
        for key, value in payload.items():
            check_json(key, value)
        if cluster_id is not None and (not isinstance(cluster_id, str) or len(cluster_id) > 200):
            raise ValueError(f"cluster_id must be a string of at most 200 characters, got {cluster_id!r}")
        row = {**payload, "cluster_id": cluster_id, "created_at": _utcnow()}
        with self.engine.begin() as conn:
            result = conn.execute(self.measurements.insert().values(**row))
            new_id = int(result.inserted_primary_key[0])
        return Measurement(id=new_id, **row)

    def list_measurements(
        self, cluster_id: str | None = None, limit: int = 100, *, before_id: int | None = None
    ) -> list[Measurement]:
        """Newest first; `cluster_id` filters, `before_id` pages (pass the last id you saw)."""
        limit = max(1, min(int(limit), MAX_LIST_LIMIT))
        t = self.measurements
        query = sa.select(t).order_by(t.c.id.desc()).limit(limit)
        if cluster_id is not None:
            query = query.where(t.c.cluster_id == cluster_id)
        if before_id is not None:
            query = query.where(t.c.id < int(before_id))
        with self.engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
        return [
            Measurement(
                id=int(r["id"]),
                cluster_id=r["cluster_id"],
                model=dict(r["model"]),
                cluster=dict(r["cluster"]),
                training=dict(r["training"]),
                plan=dict(r["plan"]),
                measured=dict(r["measured"]),
                prediction=dict(r["prediction"]) if r["prediction"] is not None else None,
                created_at=_as_utc(r["created_at"]),
            )
            for r in rows
        ]

    def count_measurements(self, cluster_id: str | None = None) -> int:
        t = self.measurements
        query = sa.select(sa.func.count()).select_from(t)
        if cluster_id is not None:
            query = query.where(t.c.cluster_id == cluster_id)
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())


def open_store(url: str | None = None) -> Store:
    """A Store on `url`, GRIDTUNE_DATABASE_URL, or the default SQLite file, in that order."""
    return Store(url or default_database_url())
