"""POST/GET /v1/clusters: profiles from `gridtune profile`, stored so predictions can use them."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, HTTPException, Path, Query, Response

from api import examples, schemas, service
from api.deps import DB_DOWN, UNAUTHORIZED, SettingsDep, StoreDep, WriteAuth

router = APIRouter(responses=DB_DOWN, prefix="/v1/clusters", tags=["clusters"])


@router.post(
    "",
    status_code=201,
    response_model=schemas.ClusterOut,
    dependencies=[WriteAuth],
    responses={**UNAUTHORIZED, 422: {"model": schemas.ErrorOut, "description": "invalid profile or cluster"}},
)
def create_cluster(
    body: Annotated[
        schemas.ClusterCreate,
        Body(openapi_examples={"a profiled A100 cluster": {"value": examples.CLUSTER_CREATE}}),
    ],
    store: StoreDep,
) -> Any:
    """Store a profile; the answer's `id` is what `cluster.profile_id` takes in predict/recommend."""
    return service.create_cluster(body, store)


@router.get("", response_model=schemas.ClusterList)
def list_clusters(
    store: StoreDep,
    settings: SettingsDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000, description="page: skip this many (next_offset)")] = 0,
) -> Any:
    """Stored profiles, newest first. A page ends at `limit` rows or at the server's page size in bytes
    (GRIDTUNE_MAX_PAGE_MB); `next_offset` continues it."""
    page = store.page_profiles(limit=limit, offset=offset, max_bytes=int(settings.max_page_mb * 2**20))
    body = {"items": [service.cluster_json(p) for p in page.items], "next_offset": page.next_offset}
    return Response(service.encode_listing(body), media_type="application/json")


@router.get(
    "/{cluster_id:path}", response_model=schemas.ClusterOut, responses={404: {"model": schemas.ErrorOut}}
)
def get_cluster(cluster_id: Annotated[str, Path(max_length=200)], store: StoreDep) -> Any:
    """One stored profile by id (or the newest one with that name)."""
    stored = store.get_profile(cluster_id)
    if stored is None:
        raise HTTPException(
            status_code=404, detail=f"no stored cluster profile with id or name {cluster_id!a}"
        )
    return Response(service.encode_listing(service.cluster_json(stored)), media_type="application/json")
