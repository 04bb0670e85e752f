"""`create_app(settings=None)`: the FastAPI application, wired to its store and settings.

Run it with `gridtune serve --host 127.0.0.1 --port 8000` (uvicorn), or in-process for tests:

    from fastapi.testclient import TestClient
    from api import create_app
    from api.settings import Settings
    client = TestClient(create_app(Settings(database_url="sqlite:////tmp/t.db")))

The store is opened (schema migrated to the newest alembic revision) here, not at first request,
so a bad database URL fails at start-up instead of on the first write.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from api import errors
from api.limits import BodyLimitMiddleware
from api.methods import AllowMiddleware
from api.metrics import Metrics, MetricsMiddleware
from api.routers import clusters, measurements, model, ops, web
from api.searches import SearchRunner
from api.service import ProfileCache, ResponseCache
from api.settings import Settings
from tuner.store import Store

log = logging.getLogger("gridtune.api")

DESCRIPTION = """
Which parallel layout trains my model fastest on my cluster, and why?

* `POST /v1/recommend`: the best `G_data x G_inter x G_intra_d x G_intra_r x G_intra_c` grid
  (plus micro-batch, schedule, recomputation, ZeRO stage), ranked candidates and pruning reasons.
* `POST /v1/predict`: step time, memory and breakdown of one plan.
* `POST/GET /v1/clusters`: profiles measured by `gridtune profile`; pass `cluster.profile_id`
  to predict with their constants.
* `POST/GET /v1/measurements`: measured steps sent back by the engine (the closed loop).
* `GET /v1/presets`: the model, cluster and GPU presets by name.
* `GET /`: the web page (a form, the ranked layouts, launch command and scaling view).
* `GET /livez` (process up), `GET /readyz` and `/healthz` (the store takes writes).

Units: bandwidth GB/s per GPU per direction, latency microseconds, memory GiB, time seconds.
Writes need `Authorization: Bearer <GRIDTUNE_API_KEY>` when the server sets a key.
"""


def _service_lines(cache: ResponseCache, runner: SearchRunner) -> list[str]:
    return [
        "# HELP gridtune_cache_hits_total Answers of predict/recommend served from the cache.",
        "# TYPE gridtune_cache_hits_total counter",
        f"gridtune_cache_hits_total {cache.hits}",
        "# HELP gridtune_cache_misses_total Questions the cache could not answer.",
        "# TYPE gridtune_cache_misses_total counter",
        f"gridtune_cache_misses_total {cache.misses}",
        "# HELP gridtune_cache_bytes Bytes of cached answers.",
        "# TYPE gridtune_cache_bytes gauge",
        f"gridtune_cache_bytes {cache.size}",
        "# HELP gridtune_searches_pending Searches running or queued.",
        "# TYPE gridtune_searches_pending gauge",
        f"gridtune_searches_pending {runner.pending}",
    ]


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.from_env()
    store = Store(settings.database_url, table_prefix=settings.table_prefix)
    cache = ResponseCache(int(settings.cache_mb * 2**20))
    runner = SearchRunner(
        workers=settings.search_workers,
        max_pending=16 * settings.search_workers,
        cache=cache,
        isolation=settings.search_isolation,
    )

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        # an app may be started and stopped more than once (tests): stop leaves it restartable
        runner.start()
        try:
            yield
        finally:
            runner.stop()
            store.release_connections()

    from api import __version__

    # /docs and /redoc from assets shipped in the fastapi-offline wheel: they work on a cluster
    # without internet (FastAPI's default pages load Swagger UI and ReDoc from a CDN)
    app = FastAPIOffline(
        title="gridtune",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.store = store
    app.state.profiles = ProfileCache(store)
    app.state.metrics = Metrics()
    app.state.search_runner = runner
    app.state.cache = cache
    app.state.metrics.gauges.append(lambda: _service_lines(cache, runner))
    errors.install(app)
    for router in (model.router, clusters.router, measurements.router, ops.router, web.router):
        app.include_router(router)
    app.add_middleware(BodyLimitMiddleware, max_bytes=int(settings.max_body_mb * 2**20))
    app.add_middleware(AllowMiddleware, fastapi_app=app)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)  # outermost: counts 413s too
    log.info("gridtune API on %s (auth %s)", store.backend, "on" if settings.api_key else "off")
    return app
