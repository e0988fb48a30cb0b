"""One error shape for the whole API: {"error": {"code", "message", "field"?, "errors"?}}.

``errors`` lists every problem of a job spec at once (``[{"field", "message"}]``); ``field`` and
``message`` are the first of them, so a client that reads one problem reads the first.

Views do not catch the services' refusals: a ``controlplane.domain.DomainError`` (or a subclass an app
keeps under its own name) reaches ``exception_handler``, which answers it here, once, with the status of
its kind (see ``controlplane.domain``). Two pure modules cannot import the control plane, so their errors
are mapped here by name: ``runtime.jobspec.SpecError`` (400 ``invalid_spec``, its field) and
``billing.rating.RatingError`` (409 ``unpriced``: usage of a flavor without a price; nothing in the request
is at fault). DRF's own exceptions keep DRF's status, in the same shape.
"""

from __future__ import annotations

from typing import Any, Final

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from billing.services import RatingError  # billing.rating's, through the facade (make lint)
from controlplane.domain import Conflict, DomainError, Forbidden, Invalid, NotFound
from runtime.jobspec import SpecError, SpecErrors

# The most specific kind in an error's class hierarchy decides its status.
DOMAIN_STATUS: Final[dict[type[DomainError], int]] = {
    Invalid: status.HTTP_400_BAD_REQUEST,
    Forbidden: status.HTTP_403_FORBIDDEN,
    NotFound: status.HTTP_404_NOT_FOUND,
    Conflict: status.HTTP_409_CONFLICT,
    DomainError: status.HTTP_400_BAD_REQUEST,
}


def error_response(
    status: int, code: str, message: str, field: str | None = None, errors: list[dict[str, str]] | None = None
) -> Response:
    body: dict[str, Any] = {"code": code, "message": message}
    if field is not None:
        body["field"] = field
    if errors is not None:
        body["errors"] = errors  # every problem, the first of which is the one above
    return Response({"error": body}, status=status)


def domain_status(exc: DomainError) -> int:
    return next(DOMAIN_STATUS[kind] for kind in type(exc).__mro__ if kind in DOMAIN_STATUS)


def domain_response(exc: DomainError) -> Response:
    """A service's refusal as the API answers it; a field is named only when the error has one."""
    return error_response(domain_status(exc), exc.code, exc.message, field=exc.field or None)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DomainError):
        set_rollback()
        return domain_response(exc)
    if isinstance(exc, SpecError):  # runtime knows nothing of the control plane: its refusal is mapped here
        set_rollback()
        problems = exc.errors if isinstance(exc, SpecErrors) else (exc,)
        return error_response(
            status.HTTP_400_BAD_REQUEST,
            "invalid_spec",
            exc.message,
            field=exc.field,
            errors=[{"field": problem.field, "message": problem.message} for problem in problems],
        )
    if isinstance(exc, RatingError):  # billing.rating is plain Python
        set_rollback()
        return error_response(status.HTTP_409_CONFLICT, "unpriced", str(exc))
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    detail = response.data.get("detail", response.data) if isinstance(response.data, dict) else response.data
    code = getattr(exc, "default_code", "error")
    body: dict[str, Any] = {"code": code, "message": str(detail)}
    if isinstance(field := getattr(exc, "field", None), str):
        body["field"] = field  # an APIException that knows which field is wrong says so
    response.data = {"error": body}
    return response
