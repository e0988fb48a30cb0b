"""REST endpoints of the tenants app: tokens for tenants, cohorts, tenants and quotas for operators.

Each handler checks the body (``parsing``), calls one service, and writes its answer; refusals
come back in the project's error shape with the field to fix.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar

from django.utils import timezone
from rest_framework import status
from rest_framework.exceptions import NotFound
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.errors import error_response
from tenants import services
from tenants.api import parsing
from tenants.contracts import CohortView, QuotaView, TenantView, TokenView
from tenants.models import ApiToken
from tenants.permissions import MANAGE, IsOperator, request_access, scope_required
from tenants.quota_rules import amount_text

T = TypeVar("T")


def _time(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _amount(value: Decimal | None) -> str | None:
    return amount_text(value) if value is not None else None


def token_json(token: TokenView) -> dict[str, Any]:
    return {
        "id": token.id,
        "name": token.name,
        "prefix": token.prefix,
        "scopes": list(token.scopes),
        "user": token.user,
        "created_at": _time(token.created_at),
        "expires_at": _time(token.expires_at),
        "revoked_at": _time(token.revoked_at),
        "last_used_at": _time(token.last_used_at),
    }


def quota_json(quota: QuotaView) -> dict[str, Any]:
    return {
        "resource": quota.resource,
        "nominal": _amount(quota.nominal),
        "borrowing_limit": _amount(quota.borrowing_limit),
        "lending_limit": _amount(quota.lending_limit),
        "updated_at": _time(quota.updated_at),
    }


def cohort_json(cohort: CohortView) -> dict[str, Any]:
    return {
        "id": cohort.id,
        "name": cohort.name,
        "description": cohort.description,
        "tenants": list(cohort.tenants),
        "created_at": _time(cohort.created_at),
    }


def tenant_json(tenant: TenantView) -> dict[str, Any]:
    return {
        "id": tenant.id,
        "slug": tenant.slug,
        "name": tenant.name,
        "cohort": tenant.cohort,
        "cohort_id": tenant.cohort_id,
        "fair_share_weight": _amount(tenant.fair_share_weight),
        "quotas": [quota_json(q) for q in tenant.quotas],
        "created_at": _time(tenant.created_at),
    }


def _refusal(exc: services.Refused) -> Response:
    code = status.HTTP_409_CONFLICT if isinstance(exc, services.Conflict) else status.HTTP_400_BAD_REQUEST
    return error_response(code, exc.code, exc.message, field=exc.field)


def _call(fn: Callable[[], T], ok: Callable[[T], Response]) -> Response:
    """Run one service call: refusals become 400/409 with their field, NotFound a 404."""
    try:
        result = fn()
    except services.Refused as exc:
        return _refusal(exc)
    except services.NotFound as exc:
        raise NotFound(str(exc)) from None
    return ok(result)


class _JsonView(APIView):
    parser_classes = [JSONParser]


# --- tokens (a tenant's own; scope manage) -----------------------------------------------------


class TokenListView(_JsonView):
    permission_classes = [scope_required(MANAGE, read=MANAGE)]

    def get(self, request: Request) -> Response:
        tenant_id = _tenant_id(request)
        return Response({"tokens": [token_json(t) for t in services.list_tokens(tenant_id=tenant_id)]})

    def post(self, request: Request) -> Response:
        access = request_access(request)
        tenant_id = _tenant_id(request)
        try:
            wanted = parsing.token_request(request.data, now=timezone.now())
        except services.InvalidInput as exc:
            return _refusal(exc)
        assert request.user is not None  # RequireScope let it through: it is signed in
        user_id = request.user.pk
        assert user_id is not None
        return _call(
            lambda: services.create_token(
                tenant_id=tenant_id,
                user_id=user_id,
                name=wanted.name,
                scopes=wanted.scopes,
                expires_at=wanted.expires_at,
                within=access.scopes if access.via_token else None,
                parent_expires_at=request.auth.expires_at if isinstance(request.auth, ApiToken) else None,
            ),
            lambda new: Response(
                {**token_json(new.token), "secret": new.secret},
                status=status.HTTP_201_CREATED,
                headers={"Location": "/api/v1/tokens"},
            ),
        )


class TokenRevokeView(_JsonView):
    permission_classes = [scope_required(MANAGE, read=MANAGE)]

    def post(self, request: Request, token_id: int) -> Response:
        tenant_id = _tenant_id(request)
        return _call(
            lambda: services.revoke_token(tenant_id=tenant_id, token_id=token_id),
            lambda token: Response(token_json(token)),
        )


def _tenant_id(request: Request) -> int:
    tenant_id = request_access(request).tenant_id
    assert tenant_id is not None  # RequireScope let the request through, so it has a tenant
    return tenant_id


# --- operators ---------------------------------------------------------------------------------


class _OperatorView(_JsonView):
    permission_classes = [IsOperator]


class CohortListView(_OperatorView):
    def get(self, request: Request) -> Response:
        return Response({"cohorts": [cohort_json(c) for c in services.list_cohorts()]})

    def post(self, request: Request) -> Response:
        try:
            fields = parsing.cohort(request.data, partial=False)
        except services.InvalidInput as exc:
            return _refusal(exc)
        return _call(
            lambda: services.create_cohort(**fields),
            lambda c: Response(
                cohort_json(c), status=status.HTTP_201_CREATED, headers={"Location": f"/api/v1/operator/cohorts/{c.id}"}
            ),
        )


class CohortDetailView(_OperatorView):
    def get(self, request: Request, cohort_id: int) -> Response:
        return _call(lambda: services.get_cohort(cohort_id), lambda c: Response(cohort_json(c)))

    def patch(self, request: Request, cohort_id: int) -> Response:
        try:
            fields = parsing.cohort(request.data, partial=True)
        except services.InvalidInput as exc:
            return _refusal(exc)
        return _call(lambda: services.update_cohort(cohort_id, **fields), lambda c: Response(cohort_json(c)))

    def delete(self, request: Request, cohort_id: int) -> Response:
        return _call(lambda: services.delete_cohort(cohort_id), lambda _: Response(status=status.HTTP_204_NO_CONTENT))


class TenantListView(_OperatorView):
    def get(self, request: Request) -> Response:
        return Response({"tenants": [tenant_json(t) for t in services.list_tenants()]})

    def post(self, request: Request) -> Response:
        try:
            fields = parsing.tenant(request.data, partial=False)
        except services.InvalidInput as exc:
            return _refusal(exc)
        return _call(
            lambda: services.create_tenant(**fields),
            lambda t: Response(
                tenant_json(t), status=status.HTTP_201_CREATED, headers={"Location": f"/api/v1/operator/tenants/{t.id}"}
            ),
        )


class TenantDetailView(_OperatorView):
    def get(self, request: Request, tenant_id: int) -> Response:
        return _call(lambda: services.get_tenant(tenant_id), lambda t: Response(tenant_json(t)))

    def patch(self, request: Request, tenant_id: int) -> Response:
        try:
            fields = parsing.tenant(request.data, partial=True)
        except services.InvalidInput as exc:
            return _refusal(exc)
        return _call(lambda: services.update_tenant(tenant_id, **fields), lambda t: Response(tenant_json(t)))


class TenantQuotasView(_OperatorView):
    def get(self, request: Request, tenant_id: int) -> Response:
        return _call(
            lambda: services.list_quotas(tenant_id), lambda qs: Response({"quotas": [quota_json(q) for q in qs]})
        )

    def put(self, request: Request, tenant_id: int) -> Response:
        try:
            specs = parsing.quota_set(request.data)
        except services.InvalidInput as exc:
            return _refusal(exc)
        return _call(
            lambda: services.set_quotas(tenant_id, specs), lambda qs: Response({"quotas": [quota_json(q) for q in qs]})
        )


class TenantQuotaView(_OperatorView):
    def put(self, request: Request, tenant_id: int, resource: str) -> Response:
        try:
            spec = parsing.quota(request.data, resource=resource)
        except services.InvalidInput as exc:
            return _refusal(exc)
        return _call(lambda: services.set_quota(tenant_id, spec), lambda q: Response(quota_json(q)))

    def delete(self, request: Request, tenant_id: int, resource: str) -> Response:
        return _call(
            lambda: services.delete_quota(tenant_id, resource), lambda _: Response(status=status.HTTP_204_NO_CONTENT)
        )
