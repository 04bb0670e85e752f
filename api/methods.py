"""OPTIONS and 405 answers that list every method a path has.

Why: Starlette answers for the first route whose path matches, so `OPTIONS /v1/clusters` said
`Allow: POST` although `GET /v1/clusters` exists too (two routes, one path). This middleware answers
OPTIONS itself (204, `Allow` with all methods of all routes matching the path, HEAD with GET) and
rewrites the `Allow` header of a 405 the same way.
"""

from __future__ import annotations

from typing import Any

from starlette.routing import Match, Mount

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def allowed_methods(app: Any, scope: dict[str, Any]) -> list[str]:
    """Methods with a route of `app` for this request's path: asks the router, method by method, which
    would fully match (works through included routers without looking inside them)."""
    methods: set[str] = set()
    for route in app.router.routes:
        if isinstance(route, Mount):
            if route.matches(scope)[0] != Match.NONE:
                methods |= {"GET", "HEAD"}
            continue
        for method in METHODS:
            if method not in methods and route.matches({**scope, "method": method})[0] == Match.FULL:
                methods.add(method)
    if "GET" in methods:
        methods.add("HEAD")
    if methods:
        methods.add("OPTIONS")
    return sorted(methods)


class AllowMiddleware:
    def __init__(self, app: Any, fastapi_app: Any) -> None:
        self.app = app
        self.fastapi_app = fastapi_app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] == "OPTIONS" and not any(k == b"access-control-request-method"
                                                    for k, _ in scope.get("headers", ())):
            methods = allowed_methods(self.fastapi_app, scope)
            if methods:
                await send({"type": "http.response.start", "status": 204,
                            "headers": [(b"allow", ", ".join(methods).encode())]})
                await send({"type": "http.response.body", "body": b""})
                return

        async def send_with_allow(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and message["status"] == 405:
                methods = ", ".join(allowed_methods(self.fastapi_app, scope)).encode()
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"allow"]
                message = {**message, "headers": [*headers, (b"allow", methods)]}
            await send(message)

        await self.app(scope, receive, send_with_allow)
