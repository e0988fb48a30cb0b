"""REST endpoints of the billing app: a tenant's usage and invoices, as JSON or CSV; invoice runs for operators.

Each handler checks its parameters, calls ``billing.services``, and writes the answer. A parameter it
cannot use is a ``BadParameter`` ("field: message", like DRF's own). Handlers catch nothing else: the
services' refusals (``BillingInvalid`` 400, ``InvoiceNotFound`` 404, ``BillingConflict`` 409,
``RatingError`` 409 ``unpriced``) reach ``controlplane.errors``, which answers them in the project's
error shape naming the field to fix. The budget endpoint is ``billing.api.budget``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from datetime import date
from itertools import islice
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import StreamingHttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.exceptions import APIException, NotFound
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing import services
from billing.api import serializers as out
from billing.models import Invoice
from controlplane import paging
from controlplane.parsers import StrictJSONParser
from tenants.permissions import IsOperator, RequireScope, request_tenant_id

FORMATS = ("json", "csv")
PAGE_DEFAULT = 1000
PAGE_MAX = 10_000


class BadParameter(APIException):
    """A query or body value that cannot be used, naming it (the error shape carries ``field``)."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "invalid"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class JsonAnswers(DefaultContentNegotiation):
    """Every rendered answer is JSON, errors included: ``?format=`` picks the export format in the
    view (a CSV export is a streamed body of its own), not one of DRF's renderers."""

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        renderer = next(iter(renderers))
        return renderer, renderer.media_type


class _BillingView(APIView):
    content_negotiation_class = JsonAnswers
    parser_classes = [StrictJSONParser]


def export_format(request: Request) -> str:
    """``?format=json|csv``; without it, CSV when the client accepts only ``text/csv``, else JSON."""
    wanted = request.query_params.get("format")
    if wanted is None:
        accept = request.headers.get("Accept", "")
        return "csv" if "text/csv" in accept and "json" not in accept else "json"
    if wanted not in FORMATS:
        raise BadParameter("format", f"must be json or csv, got {wanted!r}")
    return wanted


def _period_param(request: Request) -> date | None:
    text = request.query_params.get("period")
    if text is None or text == "":
        return None
    return _period(text)


def _period(text: Any) -> date:
    if not isinstance(text, str):
        raise BadParameter("period", f"write it as YYYY-MM, e.g. 2026-11; got {text!r}")
    try:
        return services.parse_period(text.strip())
    except services.BillingInvalid as exc:  # answered as every query parameter is: "period: ..."
        raise BadParameter(exc.field or "period", str(exc)) from None


ROWS_PER_CHUNK = 500


def _for_asgi(lines: Iterator[str]) -> AsyncIterator[str]:
    """The CSV as an async iterator: served over ASGI, Django would otherwise read a sync iterator
    whole into memory before sending a byte. Each chunk is read with ``thread_sensitive``, on the
    thread that ran the view, where the ledger's database cursor lives."""
    take = sync_to_async(lambda: "".join(islice(lines, ROWS_PER_CHUNK)), thread_sensitive=True)

    async def chunks() -> AsyncIterator[str]:
        while chunk := await take():
            yield chunk

    return chunks()


def csv_response(
    request: Request, filename: str, header: Sequence[str], rows: Iterable[Sequence[Any]]
) -> StreamingHttpResponse:
    """A CSV streamed as it is read: a tenant's year of usage never sits whole in memory."""
    lines = out.csv_rows(header, rows)
    body = _for_asgi(lines) if isinstance(request._request, ASGIRequest) else lines
    response = StreamingHttpResponse(body, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


# --- usage -----------------------------------------------------------------------------------------


class UsageView(_BillingView):
    """The tenant's ledger entries: one per usage record and billing period.

    JSON comes in cursor pages in the order entries were posted (``?limit=``, 1,000 unless asked, at
    most 10,000; ``?cursor=`` from ``next_cursor``), so that usage posted while a client pages through
    lands on a later page instead of shifting the ones it reads; CSV streams every entry of the period,
    or of all periods without one, oldest usage first."""

    permission_classes = [RequireScope]

    @extend_schema(parameters=paging.page_parameters(PAGE_MAX, PAGE_DEFAULT))
    def get(self, request: Request) -> Any:
        tenant_id = request_tenant_id(request)
        fmt = export_format(request)
        period = _period_param(request)
        if fmt == "csv":
            name = f"usage-{period:%Y-%m}.csv" if period else "usage.csv"
            entries = services.ledger_entries(tenant_id=tenant_id, period=period)
            return csv_response(request, name, out.USAGE_COLUMNS, out.usage_rows(entries))
        page = paging.page_request(request.query_params, default=PAGE_DEFAULT, maximum=PAGE_MAX)
        rows = services.ledger_page(tenant_id=tenant_id, period=period, after=page.after, limit=page.limit + 1)
        extra = {
            "period": f"{period:%Y-%m}" if period else None,
            "count": services.ledger_entry_count(tenant_id=tenant_id, period=period),
        }
        return paging.page_response(
            request, "entries", rows, page, row_id=lambda e: e.id, render=out.entry_json, extra=extra
        )


# --- invoices --------------------------------------------------------------------------------------


class InvoiceListView(_BillingView):
    """The tenant's invoices, newest first: JSON in cursor pages, CSV all of them."""

    permission_classes = [RequireScope]

    @extend_schema(parameters=paging.PAGE_PARAMETERS)
    def get(self, request: Request) -> Any:
        tenant_id = request_tenant_id(request)
        fmt = export_format(request)
        if fmt == "csv":
            invoices = services.list_invoices(tenant_id)
            return csv_response(request, "invoices.csv", out.INVOICE_COLUMNS, out.invoice_rows(invoices))
        page = paging.page_request(request.query_params)
        rows = services.list_invoices(tenant_id, after=page.after, limit=page.limit + 1)
        extra = {"count": services.invoice_count(tenant_id)}
        return paging.page_response(
            request, "invoices", rows, page, row_id=lambda i: i.id, render=out.invoice_json, extra=extra
        )


class InvoiceDetailView(_BillingView):
    permission_classes = [RequireScope]

    def get(self, request: Request, invoice_id: int) -> Any:
        tenant_id = request_tenant_id(request)
        fmt = export_format(request)
        # Another tenant's invoice answers exactly like a missing one (404), so ids cannot be probed.
        invoice = services.get_invoice(tenant_id=tenant_id, invoice_id=invoice_id)
        if fmt == "csv":
            return csv_response(request, f"{invoice.number}.csv", out.LINE_COLUMNS, out.line_rows(invoice))
        return Response(out.invoice_detail_json(invoice))


# --- operators -------------------------------------------------------------------------------------


def json_body(data: Any, *, allowed: Sequence[str], required: Sequence[str] = ()) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise BadParameter("body", f"must be a JSON object, got {type(data).__name__}")
    for key in data:
        if key not in allowed:
            raise BadParameter(str(key), f"unknown field; the fields are {', '.join(allowed)}")
    for key in required:
        if key not in data:
            raise BadParameter(key, "is required")
    return data


class OperatorView(_BillingView):
    permission_classes = [IsOperator]


class InvoiceRunView(OperatorView):
    """Draft (or, with ``finalize``, bill) a period's invoice for every tenant with something to bill."""

    def post(self, request: Request) -> Response:
        body = json_body(request.data, allowed=("period", "finalize"), required=("period",))
        period = _period(body["period"])
        finalize = body.get("finalize", False)
        if not isinstance(finalize, bool):
            raise BadParameter("finalize", f"must be true or false, got {finalize!r}")
        invoices = services.run_invoices(period, finalize=finalize)
        return Response(
            {
                "period": f"{period:%Y-%m}",
                "finalize": finalize,
                "count": len(invoices),
                "invoices": [out.invoice_summary_json(i) for i in invoices],
            }
        )


class InvoiceFinalizeView(OperatorView):
    """Bill one invoice's period for its tenant; an invoice already finalized is answered as it is."""

    def post(self, request: Request, invoice_id: int) -> Response:
        json_body(request.data if request.data else {}, allowed=())
        found = Invoice.objects.filter(pk=invoice_id).values_list("tenant_id", "period").first()
        if found is None:
            raise NotFound(f"no invoice {invoice_id}")
        tenant_id, period = found
        return Response(out.invoice_detail_json(services.finalize_invoice(tenant_id, period)))
