"""The durable store of cluster profiles and measured training steps (SQLAlchemy 2).

Why: the closed loop (tuner/closed_loop/, docs/architecture.md) needs somewhere to keep the constants that
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

Hostile input and exhausted resources (why each rule is here):

- text columns (names, ids) refuse NUL characters (PostgreSQL cannot store them) and every string
  refuses unpaired UTF-16 surrogates (they cannot be encoded as UTF-8, so a stored one would break
  every later read); lookups with such keys simply find nothing;
- free-form JSON (measured extras, prediction, provenance, fits) is bounded in bytes per field and
  per row (`MAX_FREEFORM_BYTES`, `MAX_ROW_BYTES`), and `page_measurements`/`page_profiles` stop a
  page at `max_bytes` as well as at `limit`, streaming rows from the database;
- writes wait at most `WRITE_WAIT_S` for one of a few write slots, and SQLite's busy timeout or
  PostgreSQL's lock timeout is 5 s (GRIDTUNE_DB_LOCK_TIMEOUT_S), then `StoreBusy` (the service
  answers 503): a writer stuck behind another process's lock can hold neither all pooled
  connections nor a thread for long;
- the schema is managed by alembic migrations (`tuner/migrations/`): `Store` upgrades the database
  when it opens it, and again when a table has gone missing (a PostgreSQL database dropped and
  recreated), so the service recovers without a restart; `readiness()` says whether the store can
  write right now, on its own short-lived connection.

`table_prefix` lets several stores share one database (tests use a unique prefix per run so
parallel runs against one PostgreSQL server never collide; `drop_tables()` cleans up).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import pathlib
import re
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Engine

ENV_DATABASE_URL = "GRIDTUNE_DATABASE_URL"
ENV_LOCK_TIMEOUT = "GRIDTUNE_DB_LOCK_TIMEOUT_S"
SQLITE_BUSY_TIMEOUT_MS = 5_000
"""How long a SQLite writer waits for another writer's lock before giving up (StoreBusy / 503)."""
POSTGRES_LOCK_TIMEOUT_MS = 5_000
POSTGRES_STATEMENT_TIMEOUT_MS = 30_000
POOL_TIMEOUT_S = 3.0
"""How long a request waits for a pooled connection before the store says it is busy."""
WRITE_SLOTS = 4
WRITE_WAIT_S = 3.0
MAX_LIST_LIMIT = 10_000
MAX_TEXT_CHARS = 200
MAX_FREEFORM_BYTES = 256 * 1024
"""Largest free-form JSON field (measured extras, prediction, provenance, fits, expected), encoded."""
MAX_ROW_BYTES = 4 * 1024 * 1024
"""Largest stored document (a whole profile, or a measurement with a long explicit layer list)."""
DEFAULT_PAGE_BYTES = 8 * 1024 * 1024
"""A list page stops after this many bytes of JSON (it always holds at least one row)."""
INT4_MAX = 2**31 - 1
_BAD_CHARS = re.compile("[\x00\ud800-\udfff]")
_SURROGATES = re.compile("[\ud800-\udfff]")
T = TypeVar("T")


class StoreBusy(Exception):
    """The database is locked or every connection is in use; retry later (the service answers 503)."""


class StoreUnwritable(StoreBusy):
    """The database cannot take writes now (a read-only or immutable SQLite file): a write fails the
    same way, and with the same reason, as `Store.readiness` says (the service answers 503)."""


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
    if isinstance(value, str):
        if _SURROGATES.search(value):
            raise ValueError(
                f"{where} holds an unpaired UTF-16 surrogate, which UTF-8 cannot carry: {_short(value)}"
            )
        return
    if value is None or isinstance(value, (bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where} must be a finite number, got {value!r}")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{where} has a non-string key {key!r}")
            if _SURROGATES.search(key):
                raise ValueError(f"{where} has a key with an unpaired UTF-16 surrogate: {_short(key)}")
            check_json(f"{where}.{key}", item, _depth + 1)
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_json(f"{where}[{i}]", item, _depth + 1)
        return
    raise ValueError(f"{where} holds a {type(value).__name__}, which is not JSON: {value!r}")


def _short(value: Any, limit: int = 80) -> str:
    text = ascii(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_text(where: str, value: Any, *, max_chars: int = MAX_TEXT_CHARS, allow_empty: bool = False) -> str:
    """A name or id for a text column: a string of at most `max_chars`, no NUL, no lone surrogate."""
    if not isinstance(value, str) or len(value) > max_chars or (not allow_empty and not value.strip()):
        raise ValueError(
            f"{where} must be a non-empty string of at most {max_chars} characters, got {_short(value)}"
        )
    bad = _BAD_CHARS.search(value)
    if bad is not None:
        what = "a NUL character" if bad.group() == "\x00" else "an unpaired UTF-16 surrogate"
        raise ValueError(f"{where} must not contain {what}, got {_short(value)}")
    return value


def json_size(value: Any) -> int:
    """Bytes of `value` as compact JSON (what a row costs to store and to send)."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "replace"))


def check_size(where: str, value: Any, max_bytes: int) -> int:
    size = json_size(value)
    if size > max_bytes:
        raise ValueError(f"{where} is {size:,} bytes of JSON; at most {max_bytes:,} are stored")
    return size


def scrub(value: Any) -> Any:
    """Replace unpaired surrogates by U+FFFD (rows stored before they were refused must stay readable)."""
    if isinstance(value, str):
        return _SURROGATES.sub("\ufffd", value)
    if isinstance(value, dict):
        return {scrub(k): scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def _readable(value: Any) -> tuple[Any, int]:
    """(value, its JSON size), scrubbed only when it would not encode as UTF-8."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    try:
        return value, len(text.encode("utf-8"))
    except UnicodeEncodeError:
        value = scrub(value)
        return value, json_size(value)


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


# The JSON documents of a Measurement (its other fields are the id, cluster_id and created_at).
MEASUREMENT_DOCUMENTS = ("model", "cluster", "training", "plan", "measured", "prediction")


# --------------------------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Page:
    """One page of a listing: the items and the cursor of the next (older) page, None at the end."""

    items: list[Any]
    next_before_id: int | None = None
    next_offset: int | None = None


@dataclass(frozen=True, kw_only=True)
class Readiness:
    """Whether the store can take writes now (`/readyz`), and why not."""

    ready: bool
    reason: str = ""
    schema_repaired: bool = False
    tables: tuple[tuple[str, str], ...] = ()
    """(table without its prefix, "" when it takes a write now, else why not) for each table the
    service writes, so a lock on one table is described as what it is."""


def _sqlite_pragmas(dbapi_conn: Any, _record: Any, busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS) -> None:
    cur = dbapi_conn.cursor()
    try:
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute("PRAGMA foreign_keys=ON")
    finally:
        cur.close()


def _postgres_options(lock_timeout_ms: int, statement_timeout_ms: int) -> dict[str, Any]:
    return {
        "connect_timeout": 5,
        "options": f"-c lock_timeout={int(lock_timeout_ms)} -c statement_timeout={int(statement_timeout_ms)}",
    }


def _make_engine(url: str, *, probe: bool = False, lock_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS) -> Engine:
    """The store's pooled engine, or (`probe=True`) an unpooled one with short timeouts for health checks."""
    parsed = sa.engine.make_url(url)
    backend = parsed.get_backend_name()
    if backend != "sqlite":
        kwargs: dict[str, Any] = {"future": True}
        if backend == "postgresql" and parsed.get_driver_name() in ("psycopg", "psycopg2", "psycopg3"):
            kwargs["connect_args"] = (_postgres_options(1000, 2000) if probe else
                                      _postgres_options(lock_timeout_ms, POSTGRES_STATEMENT_TIMEOUT_MS))
            if probe:
                kwargs["connect_args"]["connect_timeout"] = 2
        if probe:
            return sa.create_engine(url, poolclass=sa.pool.NullPool, **kwargs)
        return sa.create_engine(
            url, pool_pre_ping=True, pool_size=10, max_overflow=10, pool_timeout=POOL_TIMEOUT_S, **kwargs
        )
    database = parsed.database or ""
    in_memory = database in ("", ":memory:") or database.startswith("file::memory:")
    if in_memory:
        # One shared connection, or every thread would see its own empty database.
        engine = sa.create_engine(
            url, connect_args={"check_same_thread": False}, poolclass=sa.pool.StaticPool, future=True
        )
    elif probe:
        engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 1.0},
                                  poolclass=sa.pool.NullPool, future=True)
        sa.event.listen(engine, "connect", lambda c, r: _sqlite_pragmas(c, r, busy_timeout_ms=1000))
        return engine
    else:
        pathlib.Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": lock_timeout_ms / 1000},
            pool_size=8,
            max_overflow=16,
            pool_timeout=POOL_TIMEOUT_S,
            future=True,
        )
    sa.event.listen(engine, "connect", lambda c, r: _sqlite_pragmas(c, r, busy_timeout_ms=lock_timeout_ms))
    return engine


def _missing_table(exc: BaseException) -> bool:
    """True when the database says a table does not exist (PostgreSQL 42P01, SQLite 'no such table')."""
    orig = getattr(exc, "orig", None)
    if getattr(orig, "sqlstate", None) == "42P01":
        return True
    return "no such table" in str(orig or exc)


def _first_line(exc: BaseException) -> str:
    """The first line of the driver's message (SQLAlchemy appends SQL and a link), at most 300 chars."""
    lines = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return lines[0][:300] if lines else type(exc).__name__


def _busy(exc: BaseException) -> bool:
    """True for lock waits that ran out (SQLite 'database is locked', PostgreSQL 55P03/57014)."""
    orig = getattr(exc, "orig", None)
    if getattr(orig, "sqlstate", None) in ("55P03", "57014", "40P01"):
        return True
    text = str(orig or exc)
    return "database is locked" in text or "database table is locked" in text


MIGRATIONS = pathlib.Path(__file__).with_name("migrations")
_ALEMBIC_LOCK = threading.Lock()
"""alembic's `context` and `op` are process-wide proxies: two stores in one process (threads) must not
migrate at the same moment. A lock, not state: nothing else is kept at module level."""


class Store:
    """Profiles and measurements in any SQLAlchemy database; thread-safe; one instance per process.

    The schema is brought to the newest migration on construction (idempotent; `create=False`
    skips it). Methods raise `KeyError` only from `get_profile(..., required=True)`; bad payloads
    raise `ValueError` naming the field; a locked or saturated database raises `StoreBusy`.
    """

    def __init__(self, url: str | None = None, *, table_prefix: str = "gridtune_", create: bool = True,
                 lock_timeout_s: float | None = None) -> None:
        if not table_prefix.replace("_", "").isalnum():
            raise ValueError(f"table_prefix must be letters, digits and '_', got {table_prefix!r}")
        self.url = url or default_database_url()
        self.table_prefix = table_prefix
        if lock_timeout_s is None:
            lock_timeout_s = float(os.environ.get(ENV_LOCK_TIMEOUT, "") or SQLITE_BUSY_TIMEOUT_MS / 1000)
        if not 0 < lock_timeout_s <= 600:
            raise ValueError(
                f"{ENV_LOCK_TIMEOUT} (lock_timeout_s) must be in (0, 600] seconds, got {lock_timeout_s}"
            )
        self.lock_timeout_s = lock_timeout_s
        self._write_wait_s = min(WRITE_WAIT_S, lock_timeout_s)
        self.engine = _make_engine(self.url, lock_timeout_ms=int(lock_timeout_s * 1000))
        self._in_memory = self.engine.dialect.name == "sqlite" and isinstance(
            self.engine.pool, sa.pool.StaticPool
        )
        self._probe_engine = self.engine if self._in_memory else _make_engine(self.url, probe=True)
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
        self._write_slots = threading.BoundedSemaphore(WRITE_SLOTS)
        self._head: str | None = None
        if create:
            self.create_tables()

    # -- lifecycle -------------------------------------------------------------------------

    def _alembic_config(self, connection: Any) -> Any:
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        cfg.attributes["connection"] = connection
        cfg.attributes["table_prefix"] = self.table_prefix
        return cfg

    def head_revision(self) -> str:
        """The newest migration in this copy of gridtune (read once: the files do not change)."""
        if self._head is None:
            from alembic.script import ScriptDirectory

            self._head = str(ScriptDirectory(str(MIGRATIONS)).get_current_head())
        return self._head

    def schema_revision(self, engine: Engine | None = None) -> str | None:
        """The migration the database is at (None: not managed yet, or no tables)."""
        version = sa.Table(f"{self.table_prefix}alembic_version", sa.MetaData(),
                           sa.Column("version_num", sa.String(32)))
        try:
            with (engine or self.engine).connect() as conn:
                return conn.execute(sa.select(version.c.version_num)).scalar()
        except sa.exc.DBAPIError as exc:
            if _missing_table(exc):
                return None
            raise

    def migrate(self) -> None:
        """Upgrade the schema to the newest migration (`alembic upgrade head`). Several processes may
        start at once (uvicorn --workers): PostgreSQL serialises them on an advisory lock, and on
        SQLite the loser of a race retries and finds the winner's tables."""
        from alembic import command

        with self._lock, _ALEMBIC_LOCK:
            for attempt in range(8):
                try:
                    with self.engine.begin() as conn:
                        if conn.dialect.name == "postgresql":
                            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"),
                                         {"k": zlib.crc32(f"gridtune-migrate-{self.table_prefix}".encode())})
                        command.upgrade(self._alembic_config(conn), "head")
                    return
                except sa.exc.DBAPIError:
                    if attempt == 7:
                        raise
                    time.sleep(0.05 * (attempt + 1))

    def create_tables(self) -> None:
        """Create or upgrade the tables (kept name: `migrate()` does it with alembic)."""
        self.migrate()

    def drop_tables(self) -> None:
        """Drop this store's tables and its migration record (tests clean up with it)."""
        self.metadata.drop_all(self.engine, checkfirst=True)
        with self.engine.begin() as conn:
            conn.execute(sa.text(f'DROP TABLE IF EXISTS "{self.table_prefix}alembic_version"'))

    def close(self) -> None:
        self.engine.dispose()
        if self._probe_engine is not self.engine:
            self._probe_engine.dispose()

    def release_connections(self) -> None:
        """Close pooled connections (server shutdown); the store still works afterwards.

        An in-memory SQLite database lives in its one connection, so that one is kept.
        """
        if not self._in_memory:
            self.engine.dispose()

    def ping(self) -> bool:
        """True when the database answers a trivial query, on a fresh short-timeout connection."""
        try:
            with self._probe_engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
            return True
        except sa.exc.SQLAlchemyError:
            return False

    def readiness(self) -> Readiness:
        """Can the store take a write now, table by table? Checks, on its own short-lived connection
        (never the pool, so saturated writers cannot delay it by more than a second or two a table):

        1. the SQLite file, its -wal/-shm and its folder are writable (the check every write makes
           first, so a write fails as readiness says, not into the WAL of an immutable file);
        2. the schema is at the newest migration, else migrates it (a dropped and recreated
           PostgreSQL database gets its tables back here, without a restart);
        3. each table the service writes takes a write: a DELETE that matches nothing, rolled back,
           fails on a read-only PostgreSQL transaction or a lock on that table (PostgreSQL's
           `LOCK TABLE`, SQLite's database lock) held longer than a second.
        """
        repaired = False
        names = [t.name[len(self.table_prefix):] for t in self.metadata.sorted_tables]
        unwritable = self._unwritable_reason()
        if unwritable:
            return Readiness(ready=False, reason=unwritable, tables=tuple((n, unwritable) for n in names))
        try:
            if self.schema_revision(self._probe_engine) != self.head_revision():
                self.migrate()
                repaired = True
        except sa.exc.SQLAlchemyError as exc:
            reason = f"the database cannot take writes: {_first_line(exc)}"
            return Readiness(ready=False, reason=reason, schema_repaired=repaired,
                             tables=tuple((n, reason) for n in names))
        tables = []
        try:
            with self._probe_engine.connect() as conn:
                for name, table in zip(names, self.metadata.sorted_tables, strict=True):
                    trans = conn.begin()
                    try:
                        conn.execute(table.delete().where(sa.false()))
                        tables.append((name, ""))
                    except sa.exc.SQLAlchemyError as exc:
                        tables.append((name, _first_line(exc)))
                    finally:
                        trans.rollback()
        except sa.exc.SQLAlchemyError as exc:  # no connection at all
            reason = f"the database cannot take writes: {_first_line(exc)}"
            return Readiness(ready=False, reason=reason, schema_repaired=repaired,
                             tables=tuple((n, reason) for n in names))
        blocked = [(n, why) for n, why in tables if why]
        if not blocked:
            return Readiness(ready=True, reason="", schema_repaired=repaired, tables=tuple(tables))
        takes = [n for n, why in tables if not why]
        reason = "; ".join(f"{n} cannot take writes: {why}" for n, why in blocked)
        if takes:
            reason += f" ({', '.join(takes)} {'takes' if len(takes) == 1 else 'take'} writes)"
        return Readiness(ready=False, reason=f"the database cannot take all writes: {reason}",
                         schema_repaired=repaired, tables=tuple(tables))

    def _unwritable_reason(self) -> str:
        """Why a write cannot succeed now ("" when it may): the SQLite file check of `readiness`."""
        unwritable = self._unwritable_sqlite_file()
        if not unwritable:
            return ""
        return f"the database cannot take writes: SQLite file {unwritable} is read-only or immutable"

    def _unwritable_sqlite_file(self) -> str | None:
        """The first of the SQLite file, its -wal/-shm and its folder that this process cannot write.

        Checked by permission, not by writing: SQLite shares one file descriptor per file within a
        process, so a fresh connection would reuse the pool's writable one and not notice."""
        if self.backend != "sqlite" or self._in_memory:
            return None
        database = pathlib.Path(self.engine.url.database or "").expanduser()
        candidates = [
            database,
            database.with_name(database.name + "-wal"),
            database.with_name(database.name + "-shm"),
        ]
        for path in candidates:
            if path.exists() and not os.access(path, os.W_OK):
                return str(path)
        if not os.access(database.parent, os.W_OK):
            return str(database.parent)
        return None

    @property
    def backend(self) -> str:
        return self.engine.dialect.name

    # -- guards ----------------------------------------------------------------------------

    def _run(self, fn: Callable[[], T], *, write: bool = False) -> T:
        """Run one database call: a table gone missing is recreated once and the call retried;
        lock waits and an exhausted pool become `StoreBusy`; writes first take a write slot."""
        if write:
            unwritable = self._unwritable_reason()
            if unwritable:  # else SQLite would append to the WAL of an immutable file and say "done"
                raise StoreUnwritable(unwritable)
        if write and not self._write_slots.acquire(timeout=self._write_wait_s):
            raise StoreBusy(
                f"{WRITE_SLOTS} writes are already waiting on the database for {self._write_wait_s:g} s"
            )
        try:
            try:
                return fn()
            except sa.exc.DBAPIError as exc:
                if not _missing_table(exc):
                    raise
                self.migrate()
                return fn()
        except sa.exc.TimeoutError as exc:  # QueuePool: every connection in use
            raise StoreBusy(
                f"every database connection is in use ({str(exc).splitlines()[0][:120]})"
            ) from None
        except sa.exc.OperationalError as exc:
            if _busy(exc):
                raise StoreBusy(
                    f"the database is locked by another writer "
                    f"({str(exc.orig).strip().splitlines()[0][:120]})"
                ) from None
            raise
        finally:
            if write:
                self._write_slots.release()

    # -- profiles --------------------------------------------------------------------------

    def add_profile(
        self, *, name: str, profile: Mapping[str, Any], cluster: Mapping[str, Any] | None = None
    ) -> StoredProfile:
        """Store a profile under a fresh id; returns it once committed."""
        check_text("name", name)
        check_json("profile", dict(profile))
        for extra in ("provenance", "fits", "expected"):
            if extra in profile:
                check_size(f"profile.{extra}", profile[extra], MAX_FREEFORM_BYTES)
        check_size("profile", dict(profile), MAX_ROW_BYTES)
        if cluster is not None:
            check_json("cluster", dict(cluster))
            check_size("cluster", dict(cluster), MAX_FREEFORM_BYTES)
        row = {
            "id": uuid.uuid4().hex[:16],
            "name": name,
            "profile": dict(profile),
            "cluster": dict(cluster) if cluster is not None else None,
            "created_at": _utcnow(),
        }

        def insert() -> None:
            with self.engine.begin() as conn:
                conn.execute(self.profiles.insert().values(**row))

        self._run(insert, write=True)
        return StoredProfile(**row)

    def get_profile(self, profile_id: str) -> StoredProfile | None:
        """The profile with this id, else the newest one with this name, else None."""
        if (
            not isinstance(profile_id, str)
            or len(profile_id) > MAX_TEXT_CHARS
            or _BAD_CHARS.search(profile_id)
        ):
            return None  # no stored id or name can hold it (and PostgreSQL would refuse a NUL)
        t = self.profiles

        def fetch() -> Any:
            with self.engine.connect() as conn:
                row = conn.execute(sa.select(t).where(t.c.id == profile_id)).mappings().first()
                if row is None:
                    row = (conn.execute(sa.select(t).where(t.c.name == profile_id)
                                        .order_by(t.c.created_at.desc()).limit(1)).mappings().first())
                return row

        row = self._run(fetch)
        return self._profile(row)[0] if row is not None else None

    def list_profiles(self, *, limit: int = 100) -> list[StoredProfile]:
        """Newest first."""
        return self.page_profiles(limit=limit).items

    def page_profiles(self, *, limit: int = 100, offset: int = 0, max_bytes: int | None = None) -> Page:
        """Newest first, at most `limit` rows and about `max_bytes` of JSON (at least one row)."""
        limit = max(1, min(int(limit), MAX_LIST_LIMIT))
        offset = max(0, int(offset))
        t = self.profiles
        query = sa.select(t).order_by(t.c.created_at.desc(), t.c.id).offset(offset).limit(limit)

        def fetch() -> Page:
            items, more = self._bounded(query, self._profile, limit, max_bytes)
            return Page(items=items, next_offset=offset + len(items) if more else None)

        return self._run(fetch)

    @staticmethod
    def _profile(row: Mapping[str, Any]) -> tuple[StoredProfile, int]:
        profile, size = _readable(dict(row["profile"]))
        cluster, csize = _readable(dict(row["cluster"])) if row["cluster"] is not None else (None, 4)
        return StoredProfile(
            id=row["id"],
            name=scrub(row["name"]),
            profile=profile,
            cluster=cluster,
            created_at=_as_utc(row["created_at"]),
        ), size + csize + 100

    def _bounded(self, query: Any, convert: Callable[[Mapping[str, Any]], tuple[Any, int]], limit: int,
                 max_bytes: int | None) -> tuple[list[Any], bool]:
        """Stream rows, stopping at `limit` rows or once `max_bytes` are reached; (items, more may follow)."""
        items: list[Any] = []
        total = 0
        with self.engine.connect() as conn:
            result = conn.execution_options(stream_results=True, yield_per=8).execute(query).mappings()
            try:
                for row in result:
                    item, size = convert(row)
                    if max_bytes is not None and items and total + size > max_bytes:
                        return items, True
                    items.append(item)
                    total += size
            finally:
                result.close()
        return items, len(items) == limit

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
        for key in ("cluster", "training", "plan", "measured", "prediction"):
            check_size(key, payload[key], MAX_FREEFORM_BYTES)
        check_size("measurement", payload, MAX_ROW_BYTES)
        if cluster_id is not None:
            check_text("cluster_id", cluster_id)
        row = {**payload, "cluster_id": cluster_id, "created_at": _utcnow()}

        def insert() -> int:
            with self.engine.begin() as conn:
                result = conn.execute(self.measurements.insert().values(**row))
                return int(result.inserted_primary_key[0])

        new_id = self._run(insert, write=True)
        return Measurement(id=new_id, **row)

    def list_measurements(
        self, cluster_id: str | None = None, limit: int = 100, *, before_id: int | None = None
    ) -> list[Measurement]:
        """Newest first; `cluster_id` filters, `before_id` pages (pass the last id you saw)."""
        return self.page_measurements(cluster_id=cluster_id, limit=limit, before_id=before_id).items

    def page_measurements(
        self,
        cluster_id: str | None = None,
        limit: int = 100,
        *,
        before_id: int | None = None,
        max_bytes: int | None = None,
    ) -> Page:
        """Newest first, at most `limit` rows and about `max_bytes` of JSON (at least one row);
        `next_before_id` continues where the page stopped."""
        limit = max(1, min(int(limit), MAX_LIST_LIMIT))
        if cluster_id is not None and (len(cluster_id) > MAX_TEXT_CHARS or _BAD_CHARS.search(cluster_id)):
            return Page(items=[])  # no stored cluster_id can be this
        t = self.measurements
        query = sa.select(t).order_by(t.c.id.desc()).limit(limit)
        if cluster_id is not None:
            query = query.where(t.c.cluster_id == cluster_id)
        if before_id is not None and int(before_id) <= INT4_MAX:  # ids above the column's range: no bound
            query = query.where(t.c.id < int(before_id))

        def fetch() -> Page:
            items, more = self._bounded(query, self._measurement, limit, max_bytes)
            return Page(items=items, next_before_id=items[-1].id if more and items else None)

        return self._run(fetch)

    @staticmethod
    def _measurement(r: Mapping[str, Any]) -> tuple[Measurement, int]:
        total = 100
        parts: dict[str, Any] = {}
        for key in MEASUREMENT_DOCUMENTS:
            if r[key] is None:
                parts[key] = None
                continue
            parts[key], size = _readable(dict(r[key]))
            total += size
        return Measurement(
            id=int(r["id"]),
            cluster_id=scrub(r["cluster_id"]),
            created_at=_as_utc(r["created_at"]),
            **parts,
        ), total

    def count_measurements(self, cluster_id: str | None = None) -> int:
        t = self.measurements
        query = sa.select(sa.func.count()).select_from(t)
        if cluster_id is not None:
            query = query.where(t.c.cluster_id == cluster_id)

        def fetch() -> int:
            with self.engine.connect() as conn:
                return int(conn.execute(query).scalar_one())

        return self._run(fetch)
