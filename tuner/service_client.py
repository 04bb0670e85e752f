"""POST JSON to a running gridtune service: Bearer auth from GRIDTUNE_API_KEY, one-line errors.

Used by `gridtune profile --upload` (POST /v1/clusters), `engine.train` and `gridtune validate`
(POST /v1/recommend, POST /v1/measurements). Every failure is a ValueError naming the endpoint and,
for HTTP errors, the status and the start of the body, so the CLI prints one clear line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

API_KEY_ENV = "GRIDTUNE_API_KEY"


def headers(api_key: str | None = None) -> dict[str, str]:
    out = {"Content-Type": "application/json"}
    key = api_key if api_key is not None else os.environ.get(API_KEY_ENV, "").strip()
    if key:
        out["Authorization"] = f"Bearer {key}"
    return out


def post_json(url: str, path: str, body: Mapping[str, Any], *, what: str = "POST", api_key: str | None = None,
              timeout_s: float = 30.0, client: Any = None) -> Any:
    """POST `body` to `url` + `path`; the decoded JSON answer (a dict with the status when not JSON).

    `client` (an httpx.Client, or FastAPI's TestClient in tests) replaces a fresh connection."""
    import httpx

    endpoint = url.rstrip("/") + path
    payload = json.dumps(body)
    try:
        if client is not None:
            resp = client.post(endpoint, content=payload, headers=headers(api_key))
        else:
            resp = httpx.post(endpoint, content=payload, headers=headers(api_key), timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ValueError(f"{what} {endpoint} failed: {exc}") from None
    if resp.status_code >= 400:
        raise ValueError(f"{what} {endpoint} failed: HTTP {resp.status_code}: {resp.text[:500]}")
    try:
        return resp.json()
    except (ValueError, TypeError):
        return {"status_code": resp.status_code, "text": resp.text[:500]}
