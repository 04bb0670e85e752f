"""Start `gridtune serve` as its own process for a bench and wait until it answers: the one way the
service benches (service_load, idle_flood, fuzz_service) bring a real server up on loopback.

    proc = start_serve(port, ["--database-url", url], env=env, cwd=root)
    ...
    stop_serve(proc)
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.request

SERVE = [sys.executable, "-c", "import sys; from cli import main; sys.exit(main(sys.argv[1:]))", "serve"]
"""`gridtune serve` through the interpreter running the bench (no console script needed)."""


def start_serve(port: int, args: list[str], *, env: dict[str, str], cwd: pathlib.Path | str,
                probe: str = "/livez", log: pathlib.Path | None = None,
                timeout_s: float = 60.0) -> subprocess.Popen:
    """`gridtune serve --port PORT ARGS...` in a new session (so a bench can kill its whole group),
    returned once GET `probe` answers 200; its output goes to `log` when given. SystemExit when the
    server exits or does not answer within `timeout_s` (the tail of `log` says why)."""
    out = log.open("ab") if log is not None else None
    proc = subprocess.Popen([*SERVE, "--port", str(port), *args], cwd=cwd, env=env, stdout=out,
                            stderr=subprocess.STDOUT if out is not None else None, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = f": {log.read_text()[-2000:]}" if log is not None else ""
            raise SystemExit(f"server exited with {proc.returncode}{tail}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{probe}", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"server did not start within {timeout_s:g} s")


def stop_serve(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """Stop the server's whole process group: SIGTERM, then SIGKILL after `grace_s` (a server that
    already exited is fine)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(grace_s)
