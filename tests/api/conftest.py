"""Fixtures for the service tests: an app on a fresh SQLite file per test, with or without a key."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from api import create_app
from api.settings import Settings

API_KEY = "test-key-123"


def make_settings(tmp_path, **overrides) -> Settings:
    # two search workers, not one per CPU: each app a test starts forks them at start-up
    base = {"database_url": f"sqlite:///{tmp_path / 'api.db'}", "api_key": None, "max_search_time_s": 5.0,
            "default_search_time_s": 5.0, "search_workers": 2}
    base.update(overrides)
    return Settings(**base)


@pytest.fixture
def client(tmp_path):
    with TestClient(create_app(make_settings(tmp_path))) as c:
        yield c


@pytest.fixture
def keyed_client(tmp_path):
    with TestClient(create_app(make_settings(tmp_path, api_key=API_KEY))) as c:
        yield c
