"""Fixtures for the browser tests: a real `gridtune serve` (uvicorn) process and the system Chromium
driven by Playwright's Python package.

Chromium comes from the operating system (`apt-get install chromium`, at /usr/bin/chromium;
`GRIDTUNE_CHROMIUM` names another binary): Playwright's own browser download is not used. Without a
browser (or without the playwright package) the tests skip with the reason on a developer's machine,
and fail when `CI=true`, where `.ci/run` installs Chromium first, so CI never passes by skipping them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api import serverproc

CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")


def _chromium() -> str | None:
    given = os.environ.get("GRIDTUNE_CHROMIUM", "").strip()
    if given:
        return given if Path(given).exists() or shutil.which(given) else None
    return next((c for c in CANDIDATES if Path(c).exists()), None)


def _missing(reason: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{reason}; CI must run the browser tests (.ci/run installs chromium with apt-get)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = _chromium()
    if path is None:
        _missing("no Chromium at /usr/bin/chromium (apt-get install chromium, or set GRIDTUNE_CHROMIUM)")
    return path  # type: ignore[return-value]


@pytest.fixture(scope="session")
def browser(chromium_path: str) -> Iterator[object]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright package is not installed (pip install -e '.[dev]')")
    with sync_playwright() as pw:
        # --no-sandbox: CI and containers run as root, where Chromium's sandbox cannot start
        b = pw.chromium.launch(executable_path=chromium_path, headless=True,
                               args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="session")
def web_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[serverproc.Server]:
    tmp = tmp_path_factory.mktemp("web")
    server = serverproc.start(tmp / "server.log", database_url=f"sqlite:///{tmp / 'web.db'}")
    try:
        yield server
    finally:
        serverproc.stop(server)


@pytest.fixture
def page(browser: object, web_server: serverproc.Server) -> Iterator[object]:
    """A fresh page on the server's origin, recording console errors, page errors and every request."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, base_url=web_server.url)  # type: ignore[attr-defined]
    pg = context.new_page()
    pg.console_errors = []  # type: ignore[attr-defined]
    pg.requests = []  # type: ignore[attr-defined]
    pg.on("console", lambda m: pg.console_errors.append(m.text) if m.type in ("error", "warning") else None)
    pg.on("pageerror", lambda e: pg.console_errors.append(f"uncaught: {e}"))
    pg.on("request", lambda r: pg.requests.append(r.url))
    pg.set_default_timeout(180_000)
    try:
        yield pg
    finally:
        context.close()
