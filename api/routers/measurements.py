"""POST/GET /v1/measurements: what the engine measured, kept for calibration (the closed loop)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Response

from api import examples, schemas, service
from api.deps import DB_DOWN, UNAUTHORIZED, ProfilesDep, SettingsDep, StoreDep, WriteAuth

router = APIRouter(responses=DB_DOWN, prefix="/v1/measurements", tags=["measurements"])


@router.post(
    "",
    status_code=201,
    response_model=schemas.MeasurementOut,
    dependencies=[WriteAuth],
    responses={
        **UNAUTHORIZED,
        422: {"model": schemas.ErrorOut, "description": "invalid specs or measurement"},
    },
)
def create_measurement(
    body: Annotated[
        schemas.MeasurementCreate,
        Body(openapi_examples={"one measured step": {"value": examples.MEASUREMENT}}),
    ],
    store: StoreDep,
    profiles: ProfilesDep,
) -> Any:
    """Store one measurement; it is on disk (committed) when this answers 201."""
    return service.create_measurement(body, store, profiles)


@router.get("", response_model=schemas.MeasurementList)
def list_measurements(
    store: StoreDep,
    settings: SettingsDep,
    cluster_id: Annotated[str | None, Query(max_length=200, description="profile id or cluster name")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    before_id: Annotated[int | None, Query(ge=1, le=2**62, description="page: ids below this one")] = None,
) -> Any:
    """Stored measurements, newest first. A page ends at `limit` rows or at the server's page size in
    bytes (GRIDTUNE_MAX_PAGE_MB), whichever comes first; `next_before_id` continues it."""
    page = store.page_measurements(cluster_id=cluster_id, limit=limit, before_id=before_id,
                                   max_bytes=int(settings.max_page_mb * 2**20))
    body = {"items": [service.measurement_json(m) for m in page.items], "next_before_id": page.next_before_id}
    return Response(service.encode_listing(body), media_type="application/json")
