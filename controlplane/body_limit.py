"""A cap on request bodies, applied before Django buffers them.

Django's ASGI handler reads a whole request body into a spooled temporary file before it routes the
request, so an unauthenticated 1 GB POST to any path filled the temporary folder before the answer
(403, 404 or 405) went out. This ASGI middleware answers 413 as soon as the declared length, or the
bytes received so far, pass the limit for the path: a default for the API and the portal, and larger
limits for the routes that take uploads (``POLYCHIP_UPLOAD_LIMITS``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# JSON bodies (a job spec, a telemetry batch of a few hundred events) are far below this.
DEFAULT_LIMIT_BYTES = 4 * 1024 * 1024
# A route that takes files of at most N bytes takes bodies of N plus this: a multipart form's boundary
# lines and part headers around the file, and its small text fields (a name).
UPLOAD_FRAMING_BYTES = 64 * 1024


class BodySizeLimit:
    def __init__(
        self, application: Any, default_limit: int = DEFAULT_LIMIT_BYTES, upload_limits: Mapping[str, int] | None = None
    ) -> None:
        self.application = application
        self.default_limit = default_limit
        # Longest prefix first, so that /api/v1/bundles/big wins over /api/v1/bundles.
        self.upload_limits = sorted((upload_limits or {}).items(), key=lambda item: -len(item[0]))

    def limit_for(self, path: str) -> int:
        return next((limit for prefix, limit in self.upload_limits if path.startswith(prefix)), self.default_limit)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] != "http":
            return await self.application(scope, receive, send)
        limit = self.limit_for(scope.get("path", ""))
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            return await _too_large(send, limit)

        received = 0
        over = False
        started = False

        async def limited_receive() -> dict[str, Any]:
            nonlocal received, over
            if over:
                return {"type": "http.disconnect"}
            message: dict[str, Any] = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # Django stops reading on a disconnect and answers nothing; the 413 is sent below.
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def watched_send(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.application(scope, limited_receive, watched_send)
        if over and not started:
            await _too_large(send, limit)
        return None


def _content_length(scope: dict[str, Any]) -> int | None:
    for key, value in scope.get("headers", []):
        if key.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _too_large(send: Any, limit: int) -> None:
    body = json.dumps(
        {
            "error": {
                "code": "too_large",
                "field": "body",
                "message": f"the request body is larger than {limit} bytes, the most this route takes",
            }
        }
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 413, "headers": [*headers, (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
