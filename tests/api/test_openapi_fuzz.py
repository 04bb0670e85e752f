"""Property-based run of the OpenAPI schema (schemathesis) in the default suite, on SQLite and on
PostgreSQL (GRIDTUNE_TEST_POSTGRES_URL, where a server answers): no generated request gets a 5xx or an
answer that breaks the documented schema.

schemathesis reads /openapi.json and, per operation, lets hypothesis generate bodies and query
strings, both schema-valid (which still breaks physics: wrong grid products, odd divisibility,
huge models) and schema-invalid. Every response must be a non-5xx, documented status with a body
that matches the documented response schema, and schema-invalid data must be rejected.

Bounded for CI (a 2-core machine): a few examples per operation, deterministic, small and short
searches (0.3 s, at most 64 GPUs), the app called in-process (ASGI), PostgreSQL with fewer examples
than SQLite. The long run (more than 20,000 cases per database, over HTTP against `gridtune serve`)
is `bench/fuzz_service.py`.
Run: `.venv/bin/python -m pytest tests/api/test_openapi_fuzz.py -q`.
"""

from __future__ import annotations

import functools
import os
import uuid
from typing import Any

import pytest

schemathesis = pytest.importorskip(
    "schemathesis", reason="schemathesis is not installed (pip install schemathesis)"
)

from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from api import create_app  # noqa: E402
from api.settings import Settings  # noqa: E402
from tests.conftest import DEFAULT_POSTGRES_URL  # noqa: E402

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]

# With a key, so the documented bearer scheme is real: cases that drop the header must get 401.
KEY = "fuzz-key"
# Searches: 0.3 s budget and at most 64 GPUs (bigger clusters get the documented 422), so every
# generated search is small and the run stays short even on a loaded 2-core machine.
LIMITS: dict[str, Any] = {"api_key": KEY, "max_search_time_s": 0.3, "default_search_time_s": 0.3,
                          "max_recommend_gpus": 64}
HEADERS = {"Authorization": f"Bearer {KEY}"}
FEW = {"deadline": None, "suppress_health_check": list(HealthCheck), "derandomize": True}

# Built at import: schemathesis' fixture loader does not work with this pytest; in memory, so
# nothing is left on disk.
app = create_app(Settings(database_url="sqlite://", **LIMITS))
schema = schemathesis.openapi.from_asgi("/openapi.json", app)
FAST = schema.exclude(path="/v1/recommend")
SEARCH = schema.include(path="/v1/recommend")


@FAST.parametrize()
@settings(max_examples=12, **FEW)
def test_no_request_gets_a_server_error(case):
    case.call_and_validate(checks=CHECKS, headers=HEADERS)


@SEARCH.parametrize()
@settings(max_examples=8, **FEW)
def test_no_search_request_gets_a_server_error(case):
    """Schema-valid questions run real searches (in the service's search worker processes)."""
    case.call_and_validate(checks=CHECKS, headers=HEADERS)


# -- PostgreSQL ---------------------------------------------------------------------------------
POSTGRES_URL = os.environ.get("GRIDTUNE_TEST_POSTGRES_URL", "").strip() or DEFAULT_POSTGRES_URL
PREFIX = f"fz{uuid.uuid4().hex[:8]}_"


@functools.cache
def postgres_app() -> tuple[Any, str]:
    """(the app on PostgreSQL under a throw-away table prefix, "") or (None, why not); made on first use,
    so collecting this module touches no database."""
    try:
        import sqlalchemy as sa

        engine = sa.create_engine(POSTGRES_URL, connect_args={"connect_timeout": 3})
        try:
            with engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
        finally:
            engine.dispose()
    except Exception as exc:  # no driver, no server, refused, auth: all mean "cannot run here"
        return None, f"no PostgreSQL server answers at {POSTGRES_URL} ({type(exc).__name__})"
    return create_app(Settings(database_url=POSTGRES_URL, table_prefix=PREFIX, **LIMITS)), ""


@pytest.fixture(scope="module", autouse=True)
def _drop_postgres_tables():
    """The throw-away tables go when this module's tests are done."""
    yield
    if postgres_app.cache_info().currsize:
        pg, _ = postgres_app()
        if pg is not None:
            pg.state.store.drop_tables()


async def _postgres_or_spec(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The schema is the same on both databases: served by the SQLite app, so loading it at import
    needs no PostgreSQL; every other request goes to the PostgreSQL app."""
    if scope["type"] == "http" and scope["path"] == "/openapi.json":
        await app(scope, receive, send)
        return
    pg, _ = postgres_app()
    await (pg or app)(scope, receive, send)


POSTGRES = schemathesis.openapi.from_asgi("/openapi.json", _postgres_or_spec).exclude(path="/v1/recommend")


@POSTGRES.parametrize()
@settings(max_examples=5, **FEW)
def test_no_request_gets_a_server_error_on_postgres(case):
    pg, why = postgres_app()
    if pg is None:
        pytest.skip(why)
    case.call_and_validate(checks=CHECKS, headers=HEADERS)
