"""Request checks that come before any view: a query string the database cannot take is a 400."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse

from controlplane import logs
from controlplane.parsers import unfit_text


class RejectUnfitQueryStrings:
    """A NUL in a query parameter (``?flavor=%00``) reached PostgreSQL, which refuses it: a 500. Any
    parameter, name or value, that is not storable text is answered here, naming the parameter."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        for name, values in request.GET.lists():
            for text in (name, *values):
                why = unfit_text(text)
                if why is None:
                    continue
                field = name if unfit_text(name) is None else "query"
                message = f"the query parameter {field!r} {why}; send plain text"
                if request.path.startswith("/api/"):
                    return JsonResponse({"error": {"code": "invalid", "field": field, "message": message}}, status=400)
                return HttpResponseBadRequest(message, content_type="text/plain; charset=utf-8")
        return self.get_response(request)


_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


class RequestContextMiddleware:
    """Binds each request's id (its ``X-Request-ID`` when it is a sane one, else a new one) for its log
    lines, Django's own line for a 4xx or 5xx answer included, and answers it in the same header, so that a
    client's report and the server's lines meet. Each request starts from an empty context."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        given = request.headers.get("X-Request-ID", "")
        request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        logs.clear()
        logs.bind(request_id=request_id)
        response = self.get_response(request)
        response["X-Request-ID"] = request_id
        return response
