"""The portal's billing pages, rendered by Django for a signed-in user."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import transaction
from django.utils import timezone

from billing import rating
from billing import services as billing
from billing.contracts import UsageInterval

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def used(tenant, key: str, flavor: str, start: datetime, hours: int) -> None:
    with transaction.atomic():
        billing.record_usage(
            [
                UsageInterval(
                    key=key,
                    tenant_id=tenant.id,
                    job_id=7,
                    device_id=f"{flavor}-0/0",
                    flavor=flavor,
                    started_at=start,
                    ended_at=start + timedelta(hours=hours),
                )
            ]
        )
    billing.relay_usage()


def this_month_start() -> datetime:
    return rating.from_epoch_ms(rating.period_bounds_ms(rating.period_of(rating.epoch_ms(timezone.now())))[0])


@pytest.fixture
def acme_billed(tenants):
    """acme: October invoiced; this month 2 h on an a100 (4.20) and 1 h on an h100 (4.25)."""
    acme = tenants[0]
    used(acme, "acme:oct", "a100-sxm", datetime(2026, 10, 5, tzinfo=UTC), 3)
    billing.run_invoices(date(2026, 10, 1), finalize=True)
    used(acme, "acme:now-a100", "a100-sxm", this_month_start(), 2)
    used(acme, "acme:now-h100", "h100-sxm", this_month_start(), 1)
    return tenants


def test_the_billing_page_draws_spend_against_budgets_with_flavors_alerts_and_invoices(client, acme_billed):
    acme = acme_billed[0]
    billing.set_budgets(acme.id, soft=Decimal("5.00"), hard=Decimal("20.00"))
    billing.check_budgets_now()  # the beat task: the soft budget is crossed, once
    invoice = billing.list_invoices(acme.id)[0]

    assert client.login(username=acme.username, password=acme.password)
    page = client.get("/billing/").content.decode()
    assert "USD 8.45</strong> spent this month" in page
    # The bar: spend past the soft mark, short of the hard one (scale: 110% of the hard budget).
    bar = re.search(r'<div class="budget-bar (\w[\w-]*)".*?</div>', page, re.S)
    assert bar and bar.group(1) == "over-soft"
    assert 'class="spend" style="width:38.4%"' in bar.group(0)
    assert 'class="mark soft" style="left:22.7%"' in bar.group(0) and "soft 5.00" in bar.group(0)
    assert 'class="mark hard" style="left:90.9%"' in bar.group(0) and "hard 20.00" in bar.group(0)
    assert "Soft budget of USD 5.00 crossed" in page
    # This month by flavor, the larger first.
    flavors = re.findall(r'<tr data-flavor="([\w-]+)">.*?<td class="num">([\d.]+)</td>', page, re.S)
    assert flavors == [("h100-sxm", "4.25"), ("a100-sxm", "4.20")]
    # The invoice list links to the invoice's lines and its CSV.
    assert f'<a href="/billing/invoices/{invoice.id}">{invoice.number}</a>' in page
    assert f'href="/api/v1/invoices/{invoice.id}?format=csv"' in page
    assert 'href="/api/v1/usage?period=2026-10&amp;format=csv"' in page
    # and the CSV downloads with the portal session.
    download = client.get(f"/api/v1/invoices/{invoice.id}", {"format": "csv"})
    assert download.status_code == 200 and download["Content-Type"].startswith("text/csv")

    lines = client.get(f"/billing/invoices/{invoice.id}").content.decode()
    assert invoice.number in lines and "finalized" in lines
    assert "3.000000 device-hours" in lines and "<strong>USD 6.30</strong>" in lines


def test_a_hard_budget_reached_says_why_jobs_wait(client, acme_billed):
    acme = acme_billed[0]
    billing.set_budgets(acme.id, soft=None, hard=Decimal("8.00"))
    assert client.login(username=acme.username, password=acme.password)
    page = client.get("/billing/").content.decode()
    assert '<div class="budget-bar over-hard"' in page
    assert "hard budget reached: USD 8.45 spent of 8.00" in page


def test_usage_without_a_price_is_explained_not_a_crash(client, acme_billed):
    from billing.models import BillingAccount, Price, PriceBook

    acme = acme_billed[0]
    book = PriceBook.objects.create(name="h100-only")
    Price.objects.create(book=book, resource="h100-sxm", per_hour=Decimal("4"), effective_from=date(2026, 1, 1))
    BillingAccount.objects.create(tenant_id=acme.id, price_book=book)
    assert client.login(username=acme.username, password=acme.password)
    page = client.get("/billing/").content.decode()
    assert "This month's spend cannot be priced" in page and "&#x27;a100-sxm&#x27;" in page
    assert billing.list_invoices(acme.id)[0].number in page  # the invoices still show


def test_the_portal_links_to_billing_and_the_third_tenant_sees_nothing_of_the_first(client, acme_billed):
    acme, _, initech = acme_billed
    invoice = billing.list_invoices(acme.id)[0]
    assert client.login(username=initech.username, password=initech.password)
    assert 'href="/billing/"' in client.get("/").content.decode()
    page = client.get("/billing/").content.decode()
    assert "USD 0.00</strong> spent this month" in page and "No usage this month yet." in page
    assert invoice.number not in page and "No invoices yet." in page
    assert "No budgets set." in page
    assert client.get(f"/billing/invoices/{invoice.id}").status_code == 404
    assert client.get(f"/api/v1/invoices/{invoice.id}", {"format": "csv"}).status_code == 404


def test_an_anonymous_visitor_is_sent_to_sign_in(client, db):
    for url in ("/billing/", "/billing/invoices/1"):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/login/")
