"""Which tenant a request acts for: the token's, or the signed-in user's."""

from __future__ import annotations

from rest_framework.exceptions import NotAuthenticated, PermissionDenied
from rest_framework.request import Request

from tenants import services
from tenants.models import ApiToken


def request_tenant_id(request: Request) -> int:
    if isinstance(request.auth, ApiToken):
        return request.auth.tenant_id
    if request.user is None or not request.user.is_authenticated:
        raise NotAuthenticated("send 'Authorization: Bearer <token>' or sign in to the portal")
    tenant = services.tenant_for_user(request.user)
    if tenant is None:
        raise PermissionDenied("your account belongs to no tenant; ask an operator to add you")
    return tenant.id
