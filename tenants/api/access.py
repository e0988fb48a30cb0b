"""Which tenant a request acts for: the token's, or the signed-in user's."""

from __future__ import annotations

from rest_framework.exceptions import NotAuthenticated, PermissionDenied
from rest_framework.request import Request

from tenants.permissions import Access, request_access

__all__ = ["Access", "request_access", "request_tenant_id"]


def request_tenant_id(request: Request) -> int:
    access = request_access(request)
    if access.tenant_id is not None:
        return access.tenant_id
    if request.user is None or not request.user.is_authenticated:
        raise NotAuthenticated("send 'Authorization: Bearer <token>' or sign in to the portal")
    raise PermissionDenied("your account belongs to no tenant; ask an operator to add you")
