"""POST/GET /v1/calibrations: the user's measured runs fit the constants of their stack on their
cluster; `cluster.profile_id` = the answer's `profile_id` (or its name) uses them in predict and
recommend (`constants_source: "calibrated"`, the band from the leave-one-out error)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, HTTPException, Path

from api import calibration_schemas as cs
from api import calibrations, schemas
from api.deps import DB_DOWN, UNAUTHORIZED, ProfilesDep, StoreDep, WriteAuth

router = APIRouter(responses=DB_DOWN, prefix="/v1/calibrations", tags=["calibrations"])


@router.post(
    "",
    status_code=201,
    response_model=cs.CalibrationOut,
    dependencies=[WriteAuth],
    responses={**UNAUTHORIZED, 422: {"model": schemas.ErrorOut, "description": "a run that cannot be used"}},
)
def create_calibration(
    body: Annotated[cs.CalibrationCreate, Body(openapi_examples={"three runs": {"value": cs.EXAMPLE}})],
    store: StoreDep,
    profiles: ProfilesDep,
) -> Any:
    """Fit the constants to the runs and store them; nothing is stored when any run is refused."""
    return calibrations.create_calibration(body, store, profiles)


@router.get("/{calibration_id:path}", response_model=cs.CalibrationOut,
            responses={404: {"model": schemas.ErrorOut}})
def get_calibration(calibration_id: Annotated[str, Path(max_length=200)], store: StoreDep) -> Any:
    """One stored calibration by id (or the newest one with that name)."""
    found = calibrations.get_calibration(store, calibration_id)
    if found is None:
        raise HTTPException(status_code=404,
                            detail=f"no stored calibration with id or name {calibration_id!a}")
    return found
