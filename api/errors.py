"""Error responses: one JSON shape for every client mistake, and no 500 for client input.

- pydantic's own 422s get a message that names the field and the offending value
  (`cluster.num_gpus: Input should be greater than or equal to 1, got -8`);
- `ValueError`s from the domain (wrapped as `service.InputError`) become the same shape,
  `{"detail": [{"loc": [...], "msg": "...", "type": "value_error"}]}`;
- `service.Unavailable` (busy, over time) and a database that does not answer are 503s with
  Retry-After;
- anything else is a bug: logged with a traceback and an error id, answered as a JSON 500.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.service import InputError, Unavailable, finite

log = logging.getLogger("gridtune.api")


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out or "body"


def _jsonable(value: Any) -> Any:
    try:
        return finite(jsonable_encoder(value))  # NaN/Infinity echoed back would not be JSON
    except Exception:  # bytes of a broken JSON body and the like
        return _short(value)


def validation_detail(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    detail = []
    for err in errors:
        loc = list(err.get("loc", ()))
        field = _field(loc)
        kind = err.get("type", "value_error")
        msg = str(err.get("msg", "invalid"))
        if kind == "missing":
            text = f"{field}: field required"
        elif kind == "json_invalid":
            text = f"body is not valid JSON: {msg}"
        else:
            text = f"{field}: {msg}, got {_short(err.get('input'))}"
        item = {"loc": loc, "msg": text, "type": kind}
        if "input" in err and kind != "missing":
            item["input"] = _jsonable(err["input"])
        detail.append(item)
    return detail


async def _on_validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return JSONResponse(status_code=422, content={"detail": validation_detail(list(exc.errors()))})


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400:  # FastAPI's "error parsing the body" (e.g. not UTF-8): a body error like any other
        return JSONResponse(
            status_code=422,
            content={"detail": [{"loc": ["body"], "msg": f"body could not be parsed: {exc.detail}", "type": "json_invalid"}]},
        )
    return await http_exception_handler(request, exc)


async def _on_input_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InputError)
    return JSONResponse(
        status_code=422, content={"detail": [{"loc": list(exc.loc), "msg": exc.msg, "type": "value_error"}]}
    )


async def _on_unavailable(_request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(status_code=503, content={"detail": str(exc)}, headers={"Retry-After": "5"})


async def _on_database_error(request: Request, exc: Exception) -> JSONResponse:
    error_id = uuid.uuid4().hex[:12]
    log.error("database error %s on %s %s", error_id, request.method, request.url.path, exc_info=exc)
    return JSONResponse(
        status_code=503,
        content={"detail": f"the database is not answering; retry later (error id {error_id})"},
        headers={"Retry-After": "5"},
    )


async def _on_server_error(request: Request, exc: Exception) -> JSONResponse:
    error_id = uuid.uuid4().hex[:12]
    log.error("error %s on %s %s", error_id, request.method, request.url.path, exc_info=exc)
    return JSONResponse(status_code=500, content={"detail": f"internal server error (error id {error_id})"})


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(InputError, _on_input_error)
    app.add_exception_handler(Unavailable, _on_unavailable)
    app.add_exception_handler(sa_exc.OperationalError, _on_database_error)
    app.add_exception_handler(sa_exc.InterfaceError, _on_database_error)
    app.add_exception_handler(Exception, _on_server_error)
