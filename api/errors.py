"""Error responses: one JSON shape for every client mistake, and no 500 for client input.

- pydantic's own 422s get a message that names the field and the offending value
  (`cluster.num_gpus: Input should be greater than or equal to 1, got -8`), and for physical
  constants the plausible range (`... (plausible range 0.001 to 100000 GB/s per GPU per direction)`);
  the echo of the value is cut to `ECHO_CHARS` (a 10 MB name must not make a 10 MB error) and
  escaped, so text that UTF-8 cannot carry (an unpaired surrogate) is echoed, not fatal;
- `ValueError`s from the domain (wrapped as `service.InputError`) become the same shape,
  `{"detail": [{"loc": [...], "msg": "...", "type": "value_error"}]}`;
- `service.Unavailable` (busy, over time), `tuner.store.StoreBusy` (database locked, every pooled
  connection in use), `tuner.store.StoreUnwritable` (read-only or immutable SQLite file: the
  reason /readyz gives) and a database that does not answer are 503s with Retry-After. They are
  expected under load, so each is logged as one line without a traceback, and at most
  `LOG_PER_S` lines a second per kind (the rest are counted in the next line);
- anything else is a bug: logged with a traceback and an error id, answered as a JSON 500 with
  `Connection: close` (the server drops the connection after a crash; the header tells the
  client not to reuse it).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.schemas import plausible_range
from api.service import InputError, Unavailable
from tuner.store import StoreBusy, StoreUnwritable

log = logging.getLogger("gridtune.api")
ECHO_CHARS = 200
"""Longest echo of an offending value in a 422 (message and `input`)."""
LOG_PER_S = 1.0


class LogLimiter:
    """At most `per_s` log lines a second per kind; the suppressed ones are counted in the next line."""

    def __init__(self, per_s: float = LOG_PER_S) -> None:
        self.interval_s = 1.0 / per_s
        self._next: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

    def allow(self, kind: str) -> int | None:
        """None: stay quiet; else the number of lines suppressed since the last one."""
        now = time.monotonic()
        with self._lock:
            if now < self._next.get(kind, 0.0):
                self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
                return None
            self._next[kind] = now + self.interval_s
            return self._suppressed.pop(kind, 0)


def _short(value: Any, limit: int = ECHO_CHARS) -> str:
    """repr-like text of `value`, at most `limit` characters, ASCII only (always encodable)."""
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value[: limit * 2])
    elif isinstance(value, str) and len(value) > limit * 2:
        value = value[: limit * 2]
    elif isinstance(value, (list, dict)) and len(value) > 50:
        value = f"<{type(value).__name__} of {len(value)} items>"
    text = ascii(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _clip(text: str, limit: int) -> str:
    """`text` with anything outside ASCII escaped (always encodable), cut to `limit` characters."""
    text = text[: limit * 2].encode("ascii", "backslashreplace").decode("ascii")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _loc_part(part: Any) -> Any:
    """pydantic names union members by their validator chain ("function-after[_no_nul(), constrained-str]"):
    say "str" instead."""
    if isinstance(part, int):
        return part
    text = str(part)
    if text.startswith("function-after[") and "str" in text:
        return "str"
    return _clip(text, 60)


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [_clip(p, 60) if isinstance(p, str) else str(p)
             for p in loc if p not in ("body", "query", "path", "header")]
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out or "body"


def _echo(value: Any) -> Any:
    """The offending value for the `input` key: numbers and short clean strings as they are, else text."""
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else _short(value)
    if isinstance(value, str) and len(value) <= ECHO_CHARS and value.isascii():
        return value
    return _short(value)


def _range_note(loc: list[Any], kind: str) -> str:
    if kind not in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return ""
    names = [p for p in loc if isinstance(p, str)]
    found = plausible_range(names[-1]) if names else None
    if found is None:
        return ""
    lo, hi, unit = found
    return f" (plausible range {lo:g} to {hi:g} {unit})"


_SCALAR_MISMATCH = ("string_type", "literal_error", "int_type", "float_type", "bool_type")


def _useful(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Without the "not a string" errors of a union's scalar branch (`gpu: str | GPUIn`, `stack: name |
    StackIn`) when an object was sent and its object branch says what is wrong inside it."""
    def inside(err: dict[str, Any], other: dict[str, Any]) -> bool:
        loc, deeper = tuple(err.get("loc", ())), tuple(other.get("loc", ()))
        return len(deeper) > len(loc) and deeper[: len(loc) - 1] == loc[:-1]

    return [err for err in errors
            if not (err.get("type") in _SCALAR_MISMATCH and isinstance(err.get("input"), dict)
                    and any(inside(err, other) for other in errors))]


def validation_detail(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    detail = []
    for err in _useful(errors)[:50]:
        loc = [_loc_part(p) for p in err.get("loc", ())]
        field = _field(loc)
        kind = str(err.get("type", "value_error"))
        msg = _clip(str(err.get("msg", "invalid")), 400)
        if kind == "missing":
            text = f"{field}: field required"
        elif kind == "json_invalid":
            text = f"body is not valid JSON: {msg}"
        else:
            text = f"{field}: {msg}, got {_short(err.get('input'))}{_range_note(loc, kind)}"
        item: dict[str, Any] = {"loc": loc, "msg": text, "type": kind}
        if "input" in err and kind != "missing":
            item["input"] = _echo(err["input"])
        detail.append(item)
    return detail


async def _on_validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return JSONResponse(status_code=422, content={"detail": validation_detail(list(exc.errors()))})


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if (
        exc.status_code == 400
    ):  # FastAPI's "error parsing the body" (e.g. not UTF-8): a body error like any other
        return JSONResponse(
            status_code=422,
            content={
                "detail": [
                    {
                        "loc": ["body"],
                        "msg": f"body could not be parsed: {_clip(str(exc.detail), 400)}",
                        "type": "json_invalid",
                    }
                ]
            },
        )
    return await http_exception_handler(request, exc)


async def _on_input_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InputError)
    msg = _clip(exc.msg, 2000)
    return JSONResponse(
        status_code=422, content={"detail": [{"loc": list(exc.loc), "msg": msg, "type": "value_error"}]}
    )


def _unavailable(request: Request, kind: str, message: str) -> JSONResponse:
    limiter: LogLimiter = request.app.state.log_limiter
    suppressed = limiter.allow(kind)
    if suppressed is not None:
        more = f" (+{suppressed} similar not logged)" if suppressed else ""
        log.warning("503 on %s %s: %s%s", request.method, request.url.path, message[:300], more)
    return JSONResponse(status_code=503, content={"detail": message}, headers={"Retry-After": "5"})


async def _on_unavailable(request: Request, exc: Exception) -> JSONResponse:
    return _unavailable(request, "busy", str(exc))


async def _on_store_busy(request: Request, exc: Exception) -> JSONResponse:
    return _unavailable(request, "store-busy", f"the database is busy; retry later ({exc})")


async def _on_store_unwritable(request: Request, exc: Exception) -> JSONResponse:
    return _unavailable(request, "store-unwritable", str(exc))  # the words /readyz uses


async def _on_database_error(request: Request, exc: Exception) -> JSONResponse:
    error_id = uuid.uuid4().hex[:12]
    first = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    reason = f"{type(exc).__name__}: {first[0][:200] if first else ''}"
    return _unavailable(request, "database",
                        f"the database is not answering; retry later (error id {error_id}; {reason})")


async def _on_server_error(request: Request, exc: Exception) -> JSONResponse:
    error_id = uuid.uuid4().hex[:12]
    if request.app.state.log_limiter.allow("bug") is not None:
        log.error("error %s on %s %s", error_id, request.method, request.url.path, exc_info=exc)
    else:
        log.error("error %s on %s %s: %s", error_id, request.method, request.url.path, _short(exc, 300))
    return JSONResponse(status_code=500, content={"detail": f"internal server error (error id {error_id})"},
                        headers={"Connection": "close"})


def install(app: FastAPI) -> None:
    app.state.log_limiter = LogLimiter()
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(InputError, _on_input_error)
    app.add_exception_handler(Unavailable, _on_unavailable)
    app.add_exception_handler(StoreBusy, _on_store_busy)
    app.add_exception_handler(StoreUnwritable, _on_store_unwritable)
    app.add_exception_handler(sa_exc.TimeoutError, _on_store_busy)
    app.add_exception_handler(sa_exc.OperationalError, _on_database_error)
    app.add_exception_handler(sa_exc.InterfaceError, _on_database_error)
    app.add_exception_handler(Exception, _on_server_error)
