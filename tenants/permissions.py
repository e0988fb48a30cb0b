"""Who may do what: roles grant scopes, tokens narrow them, views require them.

A member's role grants scopes (``ROLE_SCOPES``): viewer reads; member reads and submits; admin and
owner also manage (tokens, members). A request's effective scopes are

- with an API token: the token's scopes ∩ the scopes of its user's role in the token's tenant
  (a token outlives nothing: demote the user and their tokens lose what the role lost);
- with a portal session: the scopes of the user's role in the tenant they act for.

Views declare what they need with ``RequireScope`` (safe methods need ``read``; other methods
need the view's ``write_scope``, ``submit`` unless it says otherwise) or with a class made by
``scope_required(write=..., read=...)``. Operator routes use ``IsOperator``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from rest_framework.exceptions import NotAuthenticated, PermissionDenied
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request

from controlplane import logs
from tenants import services
from tenants.models import ApiToken, Scope
from tenants.services import ROLE_SCOPES, role_scopes

READ: Final = Scope.READ.value
SUBMIT: Final = Scope.SUBMIT.value
MANAGE: Final = Scope.MANAGE.value
ALL_SCOPES: Final = frozenset(s.value for s in Scope)

__all__ = [
    "ALL_SCOPES",
    "MANAGE",
    "READ",
    "ROLE_SCOPES",
    "SUBMIT",
    "Access",
    "IsOperator",
    "RequireScope",
    "effective_scopes",
    "grantable_scopes",
    "request_access",
    "request_tenant_id",
    "required_scope",
    "scope_required",
]


def grantable_scopes(role: str | None) -> frozenset[str]:
    """The scopes a member in ``role`` has, and so the most a token of theirs may carry."""
    return role_scopes(role)


def effective_scopes(role: str | None, token_scopes: Iterable[str] | None) -> frozenset[str]:
    """What a request may do: the role's scopes, narrowed by the token's when there is one."""
    granted = role_scopes(role)
    if token_scopes is None:
        return granted
    if isinstance(token_scopes, str):  # a malformed JSON value must not grant its letters
        return frozenset()
    return granted & frozenset(token_scopes)


@dataclass(frozen=True)
class Access:
    """Whom a request acts for: a tenant (or none), the member's role there, and the scopes."""

    tenant_id: int | None
    role: str | None
    scopes: frozenset[str]
    via_token: bool


NO_ACCESS: Final = Access(tenant_id=None, role=None, scopes=frozenset(), via_token=False)
_CACHE_ATTR = "_polychip_access"


def request_access(request: Request) -> Access:
    """The request's tenant, role and effective scopes, worked out once per request."""
    cached = getattr(request, _CACHE_ATTR, None)
    if isinstance(cached, Access):
        return cached
    auth = request.auth
    if isinstance(auth, ApiToken):
        # authenticate_token annotates the role; fetch it when a token came some other way.
        role = getattr(auth, "member_role", None)
        if role is None and auth.pk is not None:
            role = services.role_in_tenant(user_id=auth.user_id, tenant_id=auth.tenant_id)
        access = Access(
            tenant_id=auth.tenant_id,
            role=role,
            scopes=effective_scopes(role, auth.scopes if isinstance(auth.scopes, list) else ()),
            via_token=True,
        )
    elif request.user is not None and request.user.is_authenticated:
        member = services.membership_for_user(request.user)
        access = (
            Access(
                tenant_id=member.tenant.id,
                role=member.role,
                scopes=effective_scopes(member.role, None),
                via_token=False,
            )
            if member
            else NO_ACCESS
        )
    else:
        access = NO_ACCESS
    setattr(request, _CACHE_ATTR, access)
    return access


def request_tenant_id(request: Request) -> int:
    """The tenant a request acts for: the token's, or the signed-in user's; 401 or 403 when none."""
    access = request_access(request)
    if access.tenant_id is not None:
        logs.bind(tenant=access.tenant_id)  # the request's log lines say whose it is
        return access.tenant_id
    if request.user is None or not request.user.is_authenticated:
        raise NotAuthenticated("send 'Authorization: Bearer <token>' or sign in to the portal")
    raise PermissionDenied("your account belongs to no tenant; ask an operator to add you")


def required_scope(request: Request, view: Any, *, read: str = READ, write: str | None = None) -> str:
    """The scope a request to ``view`` needs: ``view.method_scopes[METHOD]`` if the view names one,
    else ``read`` for safe methods and the view's ``write_scope`` (default ``submit``) for the rest."""
    method = (request.method or "GET").upper()
    per_method = getattr(view, "method_scopes", None) or {}
    if method in per_method:
        return str(per_method[method])
    if method in SAFE_METHODS:
        return read
    return write or str(getattr(view, "write_scope", SUBMIT))


def _denial(access: Access, scope: str) -> str:
    if access.tenant_id is None:
        return "your account belongs to no tenant; ask an operator to add you"
    if access.via_token:
        if scope not in role_scopes(access.role):
            return (
                f"this token's user has the role {access.role!r}, which lacks the {scope!r} scope; "
                "ask an owner or admin of the tenant for a role that has it"
            )
        return f"this token lacks the {scope!r} scope; issue one with it"
    return f"your role {access.role!r} lacks the {scope!r} scope; ask an owner or admin of the tenant"


class RequireScope(BasePermission):
    """Tenant routes: the request's effective scopes must include what the method needs.

    Anonymous requests fail it and DRF answers 401; a member lacking the scope gets 403 with a
    message that names the scope and the fix.
    """

    read_scope: str = READ
    write_scope: str | None = None  # None: the view's write_scope, else submit
    message = "this request lacks the scope it needs"

    def has_permission(self, request: Request, view: Any) -> bool:
        if request.user is None or not request.user.is_authenticated:
            return False
        scope = required_scope(request, view, read=self.read_scope, write=self.write_scope)
        access = request_access(request)
        if scope in access.scopes:
            return True
        self.message = _denial(access, scope)
        return False


def scope_required(write: str = SUBMIT, *, read: str = READ) -> type[RequireScope]:
    """A RequireScope with fixed scopes: ``permission_classes = [scope_required("manage", read="manage")]``."""
    for scope in (write, read):
        if scope not in ALL_SCOPES:
            raise ValueError(f"unknown scope {scope!r}; the scopes are {sorted(ALL_SCOPES)}")
    return type(f"RequireScope_{read}_{write}", (RequireScope,), {"read_scope": read, "write_scope": write})


class IsOperator(BasePermission):
    """Operator routes: an active staff user signed in with a session.

    Tenant API tokens are refused even when their user is staff: a token is a tenant's credential,
    and one leaked from a CI pipeline must not run the cloud.
    """

    message = "operators only: sign in with an operator (staff) account"

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        if user is None or not user.is_authenticated:
            return False
        if isinstance(request.auth, ApiToken):
            self.message = "tenant API tokens cannot use the operator API; sign in with an operator account"
            return False
        return bool(user.is_active and getattr(user, "is_staff", False))
