"""DRF authentication by bearer token; the request then carries the token's tenant."""

from __future__ import annotations

from typing import Any

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from tenants import services


class ApiTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = authentication.get_authorization_header(request).decode(errors="replace")
        if not header:
            return None
        scheme, _, secret = header.partition(" ")
        if scheme != self.keyword:
            return None
        if not secret.startswith(services.TOKEN_PREFIX):
            # Worker ingest tokens use the same header on their own endpoint; not ours to judge.
            return None
        # Looked up once per request: the Idempotency-Key middleware may have done it already.
        token = getattr(request._request, services.AUTHENTICATED_TOKEN, None) or services.authenticate_token(
            secret.strip()
        )
        if token is None:
            raise exceptions.AuthenticationFailed("token is unknown, expired or revoked; issue a new one")
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return self.keyword
