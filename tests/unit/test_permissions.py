"""Roles, scopes and the permission classes, without a database: role by scope tables."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import models
from django.test.utils import isolate_apps
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory, force_authenticate
from rest_framework.views import APIView

from tenants import permissions
from tenants.contracts import MemberRef, TenantRef
from tenants.models import ApiToken, Quota
from tenants.permissions import (
    IsOperator,
    RequireScope,
    effective_scopes,
    grantable_scopes,
    required_scope,
    scope_required,
)
from tenants.scoping import TenantScopedManager

ROLES = ("viewer", "member", "admin", "owner")
SCOPES = ("read", "submit", "manage")
METHODS = ("GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE")

# The table the rest follows: which role has which scope.
GRANTS = {
    "viewer": {"read"},
    "member": {"read", "submit"},
    "admin": {"read", "submit", "manage"},
    "owner": {"read", "submit", "manage"},
}


@pytest.mark.parametrize(("role", "scope"), list(itertools.product(ROLES, SCOPES)))
def test_each_role_grants_exactly_its_scopes(role, scope):
    assert (scope in grantable_scopes(role)) == (scope in GRANTS[role])
    assert (scope in effective_scopes(role, None)) == (scope in GRANTS[role])


def test_unknown_or_missing_roles_grant_nothing():
    assert grantable_scopes(None) == frozenset()
    assert grantable_scopes("superuser") == frozenset()
    assert effective_scopes(None, list(SCOPES)) == frozenset()


TOKEN_SCOPE_SETS = [(), ("read",), ("submit",), ("manage",), ("read", "submit"), SCOPES]


@pytest.mark.parametrize(("role", "token_scopes"), list(itertools.product(ROLES, TOKEN_SCOPE_SETS)))
def test_a_tokens_scopes_are_narrowed_by_its_users_role(role, token_scopes):
    assert effective_scopes(role, list(token_scopes)) == GRANTS[role] & set(token_scopes)


def test_malformed_token_scopes_grant_nothing():
    assert effective_scopes("owner", "read") == frozenset()  # a string is not a list of scopes
    assert effective_scopes("owner", ["root", "admin"]) == frozenset()


class _View:
    pass


class _ManageView:
    write_scope = "manage"


class _PerMethodView:
    method_scopes = {"GET": "manage", "DELETE": "manage"}


@pytest.mark.parametrize("method", METHODS)
def test_safe_methods_need_read_and_the_rest_the_views_write_scope(method):
    request = APIRequestFactory().generic(method, "/")
    safe = method in ("GET", "HEAD", "OPTIONS")
    assert required_scope(request, _View()) == ("read" if safe else "submit")
    assert required_scope(request, _ManageView()) == ("read" if safe else "manage")
    per_method = required_scope(request, _PerMethodView())
    assert per_method == {"GET": "manage", "DELETE": "manage"}.get(method, "read" if safe else "submit")


def test_scope_required_fixes_the_scopes_and_rejects_unknown_ones():
    cls = scope_required("manage", read="manage")
    assert issubclass(cls, RequireScope) and (cls.read_scope, cls.write_scope) == ("manage", "manage")
    with pytest.raises(ValueError, match="unknown scope 'admin'"):
        scope_required("admin")


# --- the permission classes inside a DRF view -----------------------------------------------


class Probe(APIView):
    permission_classes = [RequireScope]

    def get(self, request: Any) -> Response:
        return Response({"ok": True})

    def post(self, request: Any) -> Response:
        return Response({"ok": True})

    def delete(self, request: Any) -> Response:
        return Response({"ok": True})


class ManageProbe(Probe):
    permission_classes = [scope_required("manage", read="manage")]


class OperatorProbe(Probe):
    permission_classes = [IsOperator]


def _user(*, staff: bool = False, active: bool = True) -> User:
    return User(pk=41, username="someone", is_staff=staff, is_active=active)


def _token(role: str | None, scopes: Any) -> ApiToken:
    token = ApiToken(tenant_id=7, user_id=41, name="ci", scopes=scopes)
    token.member_role = role  # what authenticate_token annotates; no query needed
    return token


def call(view: type[APIView], method: str, *, user: User | None = None, token: ApiToken | None = None) -> Response:
    request = APIRequestFactory().generic(method, "/probe", content_type="application/json")
    if user is not None:
        force_authenticate(request, user=user, token=token)
    return view.as_view()(request)


NEEDED = {"GET": "read", "POST": "submit", "DELETE": "submit"}


@pytest.mark.parametrize(
    ("role", "token_scopes", "method"), list(itertools.product(ROLES, TOKEN_SCOPE_SETS, ("GET", "POST", "DELETE")))
)
def test_a_token_passes_when_both_it_and_its_role_hold_the_scope(role, token_scopes, method):
    response = call(Probe, method, user=_user(), token=_token(role, list(token_scopes)))
    scope = NEEDED[method]
    allowed = scope in GRANTS[role] and scope in token_scopes
    assert response.status_code == (200 if allowed else 403)
    if not allowed:
        message = response.data["error"]["message"]
        assert f"'{scope}' scope" in message
        if scope in GRANTS[role]:
            assert message == f"this token lacks the '{scope}' scope; issue one with it"
        else:
            assert f"role '{role}'" in message


@pytest.mark.parametrize(("role", "method"), list(itertools.product(ROLES, ("GET", "POST", "DELETE"))))
def test_a_portal_session_has_its_roles_scopes(monkeypatch, role, method):
    member = MemberRef(tenant=TenantRef(id=7, slug="acme", name="Acme"), role=role)
    monkeypatch.setattr(permissions.services, "membership_for_user", lambda user: member)
    response = call(Probe, method, user=_user())
    assert response.status_code == (200 if NEEDED[method] in GRANTS[role] else 403)


@pytest.mark.parametrize(("role", "method"), list(itertools.product(ROLES, ("GET", "POST"))))
def test_manage_routes_need_manage_for_reading_too(role, method):
    response = call(ManageProbe, method, user=_user(), token=_token(role, list(SCOPES)))
    assert response.status_code == (200 if "manage" in GRANTS[role] else 403)


def test_a_user_in_no_tenant_is_told_so(monkeypatch):
    monkeypatch.setattr(permissions.services, "membership_for_user", lambda user: None)
    response = call(Probe, "GET", user=_user())
    assert response.status_code == 403
    assert "belongs to no tenant" in response.data["error"]["message"]


@pytest.mark.parametrize("view", [Probe, ManageProbe, OperatorProbe])
@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
def test_anonymous_requests_get_401_with_a_bearer_challenge(view, method):
    response = call(view, method)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    assert response.data["error"]["code"] == "not_authenticated"


@pytest.mark.parametrize(
    ("staff", "active", "with_token", "expected"),
    [
        (True, True, False, 200),
        (True, False, False, 403),
        (False, True, False, 403),
        (True, True, True, 403),  # a tenant token never acts as an operator, even a staff user's
        (False, True, True, 403),
    ],
)
def test_operator_routes_take_an_active_staff_session(staff, active, with_token, expected):
    token = _token("owner", list(SCOPES)) if with_token else None
    for method in ("GET", "POST", "DELETE"):
        response = call(OperatorProbe, method, user=_user(staff=staff, active=active), token=token)
        assert response.status_code == expected, method
    if expected == 403:
        assert response.data["error"]["code"] == "permission_denied"


# --- tenant-scoped managers -----------------------------------------------------------------


def test_a_scoped_manager_finds_nothing_until_given_a_tenant():
    # An empty queryset by construction: evaluating it needs no database (none is open here).
    assert list(Quota.scoped.all()) == []
    assert list(Quota.scoped.filter(resource="nau")) == []
    assert not Quota.scoped.exists()
    where = str(Quota.scoped.for_tenant(3).filter(resource="nau").query)
    assert '"tenant_id" = 3' in where and '"resource" = nau' in where
    assert Quota._default_manager.name == "objects"


@pytest.mark.parametrize("bad", [None, "3", 3.0, True])
def test_for_tenant_takes_an_int_id(bad):
    with pytest.raises(TypeError, match="tenant id"):
        Quota.scoped.for_tenant(bad)


@isolate_apps("tenants")
def test_a_scoped_manager_as_the_default_fails_the_system_check():
    class Careless(models.Model):
        tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE)
        scoped = TenantScopedManager()

        class Meta:
            app_label = "tenants"

        def __str__(self) -> str:
            return "careless"

    class NoTenant(models.Model):
        objects = models.Manager()
        scoped = TenantScopedManager()

        class Meta:
            app_label = "tenants"

        def __str__(self) -> str:
            return "no tenant"

    def ours(model: type[models.Model]) -> list[str]:
        return [e.id for e in model.check() if e.id.startswith("tenants.")]

    assert ours(Careless) == ["tenants.E001"]
    assert ours(NoTenant) == ["tenants.E002"]
