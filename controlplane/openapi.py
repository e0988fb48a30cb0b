"""The OpenAPI schema of /api/v1, generated from the views by drf-spectacular.

What every operation shares is said here once rather than on each view: the bearer token, and the error
answers in the project's one shape (``controlplane.errors``). A view describes only its own request,
answer and query parameters (``@extend_schema``).
"""

from __future__ import annotations

from typing import Any, Literal

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from drf_spectacular.plumbing import build_bearer_security_scheme_object
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import AllowAny

ERROR_BODY = inline_serializer(
    name="Error",
    fields={
        "error": inline_serializer(
            name="ErrorDetail",
            fields={
                "code": serializers.CharField(help_text="What kind of refusal, e.g. invalid_spec, not_found."),
                "message": serializers.CharField(help_text="What is wrong and how to fix it."),
                "field": serializers.CharField(required=False, help_text="The field at fault (a dotted path)."),
                "errors": serializers.ListField(
                    child=inline_serializer(
                        name="FieldProblem",
                        fields={"field": serializers.CharField(), "message": serializers.CharField()},
                    ),
                    required=False,
                    help_text="Every problem of a job spec at once; the first is also field and message.",
                ),
            },
        )
    },
)

_ERRORS = {
    400: "The request is invalid: the field and the fix are named.",
    401: "No credentials, or a token that is unknown, expired or revoked.",
    403: "The token lacks the scope this route needs, or the route is for operators.",
    404: "No such object for this tenant (another tenant's objects are not found either).",
    405: "The method is not allowed here; Allow lists the ones that are.",
    409: "The request conflicts with the object's state, or the same Idempotency-Key is still in flight.",
    413: "The body is over the route's size limit.",
    422: "The Idempotency-Key was used before with a different request.",
    429: "Too many requests; retry after Retry-After seconds.",
}


IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    description=(
        "A key of your choosing (a UUID) that makes a retry safe: the same key with the same request within "
        "24 h answers what the first answered (with Idempotency-Replayed: true) and does nothing again; with "
        "another request, 422; while the first still runs, 409. Keys are the token's or user's own."
    ),
    pattern=r"^[ -~]{1,255}$",
)


class AutoSchema(SpectacularAutoSchema):
    """Adds the error answers each operation can give to what its view declares."""

    # Our views are APIViews that answer the contracts' JSON (``*_json`` in each app's contracts.py), not
    # serializers: one without a declaration is described as a JSON object rather than left out.
    def _declares_serializer(self) -> bool:
        return any(hasattr(self.view, name) for name in ("get_serializer", "get_serializer_class", "serializer_class"))

    def get_request_serializer(self) -> Any:
        if self._declares_serializer():
            return super().get_request_serializer()
        return OpenApiTypes.OBJECT if self.method.upper() in ("POST", "PUT", "PATCH") else None

    def get_response_serializers(self) -> Any:
        if self._declares_serializer():
            return super().get_response_serializers()
        return OpenApiTypes.OBJECT

    def _get_response_bodies(self, direction: Literal["request", "response"] = "response") -> dict[str, Any]:
        responses = super()._get_response_bodies(direction)
        for status in self._error_statuses():
            code = str(status)
            if code not in responses:
                responses[code] = self._get_response_for_code(
                    OpenApiResponse(response=ERROR_BODY, description=_ERRORS[status]), code, direction=direction
                )
        return responses

    def get_override_parameters(self) -> list[Any]:
        parameters = list(super().get_override_parameters())
        # The ingest takes a run's own token, not a principal's: no key there (controlplane.idempotency).
        if self.method.upper() in ("POST", "PUT", "PATCH", "DELETE") and "/ingest/" not in self.path:
            parameters.append(IDEMPOTENCY_KEY)
        return parameters

    def get_operation_id(self) -> str:
        """The path's words, each parameter as by_<name>, and the method: unique by construction
        (``jobs_get``, ``jobs_by_job_id_get``, ``jobs_by_job_id_cancel_post``)."""
        words = []
        for part in self.path.removeprefix("/api/v1/").strip("/").split("/"):
            words.append(f"by_{part.strip('{}')}" if part.startswith("{") else part.replace("-", "_"))
        return "_".join([*words, self.method.lower()])

    def _error_statuses(self) -> list[int]:
        method = self.method.upper()
        # Open to anyone: the docs and the spec's schema. The ingest is open to the auth machinery but
        # takes its own token (its POST of telemetry, its GET of a job's bundle), so it can be refused.
        public = (
            method == "GET"
            and "/ingest/" not in self.path
            and any(isinstance(p, AllowAny) for p in self.view.get_permissions())
        )
        statuses = [400, 405, 429]
        if not public:
            statuses += [401, 403]
        if "{" in self.path:
            statuses.append(404)
        if method in ("POST", "PUT", "PATCH", "DELETE"):
            statuses += [409, 413, 422]
        return sorted(statuses)


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """A tenant's API token (``pc_...``) as a bearer token."""

    target_class = "tenants.authentication.ApiTokenAuthentication"
    name = "tenantToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return build_bearer_security_scheme_object(header_name="Authorization", token_prefix="Bearer")  # noqa: S106 (a scheme name, not a secret)
