"""GET / : the web page (a form, the ranked layouts, their time and memory, the launch command and a
scaling view), served from files shipped in the package (`api/web/`), with nothing loaded from
another origin.

The page is plain HTML, CSS and JavaScript (no build step). It asks the same `/v1/presets` and
`/v1/recommend` every other client asks, so its numbers are the REST answer's. The URL carries the
question (`/?model=llama3-70b&cluster=eos&gpus=256&global_batch_size=512&stack=megatron-core` fills the
form and runs it), so an answer can be shared as a link.

Every file is answered with a Content-Security-Policy that allows this origin only (scripts, styles,
images, fetches), so the page cannot load or send anything elsewhere even if a value it shows were
crafted to try.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse

router = APIRouter(include_in_schema=False)
WEB_DIR = Path(__file__).resolve().parent.parent / "web"
MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
               ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}
ASSETS = frozenset(p.name for p in WEB_DIR.iterdir() if p.suffix in MEDIA_TYPES and p.name != "index.html")
"""The files under /web/ (a fixed list: no path from the request reaches the file system)."""


def _file(name: str) -> FileResponse:
    path = WEB_DIR / name
    return FileResponse(path, media_type=MEDIA_TYPES[path.suffix], headers=HEADERS)


@router.api_route("/", methods=["GET", "HEAD"])
def index() -> FileResponse:
    return _file("index.html")


@router.api_route("/web/{name}", methods=["GET", "HEAD"])
def asset(name: str) -> FileResponse:
    if name not in ASSETS:
        raise HTTPException(status_code=404, detail=f"no file {name!r} under /web/")
    return _file(name)


@router.api_route("/favicon.ico", methods=["GET", "HEAD"])
def favicon() -> FileResponse:
    return _file("favicon.svg")
