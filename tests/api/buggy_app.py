"""An app with one route that raises (a stand-in for a bug), to see how a real server answers a 500."""

from __future__ import annotations

from typing import Any

from api import create_app
from api.settings import Settings


def create(database_url: str) -> Any:
    app = create_app(Settings(database_url=database_url))

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("a bug")

    return app
