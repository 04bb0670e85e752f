"""Property-based run of the OpenAPI schema (schemathesis): no generated request gets a 5xx.

schemathesis reads /openapi.json and, per operation, lets hypothesis generate bodies and query
strings, both schema-valid (which still breaks physics: wrong grid products, odd divisibility,
huge models) and schema-invalid. Every response must be a non-5xx, documented status with a body
that matches the documented response schema, and schema-invalid data must be rejected.

The app runs on an in-memory SQLite store with small, short searches, so the run stays short.
Run: `.venv/bin/python -m pytest tests/api/test_openapi_fuzz.py -q`.
"""

from __future__ import annotations

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

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]

# Built at import: schemathesis' fixture loader does not work with this pytest; in memory, so
# nothing is left on disk.
# With a key, so the documented bearer scheme is real: cases that drop the header must get 401.
KEY = "fuzz-key"
# Searches: 0.3 s budget and at most 64 GPUs (bigger clusters get the documented 422), so every
# generated search is small and the run stays short even on a loaded 2-core machine.
app = create_app(
    Settings(
        database_url="sqlite://",
        api_key=KEY,
        max_search_time_s=0.3,
        default_search_time_s=0.3,
        max_recommend_gpus=64,
    )
)
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


FAST = schema.exclude(path="/v1/recommend")
SEARCH = schema.include(path="/v1/recommend")


@FAST.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_request_gets_a_server_error(case):
    case.call_and_validate(checks=CHECKS, headers={"Authorization": f"Bearer {KEY}"})


@SEARCH.parametrize()
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_search_request_gets_a_server_error(case):
    """Schema-valid questions run real searches (each in its own process)."""
    case.call_and_validate(checks=CHECKS, headers={"Authorization": f"Bearer {KEY}"})
