"""GET /livez, /readyz, /healthz, /metrics and /v1/presets.

- `/livez`: liveness. The process answers HTTP; touches nothing else, so it stays fast when the
  database is locked, saturated or gone (an orchestrator restarts the process only when this fails).
- `/readyz`: readiness. The store can take a write now (schema at the newest migration, repaired
  here if the tables went missing; a write transaction on *each* table the service writes can
  start on a fresh short-timeout connection): 200, or 503 with the reason and `writable`
  ({table: bool}), which says what a write to each table will do (a PostgreSQL lock on one table
  blocks writes to it alone). Writes check the same SQLite-file condition first, so they fail with
  the same 503 and reason rather than succeed into the WAL of an immutable file. Load balancers
  route by this one.
- `/healthz`: the readiness answer with the database name and version (kept for existing clients;
  predict and recommend still work when it says "degraded", writes and lists do not).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import PlainTextResponse

from api import schemas
from api.deps import StoreDep

router = APIRouter(tags=["ops"])


def _ready(store: StoreDep, response: Response) -> dict[str, Any]:
    from api import __version__

    state = store.readiness()
    if not state.ready:
        response.status_code = 503
        response.headers["Retry-After"] = "5"
    return {"status": "ok" if state.ready else "degraded", "database": store.backend, "version": __version__,
            "ready": state.ready, "reason": state.reason,
            "writable": {name: not why for name, why in state.tables}}


@router.get("/livez", response_model=schemas.Live)
async def livez() -> Any:
    """200 while the process serves HTTP; never waits on the database."""
    from api import __version__

    return {"status": "ok", "version": __version__}


@router.get("/readyz", response_model=schemas.Health, responses={503: {"model": schemas.Health}})
def readyz(store: StoreDep, response: Response) -> Any:
    """200 when the store takes writes; 503 {"ready": false, "reason": ..., "writable": {table: bool}}
    when it cannot (read-only or immutable files, a dropped database, a lock held by another
    process on one table or all); `writable` says, per table, what a write will do now."""
    return _ready(store, response)


@router.get("/healthz", response_model=schemas.Health, responses={503: {"model": schemas.Health}})
def healthz(store: StoreDep, response: Response) -> Any:
    """200 {"status": "ok"} when the store takes writes; 503 {"status": "degraded", "reason": ...} when it
    does not (predict and recommend still work then, writes and lists may not). Same check as /readyz."""
    return _ready(store, response)


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(request: Request) -> PlainTextResponse:
    """Request counts and latency histograms per route, Prometheus text format 0.0.4."""
    from api.metrics import CONTENT_TYPE

    return PlainTextResponse(request.app.state.metrics.render(), media_type=CONTENT_TYPE)


@router.get("/v1/presets", response_model=schemas.PresetsOut, tags=["model"])
async def presets() -> Any:
    """Every preset the service knows by name: models, clusters, GPUs (and training stacks where the
    model provides them), with their main numbers; pass the names as `model.preset`,
    `cluster.preset`, `cluster.gpu`."""
    from tuner.catalog import preset_catalog

    return preset_catalog()
