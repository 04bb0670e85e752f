"""Service settings, read from the environment once when the app is created.

    GRIDTUNE_DATABASE_URL   SQLAlchemy URL of the store (default: SQLite file in the user's data
                            folder, ~/.local/share/gridtune/gridtune.db)
    GRIDTUNE_API_KEY        when set, POST /v1/clusters and /v1/measurements need
                            `Authorization: Bearer <key>`; reads stay open
    GRIDTUNE_MAX_GPUS       largest cluster.num_gpus /v1/recommend accepts (default 1,048,576)
    GRIDTUNE_MAX_SEARCH_S   ceiling on a search's time budget in seconds (default 30)
    GRIDTUNE_SEARCH_WORKERS searches run at once, each in its own warm worker process (default: the
                            CPUs this process may use; searches are CPU-bound). Per server process:
                            with `gridtune serve --workers N` each has its own
    GRIDTUNE_CACHE_MB       memory for cached predict/recommend answers (default 64; 0 disables)
    GRIDTUNE_MAX_BODY_MB    largest request body accepted, in MiB (default 16; larger: 413)
    GRIDTUNE_DB_LOCK_TIMEOUT_S  seconds a write waits for another writer's lock before a 503 (default 5)
    GRIDTUNE_TABLE_PREFIX   prefix of the store's table names (default gridtune_), so several services
                            can share one database
    GRIDTUNE_MAX_PAGE_MB    a list page (GET /v1/measurements, /v1/clusters) ends after about this many
                            MiB of JSON (default 8; it always holds at least one row)
    GRIDTUNE_SEARCH_ISOLATION  "process" (default: searches in worker processes, one killed and
                            replaced when its search overruns) or "thread"

Tests build `Settings(...)` directly and pass it to `create_app(settings)`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from tuner.search import MAX_GPUS as SEARCH_MAX_GPUS
from tuner.store import default_database_url

DEFAULT_MAX_GPUS = SEARCH_MAX_GPUS  # one bound with `gridtune recommend` (tuner.search.MAX_GPUS)


def default_search_workers() -> int:
    """One search worker per CPU this process may run on (its affinity where the platform tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def _env_float(name: str, default: float, *, allow_zero: bool = False) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None
    if not (value >= 0 if allow_zero else value > 0) or value != value or value == float("inf"):
        raise ValueError(f"{name} must be {'non-negative' if allow_zero else 'positive'}, got {value}")
    return value


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything the service reads from outside; frozen so a running app cannot drift."""

    database_url: str = field(default_factory=default_database_url)
    api_key: str | None = None
    table_prefix: str = "gridtune_"
    max_recommend_gpus: int = DEFAULT_MAX_GPUS
    max_search_time_s: float = 30.0
    default_search_time_s: float = 10.0
    search_workers: int = field(default_factory=default_search_workers)
    max_top_k: int = 100
    cache_mb: float = 64.0
    max_body_mb: float = 16.0
    max_page_mb: float = 8.0
    search_isolation: str = "process"

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key:
            object.__setattr__(self, "api_key", None)
        if self.search_isolation not in ("process", "thread"):
            raise ValueError(
                f"GRIDTUNE_SEARCH_ISOLATION must be 'process' or 'thread', got {self.search_isolation!r}"
            )
        if self.default_search_time_s > self.max_search_time_s:
            object.__setattr__(self, "default_search_time_s", self.max_search_time_s)

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            database_url=default_database_url(),
            api_key=os.environ.get("GRIDTUNE_API_KEY") or None,
            table_prefix=os.environ.get("GRIDTUNE_TABLE_PREFIX", "").strip() or "gridtune_",
            max_recommend_gpus=_env_int("GRIDTUNE_MAX_GPUS", DEFAULT_MAX_GPUS),
            max_search_time_s=_env_float("GRIDTUNE_MAX_SEARCH_S", 30.0),
            search_workers=_env_int("GRIDTUNE_SEARCH_WORKERS", default_search_workers()),
            cache_mb=_env_float("GRIDTUNE_CACHE_MB", 64.0, allow_zero=True),
            search_isolation=os.environ.get("GRIDTUNE_SEARCH_ISOLATION", "").strip() or "process",
            max_body_mb=_env_float("GRIDTUNE_MAX_BODY_MB", 16.0),
            max_page_mb=_env_float("GRIDTUNE_MAX_PAGE_MB", 8.0),
        )
