"""One error shape for the whole API: {"error": {"code", "message", "field"?}}."""

from __future__ import annotations

from typing import Any

from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


def error_response(status: int, code: str, message: str, field: str | None = None) -> Response:
    body: dict[str, Any] = {"code": code, "message": message}
    if field is not None:
        body["field"] = field
    return Response({"error": body}, status=status)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
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
