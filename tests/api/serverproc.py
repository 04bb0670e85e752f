"""Start and stop a real `gridtune serve` (uvicorn) process for the service tests.

    with running_server(tmp_path, "sqlite:///...", extra_args=["--request-timeout", "1"]) as srv:
        httpx.get(srv.url + "/livez")

The start-up wait polls /livez (up to 60 s); it is a wait, not a timing assertion.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True, kw_only=True)
class Server:
    proc: subprocess.Popen
    url: str
    port: int
    log: pathlib.Path


def start(log: pathlib.Path, *, database_url: str | None = None, env: dict[str, str] | None = None,
          extra_args: list[str] | None = None, command: list[str] | None = None,
          port: int | None = None) -> Server:
    port = port or free_port()
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    full_env.pop("GRIDTUNE_DATABASE_URL", None)
    full_env.pop("GRIDTUNE_API_KEY", None) if "GRIDTUNE_API_KEY" not in (env or {}) else None
    if command is None:
        command = [sys.executable, "-c", "import sys; from cli import main; sys.exit(main(sys.argv[1:]))",
                   "serve", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
        if database_url:
            command += ["--database-url", database_url]
        command += extra_args or []
    proc = subprocess.Popen(command, cwd=ROOT, env=full_env, stdout=log.open("ab"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/livez", timeout=1.0).status_code == 200:
                return Server(proc=proc, url=url, port=port, log=log)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"server did not answer /livez:\n{log.read_text()[-3000:]}")


def stop(server: Server) -> None:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(15)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait(15)


@contextlib.contextmanager
def running_server(log: pathlib.Path, **kwargs: object) -> Iterator[Server]:
    server = start(log, **kwargs)  # type: ignore[arg-type]
    try:
        yield server
    finally:
        stop(server)
