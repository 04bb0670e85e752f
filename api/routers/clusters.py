"""POST/GET /v1/clusters: profiles from `gridtune profile`, stored so predictions can use them."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, HTTPException, Path, Query

from api import examples, schemas, service
from api.deps import StoreDep, WriteAuth

DB_DOWN: dict[int | str, dict[str, Any]] = {
    503: {"model": schemas.ErrorOut, "description": "the database is not answering; retry later"}
}
router = APIRouter(responses=DB_DOWN, prefix="/v1/clusters", tags=["clusters"])


@router.post(
    "",
    status_code=201,
    response_model=schemas.ClusterOut,
    dependencies=[WriteAuth],
    responses={
        401: {"model": schemas.ErrorOut, "description": "GRIDTUNE_API_KEY is set and the bearer key is missing or wrong"},
        422: {"model": schemas.ErrorOut, "description": "invalid profile or cluster"},
    },
)
def create_cluster(
    body: Annotated[schemas.ClusterCreate, Body(openapi_examples={"a profiled A100 cluster": {"value": examples.CLUSTER_CREATE}})],
    store: StoreDep,
) -> Any:
    """Store a profile; the answer's `id` is what `cluster.profile_id` takes in predict/recommend."""
    return service.create_cluster(body, store)


@router.get("", response_model=schemas.ClusterList)
def list_clusters(store: StoreDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> Any:
    """Stored profiles, newest first."""
    return {"items": [service.cluster_json(p) for p in store.list_profiles(limit=limit)]}


@router.get("/{cluster_id:path}", response_model=schemas.ClusterOut, responses={404: {"model": schemas.ErrorOut}})
def get_cluster(cluster_id: Annotated[str, Path(max_length=200)], store: StoreDep) -> Any:
    """One stored profile by id (or the newest one with that name)."""
    stored = store.get_profile(cluster_id)
    if stored is None:
        raise HTTPException(status_code=404, detail=f"no stored cluster profile with id or name {cluster_id!r}")
    return service.cluster_json(stored)
