"""Price books through the operator API, on PostgreSQL: listed with their schedules, made as a copy of
another, a price scheduled only from a later day (usage already recorded keeps its price), a tenant
given its own book and back the default; every refusal names its field and changes nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from billing import rating
from billing import services as billing
from billing.models import Price

pytestmark = pytest.mark.integration


@pytest.fixture
def operator(db) -> APIClient:
    user = get_user_model().objects.create_user("books-operator", password="pw-operator-1", is_staff=True)
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_an_operator_makes_a_book_schedules_a_price_and_gives_it_to_a_tenant(operator, tenants):
    acme = tenants[0]
    books = operator.get("/api/v1/operator/price-books").json()["price_books"]
    standard = books[0]
    assert standard["is_default"] and standard["name"] == "standard"
    assert {"resource": "ascend-910b", "per_hour": "1.65", "effective_from": "2026-01-01"} in standard["prices"]

    made = operator.post(
        "/api/v1/operator/price-books",
        {"name": "research", "currency": "USD", "copy_from": standard["id"]},
        format="json",
    )
    assert made.status_code == 201, made.content
    research = made.json()
    assert research["prices"] == standard["prices"] and not research["is_default"]

    today = timezone.now().date()
    prices = Price.objects.count()
    for body, field in (
        ({"resource": "ascend-910b", "per_hour": "1.20", "effective_from": today.isoformat()}, "effective_from"),
        ({"resource": "ascend-910b", "per_hour": "-1", "effective_from": "2099-01-01"}, "per_hour"),
        ({"resource": "ascend-910b", "per_hour": "cheap", "effective_from": "2099-01-01"}, "per_hour"),
        ({"resource": "ascend-910b", "per_hour": 1.2, "effective_from": "2099-01-01"}, "per_hour"),
        ({"resource": "Ascend 910B", "per_hour": "1.20", "effective_from": "2099-01-01"}, "resource"),
        ({"resource": "ascend-910b", "per_hour": "1.20", "effective_from": "next week"}, "effective_from"),
        ({"resource": "ascend-910b", "per_hour": "1.20"}, "effective_from"),
    ):
        refused = operator.post(f"/api/v1/operator/price-books/{research['id']}/prices", body, format="json")
        assert refused.status_code == 400 and refused.json()["error"]["field"] == field, (body, refused.content)
    assert Price.objects.count() == prices  # nothing changed

    tomorrow = today + timedelta(days=1)
    body = {"resource": "ascend-910b", "per_hour": "1.20", "effective_from": tomorrow.isoformat()}
    scheduled = operator.post(f"/api/v1/operator/price-books/{research['id']}/prices", body, format="json").json()
    assert {"resource": "ascend-910b", "per_hour": "1.2", "effective_from": tomorrow.isoformat()} in scheduled["prices"]

    # A tenant's new book bills from the next period on: this month's usage keeps its prices.
    url = f"/api/v1/operator/tenants/{acme.id}/price-book"
    given = operator.put(url, {"price_book": research["id"]}, format="json")
    following = rating.next_period(billing.current_period())
    assert given.status_code == 200, given.content
    assert (given.json()["tenants"], given.json()["next_tenants"]) == ([], ["acme"])
    assert given.json()["next_from"] == following.isoformat()
    assert billing.price_book_for(acme.id).name == "standard"
    assert billing.price_book_for(acme.id, following).name == "research"
    # A book that prices no NAU-hour would leave flavors unpriced; a book that does not exist is none.
    empty = operator.post("/api/v1/operator/price-books", {"name": "empty"}, format="json").json()
    refused = operator.put(url, {"price_book": empty["id"]}, format="json")
    assert refused.status_code == 400 and refused.json()["error"]["field"] == "price_book"
    assert "no nau price" in refused.json()["error"]["message"]
    assert operator.put(url, {"price_book": 999999}, format="json").json()["error"]["field"] == "price_book"
    assert billing.price_book_for(acme.id, following).name == "research"  # the refusals changed nothing
    back = operator.put(url, {"price_book": None}, format="json")
    assert back.json()["name"] == "standard" and billing.price_book_for(acme.id, following).name == "standard"

    again = operator.post("/api/v1/operator/price-books", {"name": "research"}, format="json")
    assert again.status_code == 400 and again.json()["error"]["field"] == "name"
    bad = operator.post("/api/v1/operator/price-books", {"name": "eu", "currency": "euro"}, format="json")
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "currency"
