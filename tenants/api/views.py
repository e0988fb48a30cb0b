"""REST endpoints of the tenants app: tokens for tenants, cohorts, tenants and quotas for operators.

Each handler checks the body (``parsing``), calls one service, and writes its answer. Handlers catch
nothing: a refusal (``InvalidInput`` 400, ``Conflict`` 409, ``NotFound`` 404) reaches
``controlplane.errors``, which answers it in the project's error shape with the field to fix.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import NotAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane import paging
from controlplane.parsers import StrictJSONParser
from tenants import services
from tenants.api import parsing
from tenants.contracts import CohortView, QuotaView, TenantView, TokenView
from tenants.models import ApiToken
from tenants.permissions import MANAGE, IsOperator, RequireScope, request_access, request_tenant_id, scope_required
from tenants.quota_rules import amount_text


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
        "max_queued_jobs": tenant.max_queued_jobs,
        "quotas": [quota_json(q) for q in tenant.quotas],
        "created_at": _time(tenant.created_at),
    }


class _JsonView(APIView):
    parser_classes = [StrictJSONParser]


# --- who am I ---------------------------------------------------------------------------------


class MeView(_JsonView):
    """Whom the request acts as: the tenant, the user and role, and the token (what ``polychip whoami``
    and ``login`` show, and how a pipeline checks its secret before it submits)."""

    permission_classes = [RequireScope]

    @extend_schema(summary="Whom this token or session acts as")
    def get(self, request: Request) -> Response:
        access = request_access(request)
        tenant = services.get_tenant(request_tenant_id(request))
        token = request.auth if isinstance(request.auth, ApiToken) else None
        return Response(
            {
                "tenant": {"id": tenant.id, "slug": tenant.slug, "name": tenant.name},
                "user": request.user.get_username() if request.user is not None else None,
                "role": access.role,
                "scopes": sorted(access.scopes),
                "token": None
                if token is None
                else {"name": token.name, "prefix": token.prefix, "expires_at": _time(token.expires_at)},
            }
        )


# --- tokens (a tenant's own; scope manage) -----------------------------------------------------


class TokenListView(_JsonView):
    permission_classes = [scope_required(MANAGE, read=MANAGE)]

    @extend_schema(summary="The tenant's tokens, newest first, a page at a time", parameters=paging.PAGE_PARAMETERS)
    def get(self, request: Request) -> Response:
        page = paging.page_request(request.query_params)
        tokens = services.list_tokens(tenant_id=request_tenant_id(request), after=page.after, limit=page.limit + 1)
        return paging.page_response(request, "tokens", tokens, page, row_id=lambda t: t.id, render=token_json)

    @extend_schema(
        summary="Issue an API token",
        responses={201: OpenApiResponse(OpenApiTypes.OBJECT, description="The token, with its secret.")},
        description="The secret is in this answer only. A token issued with a token holds at most that token's "
        "scopes and expires no later than it.",
        request={
            "application/json": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name"],
                "properties": {
                    "name": {"type": "string", "minLength": 1, "maxLength": parsing.MAX_TOKEN_NAME},
                    "scopes": {"type": "array", "items": {"type": "string", "enum": ["read", "submit", "manage"]}},
                    "expires_at": {"type": "string", "format": "date-time"},
                    "expires_in_days": {"type": "integer", "minimum": 1, "maximum": parsing.MAX_TOKEN_DAYS},
                },
            }
        },
    )
    def post(self, request: Request) -> Response:
        access = request_access(request)
        tenant_id = request_tenant_id(request)
        wanted = parsing.token_request(request.data, now=timezone.now())
        user_id = request.user.pk if request.user is not None else None
        if user_id is None:  # not reached: RequireScope let the request through, so it is signed in
            raise NotAuthenticated("send 'Authorization: Bearer <token>' or sign in to the portal")
        new = services.create_token(
            tenant_id=tenant_id,
            user_id=user_id,
            name=wanted.name,
            scopes=wanted.scopes,
            expires_at=wanted.expires_at,
            within=access.scopes if access.via_token else None,
            parent_expires_at=request.auth.expires_at if isinstance(request.auth, ApiToken) else None,
        )
        return Response(
            {**token_json(new.token), "secret": new.secret},
            status=status.HTTP_201_CREATED,
            headers={"Location": "/api/v1/tokens"},
        )


class TokenRevokeView(_JsonView):
    permission_classes = [scope_required(MANAGE, read=MANAGE)]

    def post(self, request: Request, token_id: int) -> Response:
        token = services.revoke_token(tenant_id=request_tenant_id(request), token_id=token_id)
        return Response(token_json(token))


# --- operators ---------------------------------------------------------------------------------


class _OperatorView(_JsonView):
    permission_classes = [IsOperator]


class CohortListView(_OperatorView):
    def get(self, request: Request) -> Response:
        return Response({"cohorts": [cohort_json(c) for c in services.list_cohorts()]})

    @extend_schema(responses={201: OpenApiResponse(OpenApiTypes.OBJECT, description="The new cohort.")})
    def post(self, request: Request) -> Response:
        c = services.create_cohort(**parsing.cohort(request.data, partial=False))
        return Response(
            cohort_json(c), status=status.HTTP_201_CREATED, headers={"Location": f"/api/v1/operator/cohorts/{c.id}"}
        )


class CohortDetailView(_OperatorView):
    def get(self, request: Request, cohort_id: int) -> Response:
        return Response(cohort_json(services.get_cohort(cohort_id)))

    def patch(self, request: Request, cohort_id: int) -> Response:
        fields = parsing.cohort(request.data, partial=True)
        return Response(cohort_json(services.update_cohort(cohort_id, **fields)))

    def delete(self, request: Request, cohort_id: int) -> Response:
        services.delete_cohort(cohort_id)
        return Response(status=status.HTTP_204_NO_CONTENT)


class TenantListView(_OperatorView):
    def get(self, request: Request) -> Response:
        return Response({"tenants": [tenant_json(t) for t in services.list_tenants()]})

    @extend_schema(responses={201: OpenApiResponse(OpenApiTypes.OBJECT, description="The new tenant.")})
    def post(self, request: Request) -> Response:
        t = services.create_tenant(**parsing.tenant(request.data, partial=False))
        return Response(
            tenant_json(t), status=status.HTTP_201_CREATED, headers={"Location": f"/api/v1/operator/tenants/{t.id}"}
        )


class TenantDetailView(_OperatorView):
    def get(self, request: Request, tenant_id: int) -> Response:
        return Response(tenant_json(services.get_tenant(tenant_id)))

    def patch(self, request: Request, tenant_id: int) -> Response:
        fields = parsing.tenant(request.data, partial=True)
        return Response(tenant_json(services.update_tenant(tenant_id, **fields)))


class TenantQuotasView(_OperatorView):
    def get(self, request: Request, tenant_id: int) -> Response:
        return Response({"quotas": [quota_json(q) for q in services.list_quotas(tenant_id)]})

    def put(self, request: Request, tenant_id: int) -> Response:
        specs = parsing.quota_set(request.data)
        return Response({"quotas": [quota_json(q) for q in services.set_quotas(tenant_id, specs)]})


class TenantQuotaView(_OperatorView):
    def put(self, request: Request, tenant_id: int, resource: str) -> Response:
        spec = parsing.quota(request.data, resource=resource)
        return Response(quota_json(services.set_quota(tenant_id, spec)))

    def delete(self, request: Request, tenant_id: int, resource: str) -> Response:
        services.delete_quota(tenant_id, resource)
        return Response(status=status.HTTP_204_NO_CONTENT)
