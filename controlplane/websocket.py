"""The WebSocket's origin check: the page that opens a socket must come from this very server.

Channels' ``AllowedHostsOriginValidator`` compares only the host name of the Origin header with
``ALLOWED_HOSTS``: a page on ``http://127.0.0.1:9999`` (another program on the same machine) or on
``http://`` where the portal is served over ``https://`` passed. Here the Origin must equal the
origin the socket was opened on (scheme, host and port, from the Host header and whether the socket
is ``wss``), or be listed in ``CSRF_TRUSTED_ORIGINS`` (a proxy's public address); and the Host
must be one of ``ALLOWED_HOSTS``, as for HTTP, so that a rebound DNS name cannot pose as this server.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.http.request import split_domain_port, validate_host

DEFAULT_PORTS = {"http": 80, "https": 443}


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def _canonical(origin: str) -> tuple[str, str, int] | None:
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    return parts.scheme, parts.hostname.lower(), port or DEFAULT_PORTS[parts.scheme]


def same_origin(scope: dict[str, Any]) -> bool:
    origin, host = _header(scope, b"origin"), _header(scope, b"host")
    if not origin or not host:
        return False
    claimed = _canonical(origin)
    domain, _ = split_domain_port(host)
    if claimed is None or not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return False
    scheme = "https" if scope.get("scheme") in ("wss", "https") else "http"
    if claimed == _canonical(f"{scheme}://{host}"):
        return True
    trusted = {_canonical(url) for url in getattr(settings, "CSRF_TRUSTED_ORIGINS", [])}
    return claimed in trusted


class SameOriginValidator:
    """ASGI middleware: a WebSocket whose Origin is not this server's is denied at the handshake."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and not same_origin(scope):
            # Closing before accepting is the ASGI way to refuse the handshake (the server answers 403);
            # no consumer is made, so a refused socket costs no channel on the layer.
            if (await receive())["type"] == "websocket.connect":
                await send({"type": "websocket.close", "code": 1008})
            return None
        return await self.application(scope, receive, send)
