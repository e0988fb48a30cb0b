"""Issue 17, item 6: a request body is capped before Django buffers it.

Before, a 1 GB chunked POST to /healthz filled the temporary folder by 992 MB before the 403: Django's
ASGI handler reads the whole body before routing. Here the real ASGI application is fed a body chunk
by chunk, and the test counts how much of it the server pulled.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from controlplane.body_limit import BodySizeLimit

pytestmark = pytest.mark.django_db(transaction=True)
MB = 1024 * 1024


def http_scope(path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), *headers],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }


def serve(app: Any, path: str, chunks: int, chunk_bytes: int = MB, declared: int | None = None):
    """POST ``chunks`` chunks to ``app``; (status, body, chunks the app pulled)."""
    pulled = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        if pulled >= chunks:
            await asyncio.sleep(3600)  # the client has nothing more to send
        pulled += 1
        return {"type": "http.request", "body": b"x" * chunk_bytes, "more_body": pulled < chunks}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(b"content-type", b"application/json")]
    if declared is not None:
        headers.append((b"content-length", str(declared).encode()))
    asyncio.run(asyncio.wait_for(app(http_scope(path, headers), receive, send), timeout=60))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], body, pulled


@pytest.fixture
def app(db) -> Any:
    from controlplane.asgi import application

    return application


@pytest.mark.parametrize("path", ["/healthz", "/api/v1/jobs", "/api/v1/ingest/jobs/1/telemetry", "/no/such/page"])
def test_a_gigabyte_chunked_body_is_refused_after_the_limit_not_after_the_gigabyte(app, settings, path):
    status, body, pulled = serve(app, path, chunks=1024)  # 1 GiB in 1 MiB chunks, no length declared
    assert status == 413
    assert json.loads(body)["error"]["field"] == "body"
    assert pulled <= settings.POLYCHIP_MAX_REQUEST_BYTES // MB + 1


def test_a_declared_length_over_the_limit_is_refused_before_a_byte_is_read(app):
    status, _, pulled = serve(app, "/healthz", chunks=1024, declared=1024 * MB)
    assert (status, pulled) == (413, 0)


def test_a_body_within_the_limit_reaches_the_view(app):
    status, _, _ = serve(app, "/api/v1/jobs", chunks=1, chunk_bytes=100)
    assert status == 401  # read, routed, and refused for what it is: no credentials


def test_routes_that_take_uploads_have_their_own_limit():
    async def inner(scope, receive, send):
        while True:  # read the whole body, as Django does, and answer nothing if the client went away
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    limited = BodySizeLimit(inner, default_limit=MB, upload_limits={"/api/v1/bundles": 8 * MB})
    assert serve(limited, "/api/v1/bundles", chunks=6)[0] == 204
    assert serve(limited, "/api/v1/bundles", chunks=9)[0] == 413
    assert serve(limited, "/api/v1/jobs", chunks=2)[0] == 413
