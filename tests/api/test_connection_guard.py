"""Idle-connection floods against a real `gridtune serve`: the probes keep answering, sockets that
send nothing are dropped at the first-byte timeout, slow requests that make progress keep their
budget. Waits have generous deadlines; nothing asserts a duration (bench/idle_flood.py measures).
"""

from __future__ import annotations

import contextlib
import socket
import time

import httpx

from tests.api import serverproc


def _idle_sockets(port: int, n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        out.append(s)
    return out


def _closed_by_server(s: socket.socket, wait_s: float) -> bytes | None:
    """What the server sent before closing `s` (b"" for a bare close), or None if still open after wait_s."""
    s.settimeout(wait_s)
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except TimeoutError:
        return None
    except OSError:
        return data
    return data


def test_probes_answer_while_idle_connections_exceed_every_limit(tmp_path):
    """300 connections that never send a byte, against a server that serves 20 requests and holds 60
    connections: before the guard every probe got 503 (uvicorn counts idle connections against
    limit_concurrency, and connections beyond the cap were refused); now the oldest idle ones are
    closed for newcomers, and probes are never refused for concurrency."""
    with serverproc.running_server(
        tmp_path / "server.log", database_url=f"sqlite:///{tmp_path / 'g.db'}",
        extra_args=["--limit-concurrency", "20", "--max-connections", "60", "--idle-timeout", "20"],
    ) as srv:
        idle = _idle_sockets(srv.port, 300)
        try:
            codes = []
            with httpx.Client(timeout=30) as client:  # one connection, kept alive across probes
                for _ in range(10):
                    for path in ("/livez", "/readyz"):
                        codes.append(client.get(srv.url + path).status_code)
            for _ in range(10):  # fresh connections each time, as an orchestrator's probe
                codes.append(httpx.get(srv.url + "/livez", timeout=30).status_code)
            assert codes == [200] * 30, codes
            # the oldest idle sockets were closed to make room (bare close: there was no request)
            assert _closed_by_server(idle[0], 5) == b""
        finally:
            for s in idle:
                s.close()
        log = srv.log.read_text()
    assert "Too many open files" not in log and "Traceback" not in log, log[-2000:]


def test_silent_sockets_are_dropped_at_the_first_byte_timeout_while_slow_requests_finish(tmp_path):
    with serverproc.running_server(
        tmp_path / "server.log", database_url=f"sqlite:///{tmp_path / 'g.db'}",
        extra_args=["--idle-timeout", "1", "--request-timeout", "30"],
    ) as srv:
        silent = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        slow = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        request = b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        try:
            # the slow client sends one byte every 0.25 s: 13 s in all, far past the first-byte
            # timeout, well inside the request timeout
            for byte in request:
                slow.sendall(bytes([byte]))
                time.sleep(0.25)
            # the silent one was closed long ago (the 30 s request timeout would still hold it)
            assert _closed_by_server(silent, 10) == b""
            answer = _closed_by_server(slow, 30)
            assert answer is not None and answer.startswith(b"HTTP/1.1 200"), answer
        finally:
            with contextlib.suppress(OSError):
                silent.close()
            slow.close()


def test_at_the_request_limit_other_requests_get_503_and_probes_answer(tmp_path):
    with serverproc.running_server(
        tmp_path / "server.log", database_url=f"sqlite:///{tmp_path / 'g.db'}",
        extra_args=["--limit-concurrency", "2", "--request-timeout", "30"],
    ) as srv:
        busy = []
        try:
            for _ in range(2):  # the limit's worth of requests in flight: headers in, body still arriving
                s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
                s.sendall(b"POST /v1/measurements HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 100\r\n\r\n{")
                busy.append(s)
            deadline = time.monotonic() + 30  # until the server has both in flight (a wait, not a timing)
            while True:
                r = httpx.get(srv.url + "/v1/measurements", timeout=30)
                if r.status_code != 200 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert r.status_code == 503 and r.headers.get("retry-after"), r.text[:200]
            for path in ("/livez", "/readyz", "/healthz"):
                assert httpx.get(srv.url + path, timeout=30).status_code == 200, path
        finally:
            for s in busy:
                s.close()
        assert httpx.get(srv.url + "/v1/measurements", timeout=30).status_code == 200
