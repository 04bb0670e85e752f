"""Running the service under uvicorn with limits that hold against slow, idle and numerous clients.

Why: uvicorn (0.54) has a keep-alive timeout between requests but no timeout while a request's
headers and body arrive, so a client sending one byte every 10 s holds a connection (and a file
descriptor) forever; 21,000 of them exhausted the descriptors and buried the log under "Too many open
files". And its `limit_concurrency` counts open *connections*, so about 1,100 idle TCP connections
(which cost an attacker nothing) made every request, `/livez` included, a 503. `GuardedH11Protocol`
adds what is missing, and `uvicorn_config` sets the rest:

- first-byte timeout (`GRIDTUNE_IDLE_TIMEOUT_S`, `--idle-timeout`, default 5 s): a connection that
  has sent no byte of a request within this many seconds of opening is closed (no answer: there is
  no request to answer); each connection's timeout is drawn between half and all of it, so a flood
  opened at once is not closed, reopened and accepted again in one burst;
- request read timeout (`GRIDTUNE_REQUEST_TIMEOUT_S`, `--request-timeout`, default 30 s): once a
  request's first byte is in, its headers and body must arrive within this many seconds; otherwise
  the answer is 408 and the connection is closed. A slow request that keeps sending keeps its budget;
- requests in flight (`--limit-concurrency`, default 1,024): a request arriving while that many are
  being served gets a 503 with Retry-After. Idle connections do not count (uvicorn's own check
  counted them), and the probes `/livez`, `/readyz` and `/healthz` are always served;
- open connections (`GRIDTUNE_MAX_CONNECTIONS`, `--max-connections`, default 4,096, never more
  than the open-file limit minus 128; the soft limit is raised to the hard one at start-up): a
  connection beyond it closes the oldest connection that is idle (no request in progress: just
  opened, or between keep-alive requests); only when none is idle is the newcomer answered 503
  and closed, so descriptors never run out and a flood of idle sockets cannot keep a probe out;
- `timeout_keep_alive` (`--timeout-keep-alive`, 5 s idle between requests), `backlog` (2,048),
  `h11_max_incomplete_event_size` (64 KiB of request line and headers) and
  `timeout_graceful_shutdown` (10 s).

Measured by `bench/idle_flood.py` (figures in README, "Service under attack").

    gridtune serve --request-timeout 30 --idle-timeout 5 --limit-concurrency 1024 --max-connections 4096
"""

from __future__ import annotations

import asyncio
import os
import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

ENV_REQUEST_TIMEOUT = "GRIDTUNE_REQUEST_TIMEOUT_S"
ENV_IDLE_TIMEOUT = "GRIDTUNE_IDLE_TIMEOUT_S"
ENV_MAX_CONNECTIONS = "GRIDTUNE_MAX_CONNECTIONS"
FD_RESERVE = 128
"""Descriptors kept free for the database, log files and search processes."""
PROBES = frozenset({"/livez", "/readyz", "/healthz"})
"""Paths served even while `limit_concurrency` requests are in flight (an orchestrator's probes)."""


@dataclass(frozen=True, kw_only=True)
class ServerLimits:
    request_timeout_s: float = 30.0
    idle_timeout_s: float = 5.0
    limit_concurrency: int = 1024
    max_connections: int = 4096
    timeout_keep_alive_s: float = 5.0
    backlog: int = 2048
    max_header_bytes: int = 64 * 1024
    graceful_shutdown_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("request_timeout_s", "idle_timeout_s", "timeout_keep_alive_s", "graceful_shutdown_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("limit_concurrency", "max_connections", "backlog", "max_header_bytes"):
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
        return max(16, min(wanted, int(soft) - FD_RESERVE))
    except (ImportError, ValueError, OSError):
        return wanted


_REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"retry-after: 5\r\ncontent-length: 56\r\n\r\n"
            b'{"detail":"too many connections to this server; retry"}\n')
_TIMED_OUT = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
              b"content-length: 57\r\n\r\n"
              b'{"detail":"the request did not arrive in time; closing"}\n')


_BUSY_BODY = b'{"detail":"this server is serving as many requests as it may; retry"}\n'


async def _too_many_requests(_scope: dict[str, Any], _receive: Any, send: Any) -> None:
    """The 503 of a request past `limit_concurrency`: JSON like every other error, with Retry-After."""
    await send({"type": "http.response.start", "status": 503,
                "headers": [(b"content-type", b"application/json"), (b"retry-after", b"5"),
                            (b"connection", b"close"),
                            (b"content-length", str(len(_BUSY_BODY)).encode())]})
    await send({"type": "http.response.body", "body": _BUSY_BODY})


def _idle_registry(server_state: Any) -> OrderedDict[GuardedH11Protocol, None]:
    """The connections of this server process with no request in progress, oldest first."""
    registry = getattr(server_state, "gridtune_idle", None)
    if registry is None:
        registry = OrderedDict()
        server_state.gridtune_idle = registry
    return registry


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol plus a first-byte timeout, a per-request read deadline, a limit on
    requests (not connections) in flight that never refuses a probe, and a connection cap that
    evicts idle connections first (see the module doc).

    Settings come from the environment (`gridtune serve` sets them), so every worker process of
    `--workers N` reads the same ones.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.request_timeout_s = float(os.environ.get(ENV_REQUEST_TIMEOUT, "") or 30.0)
        self.idle_timeout_s = float(os.environ.get(ENV_IDLE_TIMEOUT, "") or 5.0)
        self.max_connections = int(os.environ.get(ENV_MAX_CONNECTIONS, "") or 4096)
        self._deadline: asyncio.TimerHandle | None = None
        self._reading_request = False
        self._idle = _idle_registry(self.server_state)
        # uvicorn's check counts idle connections; ours counts requests in flight and spares probes
        self.max_in_flight = self.limit_concurrency
        self.limit_concurrency = None
        self.app = self._admit_app(self.app, self.max_in_flight, self.tasks)

    @staticmethod
    def _admit_app(app: Any, limit: int | None, tasks: set[Any]) -> Any:
        async def admitted(scope: dict[str, Any], receive: Any, send: Any) -> None:
            # the task serving this request is already in `tasks`
            if limit is not None and len(tasks) > limit and scope.get("path") not in PROBES:
                await _too_many_requests(scope, receive, send)
                return
            await app(scope, receive, send)

        return admitted

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections and not self._evict_idle():
            transport.write(_REFUSED)
            transport.close()
            return
        self._idle[self] = None
        # spread over the last half of the timeout, so a flood opened at once is not closed (and
        # reopened, and accepted again) in one burst that would stall the loop for everyone
        self._arm(self.idle_timeout_s * (0.5 + 0.5 * random.random()), self._no_bytes)

    def _evict_idle(self) -> bool:
        """Close the oldest idle connection other than this one; False when none is idle."""
        while self._idle:
            oldest, _ = self._idle.popitem(last=False)
            if oldest is self or oldest.transport is None or oldest.transport.is_closing():
                continue
            oldest._disarm()
            oldest.transport.close()
            return True
        return False

    def _arm(self, after_s: float, callback: Any) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(after_s, callback)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE and data and not self._reading_request:
            # a request starts arriving: no longer evictable, and it has the request budget from now
            # (h11 stays IDLE until the headers are complete, so later chunks do not re-arm it)
            self._idle.pop(self, None)
            self._reading_request = True
            self._arm(self.request_timeout_s, self._too_slow)
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE and self.conn.their_state is not h11.SEND_BODY:
            self._disarm()  # the whole request is in (or the connection is done)
            self._reading_request = False

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._idle[self] = None  # waiting for the next keep-alive request (uvicorn's timer ends it)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._idle.pop(self, None)
        super().connection_lost(exc)

    def _no_bytes(self) -> None:
        """First-byte timeout: nothing arrived, so there is nothing to answer; just close."""
        self._deadline = None
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE and self.cycle is None:
            self._idle.pop(self, None)
            self.transport.close()

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

    max_connections = raise_fd_limit(limits.max_connections)
    os.environ[ENV_REQUEST_TIMEOUT] = str(limits.request_timeout_s)
    os.environ[ENV_IDLE_TIMEOUT] = str(limits.idle_timeout_s)
    os.environ[ENV_MAX_CONNECTIONS] = str(max_connections)
    return uvicorn.Config(
        app,
        factory=isinstance(app, str),
        host=host,
        port=port,
        workers=workers if workers > 1 else None,
        log_level=log_level,
        access_log=False,
        http="api.server:GuardedH11Protocol",
        limit_concurrency=min(limits.limit_concurrency, max_connections),
        timeout_keep_alive=int(max(1, round(limits.timeout_keep_alive_s))),
        backlog=limits.backlog,
        h11_max_incomplete_event_size=limits.max_header_bytes,
        timeout_graceful_shutdown=int(max(1, round(limits.graceful_shutdown_s))),
    )
