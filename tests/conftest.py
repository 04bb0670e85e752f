"""Shared fixtures for the whole suite (keep only generic things here).

`postgres_url`: the PostgreSQL server the store tests also run on, from GRIDTUNE_TEST_POSTGRES_URL
(default `postgresql+psycopg://postgres@127.0.0.1:5432/test`, what the dev and CI machines run).
Tests that use it are skipped, with the reason shown in the summary (`-ra`), only when no server
answers there.
"""

from __future__ import annotations

import os

import pytest

DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@pytest.fixture(scope="session")
def postgres_url() -> str:
    url = os.environ.get("GRIDTUNE_TEST_POSTGRES_URL", "").strip() or DEFAULT_POSTGRES_URL
    try:
        import sqlalchemy as sa

        engine = sa.create_engine(
            url, connect_args={"connect_timeout": 3} if url.startswith("postgresql") else {}
        )
        try:
            with engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
        finally:
            engine.dispose()
    except Exception as exc:  # no driver, no server, refused, auth: all mean "cannot run here"
        pytest.skip(
            f"no PostgreSQL server answers at {url} ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
        )
    return url
