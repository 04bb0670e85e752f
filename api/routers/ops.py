"""GET /healthz and GET /metrics (Prometheus text)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import PlainTextResponse

from api import schemas
from api.deps import StoreDep

router = APIRouter(tags=["ops"])


@router.get("/healthz", response_model=schemas.Health, responses={503: {"model": schemas.Health}})
def healthz(store: StoreDep, response: Response) -> Any:
    """200 {"status": "ok"} when the database answers; 503 {"status": "degraded"} when it does not
    (predict and recommend still work then, writes and lists do not)."""
    from api import __version__

    ok = store.ping()
    if not ok:
        response.status_code = 503
    return {"status": "ok" if ok else "degraded", "database": store.backend, "version": __version__}


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(request: Request) -> PlainTextResponse:
    """Request counts and latency histograms per route, Prometheus text format 0.0.4."""
    from api.metrics import CONTENT_TYPE

    return PlainTextResponse(request.app.state.metrics.render(), media_type=CONTENT_TYPE)
