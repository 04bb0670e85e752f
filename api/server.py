"""Running the service under uvicorn with limits that hold against slow and numerous clients.

Why: uvicorn (0.54) has a keep-alive timeout between requests but no timeout while a request's
headers and body arrive, so a client sending one byte every 10 s holds a connection (and a file
descriptor) forever; 21,000 of them exhausted the descriptors and buried the log under "Too many open
files". `GuardedH11Protocol` adds what is missing, and `uvicorn_config` sets the rest:

- request read timeout (`GRIDTUNE_REQUEST_TIMEOUT_S`, `--request-timeout`, default 30 s): a request's
  headers and body must arrive within this many seconds of its first byte (or of the connection
  opening); otherwise the answer is 408 and the connection is closed;
- uvicorn's `limit_concurrency` (`--limit-concurrency`, default 1,024, and never more than the
  process's open-file limit minus 128; the soft limit is raised to the hard one at start-up): while
  that many connections or requests are open, new requests get uvicorn's 503; and a connection
  beyond it plus 32 gets a 503 and is closed at once, so descriptors never run out;
- `timeout_keep_alive` (`--timeout-keep-alive`, 5 s idle between requests), `backlog` (2,048),
  `h11_max_incomplete_event_size` (64 KiB of request line and headers) and
  `timeout_graceful_shutdown` (10 s).

    gridtune serve --request-timeout 30 --limit-concurrency 1024 --timeout-keep-alive 5
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

ENV_REQUEST_TIMEOUT = "GRIDTUNE_REQUEST_TIMEOUT_S"
ENV_MAX_CONNECTIONS = "GRIDTUNE_MAX_CONNECTIONS"
FD_RESERVE = 128
"""Descriptors kept free for the database, log files and search processes."""
CONNECTION_SLACK = 32
"""Connections above limit_concurrency that still get uvicorn's 503 over HTTP before the hard cap."""


@dataclass(frozen=True, kw_only=True)
class ServerLimits:
    request_timeout_s: float = 30.0
    limit_concurrency: int = 1024
    timeout_keep_alive_s: float = 5.0
    backlog: int = 2048
    max_header_bytes: int = 64 * 1024
    graceful_shutdown_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("request_timeout_s", "timeout_keep_alive_s", "graceful_shutdown_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("limit_concurrency", "backlog", "max_header_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def raise_fd_limit(wanted: int) -> int:
    """Raise the soft open-file limit toward the hard one; returns the connections that fit under it."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = hard if hard != resource.RLIM_INFINITY else max(soft, wanted + FD_RESERVE)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        return max(CONNECTION_SLACK + 16, min(wanted, int(soft) - FD_RESERVE))
    except (ImportError, ValueError, OSError):
        return wanted


_REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"retry-after: 5\r\ncontent-length: 56\r\n\r\n"
            b'{"detail":"too many connections to this server; retry"}\n')
_TIMED_OUT = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
              b"content-length: 57\r\n\r\n"
              b'{"detail":"the request did not arrive in time; closing"}\n')


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol plus a per-request read deadline and a connection cap (see module doc).

    Settings come from the environment (`gridtune serve` sets them), so every worker process of
    `--workers N` reads the same ones.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.request_timeout_s = float(os.environ.get(ENV_REQUEST_TIMEOUT, "") or 30.0)
        self.max_connections = int(os.environ.get(ENV_MAX_CONNECTIONS, "") or 2048)
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            transport.write(_REFUSED)
            transport.close()
            return
        self._arm()

    def _arm(self) -> None:
        if self._deadline is None:
            self._deadline = self.loop.call_later(self.request_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            self._arm()  # a new request starts arriving
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE and self.conn.their_state is not h11.SEND_BODY:
            self._disarm()  # the whole request is in (or the connection is done)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _too_slow(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
            return
        answered = self.cycle is not None and self.cycle.response_started
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the app's reads end, its writes go nowhere
            self.cycle.message_event.set()
        if not answered:  # no answer started yet: say why we hang up
            self.transport.write(_TIMED_OUT)
        self.transport.close()


def uvicorn_config(
    app: Any, *, host: str, port: int, workers: int, log_level: str, limits: ServerLimits
) -> Any:
    """A uvicorn.Config with the guarded protocol and the limits (environment set for worker processes)."""
    import uvicorn

    concurrency = raise_fd_limit(limits.limit_concurrency + CONNECTION_SLACK) - CONNECTION_SLACK
    os.environ[ENV_REQUEST_TIMEOUT] = str(limits.request_timeout_s)
    os.environ[ENV_MAX_CONNECTIONS] = str(concurrency + CONNECTION_SLACK)
    return uvicorn.Config(
        app,
        factory=isinstance(app, str),
        host=host,
        port=port,
        workers=workers if workers > 1 else None,
        log_level=log_level,
        access_log=False,
        http="api.server:GuardedH11Protocol",
        limit_concurrency=concurrency,
        timeout_keep_alive=int(max(1, round(limits.timeout_keep_alive_s))),
        backlog=limits.backlog,
        h11_max_incomplete_event_size=limits.max_header_bytes,
        timeout_graceful_shutdown=int(max(1, round(limits.graceful_shutdown_s))),
    )
