"""Idle-connection flood against the REST service: do the health probes keep answering, how soon are
silent sockets dropped, does a slow request that makes progress still finish?

Starts a real `gridtune serve` (uvicorn) on a free loopback port with a throw-away SQLite store (or
attacks `--url`), then for `--seconds` (default 30):

- the attacker holds `--connections` (default 2,000) TCP connections open that never send a byte,
  reopening each one as soon as the server closes it (as an attacker would, forever);
- a prober opens a fresh connection every `--probe-every` s (default 0.25) and asks `/livez` or
  `/readyz` in turn; each probe's status and time from connect to the last byte is recorded (a
  probe with no answer within 5 s counts as a failure);
- a slow client sends one request one byte every `--slow-byte-s` s (default 0.2 s; about 12 s for the
  whole request), far past the first-byte timeout and inside the 30 s request budget.

Printed: connections held while probing, probes answered 200 within 1 s, probe latency p50/max,
how long silent sockets lived before the server dropped them (p50/max), and the slow request's
status. Loopback only; every loop is bounded by `--seconds`.

    .venv/bin/python bench/idle_flood.py                          # 2,000 idle connections, 30 s
    .venv/bin/python bench/idle_flood.py --code-root /path/to/old/checkout   # the same against other code

The open-file limit of this process is raised to its hard limit (2,000 sockets need more than the
common 1,024 soft limit); the server raises its own.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import multiprocessing.queues
import os
import pathlib
import resource
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # bench/serve_process.py
from serve_process import start_serve, stop_serve  # noqa: E402

PROBE_TIMEOUT_S = 5.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, db_url: str, code_root: pathlib.Path, serve_args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(code_root)}
    env.pop("GRIDTUNE_API_KEY", None)
    return start_serve(port, ["--database-url", db_url, "--log-level", "warning", *serve_args], env=env,
                       cwd=code_root)


class Attacker(multiprocessing.Process):
    """Keeps `n` silent connections open until `stop_at`, reopening each one the server closes.

    Its own process, so its churn does not delay the prober's clock (the GIL)."""

    def __init__(self, port: int, n: int, stop_at: float) -> None:
        super().__init__(daemon=True)
        self.port, self.n, self.stop_at = port, n, stop_at
        self.opened_at: dict[socket.socket, float] = {}
        self.lifetimes_s: list[float] = []
        self.connect_errors = 0
        self.held_now = multiprocessing.Value("i", 0)
        self.report: multiprocessing.queues.SimpleQueue = multiprocessing.SimpleQueue()

    def _open(self) -> None:
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", self.port))
        self.selector.register(s, selectors.EVENT_READ)
        self.opened_at[s] = time.monotonic()

    def _close(self, s: socket.socket, dropped: bool) -> None:
        self.selector.unregister(s)
        started = self.opened_at.pop(s)
        if dropped:
            self.lifetimes_s.append(time.monotonic() - started)
        s.close()

    def run(self) -> None:
        self.selector = selectors.DefaultSelector()
        threading.Thread(target=self._count, daemon=True).start()
        while len(self.opened_at) < self.n and time.monotonic() < self.stop_at:
            try:
                self._open()
            except OSError:
                self.connect_errors += 1
                time.sleep(0.01)
        while time.monotonic() < self.stop_at:
            for key, _ in self.selector.select(timeout=0.05):
                s = key.fileobj
                try:
                    data = s.recv(4096)  # type: ignore[union-attr]
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:  # the server closed it: reopen at once
                    self._close(s, dropped=True)  # type: ignore[arg-type]
                    try:
                        self._open()
                    except OSError:
                        self.connect_errors += 1
        for s in list(self.opened_at):
            self._close(s, dropped=False)
        self.report.put((self.lifetimes_s, self.connect_errors))

    def _count(self) -> None:
        while time.monotonic() < self.stop_at:
            self.held_now.value = len(self.opened_at)
            time.sleep(0.05)

    def held(self) -> int:
        return int(self.held_now.value)

    def results(self) -> tuple[list[float], int]:
        return self.report.get()


def probe(port: int, path: str) -> tuple[int, float]:
    """(status or 0 for no answer, seconds from connect to the last byte)."""
    t0 = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT_S) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0
    except (OSError, ValueError, IndexError):
        status = 0
    return status, time.monotonic() - t0


def slow_request(port: int, byte_s: float, out: dict[str, object]) -> None:
    request = b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    t0 = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            for byte in request:
                s.sendall(bytes([byte]))
                time.sleep(byte_s)
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        out["status"] = data.split(b"\r\n", 1)[0].decode("latin-1") or "closed without an answer"
    except OSError as exc:
        out["status"] = f"{type(exc).__name__}: {exc}"
    out["seconds"] = time.monotonic() - t0
    out["bytes"] = len(request)


def server_cpu_s(proc: subprocess.Popen | None) -> float:
    """User + system CPU seconds of the server process so far (Linux /proc; NaN elsewhere)."""
    try:
        fields = pathlib.Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()  # type: ignore[union-attr]
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, AttributeError, IndexError, ValueError):
        return float("nan")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--probe-every", type=float, default=0.25)
    parser.add_argument("--slow-byte-s", type=float, default=0.2)
    parser.add_argument("--url", help="attack this running server (http://127.0.0.1:PORT), not a new one")
    parser.add_argument("--code-root", type=pathlib.Path, default=ROOT,
                        help="checkout whose `gridtune serve` is started (default: this one)")
    parser.add_argument("--serve-arg", action="append", default=[], help="extra `gridtune serve` argument")
    args = parser.parse_args(argv)
    if not 1 <= args.connections <= 20_000 or not 1 <= args.seconds <= 600:
        raise SystemExit("--connections must be in 1..20000 and --seconds in 1..600")

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < args.connections + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and soft < args.connections + 64:
        raise SystemExit(f"open-file limit {soft} is too low for {args.connections} connections (ulimit -n)")

    proc = None
    tmp = tempfile.TemporaryDirectory()
    try:
        if args.url:
            port = int(args.url.rsplit(":", 1)[1].strip("/"))
        else:
            port = free_port()
            proc = start_server(port, f"sqlite:///{tmp.name}/flood.db", args.code_root, args.serve_arg)
        cpu0, t0 = server_cpu_s(proc), time.monotonic()
        stop_at = time.monotonic() + args.seconds
        attacker = Attacker(port, args.connections, stop_at)
        attacker.start()
        while attacker.held() < args.connections and time.monotonic() < stop_at - 1:
            time.sleep(0.05)
        slow: dict[str, object] = {}
        slow_thread = threading.Thread(target=slow_request, args=(port, args.slow_byte_s, slow), daemon=True)
        slow_thread.start()
        results: dict[str, list[tuple[int, float]]] = {"/livez": [], "/readyz": []}
        held: list[int] = []
        slow_probes: list[str] = []
        i = 0
        while time.monotonic() < stop_at - PROBE_TIMEOUT_S:
            path = "/livez" if i % 2 == 0 else "/readyz"
            held.append(attacker.held())
            results[path].append(probe(port, path))
            if results[path][-1][1] > 0.5:
                slow_probes.append(f"{path} at {time.monotonic() - t0:.1f} s: {results[path][-1][1]:.2f} s")
            i += 1
            time.sleep(args.probe_every)
        lifetimes, connect_errors = attacker.results()
        cpu_share = (server_cpu_s(proc) - cpu0) / (time.monotonic() - t0)
        attacker.join(30)
        slow_thread.join(60)
    finally:
        if proc is not None:
            stop_serve(proc)
        tmp.cleanup()

    print(f"idle_flood: {args.connections} silent connections for {args.seconds:g} s against "
          f"{'the server at ' + args.url if args.url else 'gridtune serve from ' + str(args.code_root)}"
          f" {' '.join(args.serve_arg)}".rstrip())
    print(f"  connections held open while probing: min {min(held, default=0)}, "
          f"median {statistics.median(held) if held else 0:g} (connect errors {connect_errors})")
    for path, rows in results.items():
        ok = sum(1 for status, dt in rows if status == 200 and dt <= 1.0)
        codes: dict[int, int] = {}
        for status, _ in rows:
            codes[status] = codes.get(status, 0) + 1
        lat = [dt for _, dt in rows]
        print(f"  {path}: {ok} of {len(rows)} probes answered 200 within 1 s; "
              f"statuses {dict(sorted(codes.items()))} "
              f"(0 = no HTTP answer: reset, refused or none in {PROBE_TIMEOUT_S:g} s); "
              f"latency p50 {pct(lat, 0.5) * 1e3:.1f} ms, "
              f"max {max(lat, default=float('nan')) * 1e3:.1f} ms")
    if slow_probes:
        print(f"  probes slower than 0.5 s: {'; '.join(slow_probes[:10])}")
    life = lifetimes
    print(f"  silent sockets dropped by the server: {len(life)}; lifetime p50 {pct(life, 0.5):.2f} s, "
          f"p99 {pct(life, 0.99):.2f} s, max {max(life, default=float('nan')):.2f} s")
    print(f"  server CPU during the flood: {cpu_share * 100:.0f}% of one core; "
          f"load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"  slow request ({slow.get('bytes')} bytes, one every {args.slow_byte_s:g} s): "
          f"{slow.get('status')} after {float(slow.get('seconds', float('nan'))):.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
