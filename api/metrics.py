"""Request counts and latencies in the Prometheus text format (GET /metrics), without a client library.

A pure ASGI middleware (cheaper than BaseHTTPMiddleware on the hot path) times each HTTP request
and labels it by method, route template (`/v1/clusters/{cluster_id}`, never the raw path, so
random URLs cannot blow up the label set; unmatched paths count as "<unmatched>") and status.
Counters live in this process: with `--workers N`, each worker reports its own.

    gridtune_http_requests_total{method="POST",route="/v1/predict",status="200"} 42
    gridtune_http_request_duration_seconds_bucket{method="POST",route="/v1/predict",le="0.005"} 40
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable
from typing import Any

BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    def __init__(self) -> None:
        self.gauges: list[Callable[[], list[str]]] = []  # more exposition lines (cache, searches)
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str, str], int] = {}
        self._hist: dict[tuple[str, str], list[float]] = {}  # bucket counts..., sum, count
        self.started = time.time()

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route)
        idx = bisect.bisect_left(BUCKETS_S, seconds)
        with self._lock:
            ckey = (method, route, str(status))
            self._counts[ckey] = self._counts.get(ckey, 0) + 1
            hist = self._hist.get(key)
            if hist is None:
                hist = self._hist[key] = [0.0] * (len(BUCKETS_S) + 2)
            if idx < len(BUCKETS_S):
                hist[idx] += 1
            hist[-2] += seconds
            hist[-1] += 1

    def render(self) -> str:
        with self._lock:
            counts = dict(self._counts)
            hists = {k: list(v) for k, v in self._hist.items()}
        lines = [
            "# HELP gridtune_http_requests_total HTTP requests answered, by method, route and status.",
            "# TYPE gridtune_http_requests_total counter",
        ]
        for (method, route, status), n in sorted(counts.items()):
            lines.append(
                f'gridtune_http_requests_total{{method="{method}",route="{_esc(route)}",status="{status}"}} '
                f'{n}'
            )
        lines += [
            "# HELP gridtune_http_request_duration_seconds Time from request to last response byte.",
            "# TYPE gridtune_http_request_duration_seconds histogram",
        ]
        for (method, route), hist in sorted(hists.items()):
            labels = f'method="{method}",route="{_esc(route)}"'
            cumulative = 0.0
            for bound, n in zip(BUCKETS_S, hist[: len(BUCKETS_S)]):
                cumulative += n
                lines.append(
                    f'gridtune_http_request_duration_seconds_bucket{{{labels},le="{bound}"}} '
                    f'{int(cumulative)}'
                )
            lines.append(
                f'gridtune_http_request_duration_seconds_bucket{{{labels},le="+Inf"}} {int(hist[-1])}'
            )
            lines.append(f"gridtune_http_request_duration_seconds_sum{{{labels}}} {hist[-2]:.6f}")
            lines.append(f"gridtune_http_request_duration_seconds_count{{{labels}}} {int(hist[-1])}")
        lines += [
            "# HELP gridtune_process_start_time_seconds Start time of this process since the epoch.",
            "# TYPE gridtune_process_start_time_seconds gauge",
            f"gridtune_process_start_time_seconds {self.started:.3f}",
        ]
        for gauge in self.gauges:
            lines += gauge()
        return "\n".join(lines) + "\n"


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class MetricsMiddleware:
    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            name = getattr(route, "path", None) or "<unmatched>"
            self.metrics.observe(scope.get("method", "?"), name, status, time.perf_counter() - start)
