"""FastAPI dependencies: the store, the profile cache, the settings, and the write-key check.

Everything hangs off `app.state` (set by `create_app`), so two apps in one process (tests) never
share a database or a key.
"""

from __future__ import annotations

import hmac
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api import schemas
from api.service import ProfileCache
from api.settings import Settings
from tuner.store import Store

_bearer = HTTPBearer(
    auto_error=False, description="GRIDTUNE_API_KEY, needed for writes when the server sets one"
)


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_store(request: Request) -> Store:
    return request.app.state.store


def get_profiles(request: Request) -> ProfileCache:
    return request.app.state.profiles


def require_write_key(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """401 unless `Authorization: Bearer <GRIDTUNE_API_KEY>` (only when the server has a key)."""
    key = request.app.state.settings.api_key
    if key is None:
        return
    given = (
        credentials.credentials if credentials is not None and credentials.scheme.lower() == "bearer" else ""
    )
    if not hmac.compare_digest(given.encode(), key.encode()):
        raise HTTPException(
            status_code=status.HTTP_401_UNAUTHORIZED,
            detail="writes need 'Authorization: Bearer <key>' with the server's GRIDTUNE_API_KEY",
            headers={"WWW-Authenticate": "Bearer"},
        )


StoreDep = Annotated[Store, Depends(get_store)]
ProfilesDep = Annotated[ProfileCache, Depends(get_profiles)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
WriteAuth = Depends(require_write_key)


# OpenAPI documentation of the answers every store-backed router can give, written once here.
DB_DOWN: dict[int | str, dict[str, Any]] = {
    503: {"model": schemas.ErrorOut, "description": "the database is not answering; retry later"}
}
UNAUTHORIZED: dict[int | str, dict[str, Any]] = {
    401: {
        "model": schemas.ErrorOut,
        "description": "GRIDTUNE_API_KEY is set and the bearer key is missing or wrong",
    }
}
