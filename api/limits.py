"""Request body size limit: a client cannot make the server read (and parse) an endless body.

The largest legitimate bodies are a 4,096-layer model or a profile with its fit tables, a few MB;
the default limit is 16 MiB (GRIDTUNE_MAX_BODY_MB). A declared Content-Length above it is refused
before reading; a chunked body is counted while it streams. Both answer 413.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import HTTPException


class BodyLimitMiddleware:
    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _message(self) -> str:
        return f"request body larger than {self.max_bytes:,} bytes"

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.max_bytes:
                    await self._refuse(send)
                    return
        seen = 0

        async def counting_receive() -> dict[str, Any]:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise HTTPException(status_code=413, detail=self._message())  # rendered by the app
            return message

        await self.app(scope, counting_receive, send)

    async def _refuse(self, send: Any) -> None:
        body = json.dumps({"detail": self._message()}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
