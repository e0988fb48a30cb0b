"""Price books, for operators: ``/api/v1/operator/price-books`` (list, create), ``.../{id}/prices``
(schedule a price from a later day) and ``/api/v1/operator/tenants/{id}/price-book`` (which book
bills a tenant). Each validates its body, calls one service and answers with the book as it stands."""

from __future__ import annotations

from datetime import date
from decimal import Decimal, InvalidOperation
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from billing import services
from billing.api.views import BadParameter, OperatorView, json_body
from billing.contracts import PriceBookView
from tenants import services as tenants


def price_book_json(book: PriceBookView) -> dict[str, Any]:
    return {
        "id": book.id,
        "name": book.name,
        "currency": book.currency,
        "is_default": book.is_default,
        "description": book.description,
        "prices": [
            {
                "resource": p.resource,
                "per_hour": str(p.per_hour.normalize()),
                "effective_from": p.effective_from.isoformat(),
            }
            for p in book.prices
        ],
        "tenants": list(book.tenants),
        "next_tenants": list(book.next_tenants),
        "next_from": book.next_from.isoformat() if book.next_from else None,
    }


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise BadParameter(field, f"must be text, got {value!r}")
    return value.strip()


def _whole(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadParameter(field, f"must be a price book's id (a whole number), got {value!r}")
    return value


BOOK = OpenApiResponse(OpenApiTypes.OBJECT, description="The price book: its prices (the whole schedule) and tenants.")


class PriceBookListView(OperatorView):
    @extend_schema(summary="Every price book, the default first", responses={200: OpenApiResponse(OpenApiTypes.OBJECT)})
    def get(self, request: Request) -> Response:
        return Response({"price_books": [price_book_json(b) for b in services.list_price_books()]})

    @extend_schema(summary="A new price book, empty or a copy of another's prices", responses={201: BOOK})
    def post(self, request: Request) -> Response:
        body = json_body(request.data, allowed=("name", "currency", "description", "copy_from"), required=("name",))
        book = services.create_price_book(
            name=_text(body["name"], "name"),
            currency=_text(body.get("currency", "USD"), "currency"),
            description=_text(body.get("description", ""), "description"),
            copy_from=_whole(body["copy_from"], "copy_from") if body.get("copy_from") is not None else None,
        )
        return Response(price_book_json(book), status=status.HTTP_201_CREATED)


class PriceScheduleView(OperatorView):
    @extend_schema(
        summary="Set a resource's price per hour from a later day on (usage already recorded keeps its price)",
        responses={200: BOOK},
    )
    def post(self, request: Request, book_id: int) -> Response:
        body = json_body(
            request.data,
            allowed=("resource", "per_hour", "effective_from"),
            required=("resource", "per_hour", "effective_from"),
        )
        raw = body["per_hour"]
        if isinstance(raw, bool) or not isinstance(raw, int | str):
            raise BadParameter("per_hour", f'write it as a decimal string like "2.50" (exact), got {raw!r}')
        try:
            per_hour = Decimal(str(raw).strip())
        except InvalidOperation:
            raise BadParameter("per_hour", f'must be an amount like "2.50", got {raw!r}') from None
        try:
            effective_from = date.fromisoformat(_text(body["effective_from"], "effective_from"))
        except ValueError:
            raise BadParameter("effective_from", f"a day as YYYY-MM-DD, got {body['effective_from']!r}") from None
        book = services.schedule_price(
            book_id=book_id,
            resource=_text(body["resource"], "resource"),
            per_hour=per_hour,
            effective_from=effective_from,
        )
        return Response(price_book_json(book))


class TenantPriceBookView(OperatorView):
    @extend_schema(
        summary="Which price book bills the tenant (null: the default one), from the next billing period on",
        responses={200: BOOK},
    )
    def put(self, request: Request, tenant_id: int) -> Response:
        body = json_body(request.data, allowed=("price_book",), required=("price_book",))
        tenants.get_tenant(tenant_id)  # 404 for a tenant that does not exist
        book_id = _whole(body["price_book"], "price_book") if body["price_book"] is not None else None
        return Response(price_book_json(services.assign_price_book(tenant_id=tenant_id, book_id=book_id)))
