"""Load figures for the REST service: p50/p99 latency and requests/s under concurrent clients.

Starts a real `gridtune serve` (uvicorn) in a subprocess on a free port with a throw-away SQLite
store, then, per route, runs N concurrent clients (default 16) in a closed loop for S seconds
(default 30) and prints one line per route:

    .venv/bin/python bench/service_load.py                 # predict + recommend, 16 clients, 30 s each
    .venv/bin/python bench/service_load.py --seconds 5 --routes predict
    .venv/bin/python bench/service_load.py --workers 2     # two server processes

The routes: `predict` (GPT-3 175B on 1,024 A100s, Megatron's 8x16x8 layout) and `recommend` (GPT-3
175B on 1,024 GPUs, top 10). `--distinct K` cycles the clients through K different bodies so a cache
in the server cannot answer every request from one entry: the K bodies differ in their global batch
size, and no two share one (`distinct_batches`: the 16 sizes of `BATCHES`, then their multiples,
skipping any size already used, so every size stays a multiple of 128 and splits over 1,024 GPUs'
data-parallel degrees; predict's are 128, 256, ...). While fewer than K requests are sent (warm-up
ones take bodies from the far end of the list), no measured request is answered from the response
cache. By default every request is the same body, as a dashboard polling one question would send.

The clients are asyncio tasks speaking HTTP/1.1 keep-alive over raw sockets with pre-encoded
requests, so the client side costs little CPU and the figures are the server's (on a 2-core machine
client and server still share the cores). Latency is measured per request from write to the last
byte read; requests answered with anything but 200 are counted as errors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # bench/serve_process.py
from serve_process import start_serve, stop_serve  # noqa: E402

from api import examples  # noqa: E402

ROUTES = {
    "predict": ("/v1/predict", examples.PREDICT),
    "recommend": ("/v1/recommend", {**examples.RECOMMEND, "top_k": 10, "search": {"time_budget_s": 10.0}}),
}
BATCHES = (1536, 1024, 2048, 768, 512, 3072, 1280, 1792, 2304, 2560, 256, 4096, 384, 640, 896, 1152)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, db_url: str, workers: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("GRIDTUNE_API_KEY", None)
    return start_serve(port, ["--database-url", db_url, "--workers", str(workers), "--log-level", "warning"],
                       env=env, cwd=ROOT, probe="/healthz")


def distinct_batches(count: int) -> list[int]:
    """`count` different global batch sizes: BATCHES, then 2x, 3x, ... each of them, skipping the
    sizes already taken (1536 * 3 = 2304 * 2 appears once), so all are multiples of 128."""
    out: list[int] = []
    seen: set[int] = set()
    i = 0
    while len(out) < count:
        size = BATCHES[i % len(BATCHES)] * (1 + i // len(BATCHES))
        i += 1
        if size not in seen:
            seen.add(size)
            out.append(size)
    return out


def bodies(route: str, distinct: int) -> list[bytes]:
    path, body = ROUTES[route]
    count = max(1, min(distinct, 100_000))
    batches = distinct_batches(count) if route == "recommend" else [128 * (i + 1) for i in range(count)]
    out = []
    for i in range(count):
        b = json.loads(json.dumps(body))
        if distinct > 1:  # predict's plan stays valid: 128 * n splits over G_data=8 and 16 stages
            b["training"]["global_batch_size"] = batches[i]
        data = json.dumps(b).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n\r\n").encode()
        out.append(head + data)
    return out


async def read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = 0
    chunked = False
    for line in lines[1:]:
        key, _, value = line.partition(":")
        if key.lower() == "content-length":
            length = int(value.strip())
        elif key.lower() == "transfer-encoding" and "chunked" in value.lower():
            chunked = True
    if chunked:
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    else:
        await reader.readexactly(length)
    return status


async def client(port: int, requests: list[bytes], offset: int, stride: int, stop_at: float, lat: list[float],
                 errors: list[int]) -> None:
    """One keep-alive connection sending requests[offset], requests[offset + stride], ... in a closed loop."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    i = offset
    try:
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            writer.write(requests[i % len(requests)])
            await writer.drain()
            status = await read_response(reader)
            lat.append(time.perf_counter() - t0)
            if status != 200:
                errors.append(status)
            i += stride
    finally:
        writer.close()


async def run_route(
    port: int, route: str, clients: int, seconds: float, distinct: int, warmup: float
) -> dict:
    reqs = bodies(route, distinct)
    if warmup > 0:  # first requests import modules, fill caches: not part of the figures
        # (bodies from the far end of the list, so --distinct runs measure unseen questions)
        await asyncio.gather(*(client(port, reqs, len(reqs) - 1 - c, -1, time.perf_counter() + warmup, [], [])
                               for c in range(min(clients, 4))))
    lat: list[float] = []
    errors: list[int] = []
    start = time.perf_counter()
    await asyncio.gather(
        *(client(port, reqs, c, clients, start + seconds, lat, errors) for c in range(clients))
    )
    elapsed = time.perf_counter() - start
    lat.sort()

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p / 100 * len(lat)))] * 1000 if lat else float("nan")

    return {
        "route": route,
        "requests": len(lat),
        "errors": len(errors),
        "rps": len(lat) / elapsed,
        "p50_ms": pct(50),
        "p90_ms": pct(90),
        "p99_ms": pct(99),
        "max_ms": lat[-1] * 1000 if lat else float("nan"),
        "mean_ms": statistics.fmean(lat) * 1000 if lat else float("nan"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="measured seconds per route (default 30)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    parser.add_argument("--routes", default="predict,recommend", help="comma list of: " + ",".join(ROUTES))
    parser.add_argument("--workers", type=int, default=1, help="server processes (default 1)")
    parser.add_argument("--distinct", type=int, default=1, help="distinct request bodies to cycle through")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each route")
    parser.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    args = parser.parse_args(argv)
    routes = [r.strip() for r in args.routes.split(",") if r.strip()]
    for r in routes:
        if r not in ROUTES:
            parser.error(f"unknown route {r!r}; known: {list(ROUTES)}")

    tmp = tempfile.TemporaryDirectory(prefix="gridtune-bench-")
    port = free_port()
    proc = start_server(port, f"sqlite:///{tmp.name}/bench.db", args.workers)
    try:
        print(f"# gridtune service load: {args.clients} clients x {args.seconds:g} s per route, "
              f"{args.workers} server worker(s), {os.cpu_count()} CPU(s), distinct bodies {args.distinct}")
        if not args.json:
            print(f"{'route':<12}{'requests':>10}{'errors':>8}{'req/s':>9}{'p50 ms':>9}{'p90 ms':>9}"
                  f"{'p99 ms':>9}{'max ms':>9}")
        for route in routes:
            res = asyncio.run(run_route(port, route, args.clients, args.seconds, args.distinct, args.warmup))
            if args.json:
                print(json.dumps(res))
            else:
                print(f"{res['route']:<12}{res['requests']:>10}{res['errors']:>8}{res['rps']:>9.1f}"
                      f"{res['p50_ms']:>9.2f}{res['p90_ms']:>9.2f}{res['p99_ms']:>9.2f}{res['max_ms']:>9.1f}")
            sys.stdout.flush()
    finally:
        stop_serve(proc)
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
