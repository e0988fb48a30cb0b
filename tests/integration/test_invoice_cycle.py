"""The hourly invoice cycle, with an injected clock: this month's drafts stay fresh, last month is
finalized from the finalize day on, and usage of last month that arrives later is an adjustment."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest

from billing import services as billing
from billing.contracts import UsageInterval
from billing.models import Invoice, InvoiceStatus

pytestmark = pytest.mark.integration

NOV, DEC = date(2026, 11, 1), date(2026, 12, 1)


def used(tenant, key, start, hours, *, now):
    billing.ingest_usage(
        [
            UsageInterval(
                key=key,
                tenant_id=tenant.id,
                job_id=1,
                device_id="gpu-a100-0/0",
                flavor="a100-sxm",
                started_at=start,
                ended_at=start + timedelta(hours=hours),
            )
        ],
        now=now,
    )


def invoice(tenant, period):
    return Invoice.objects.get(tenant_id=tenant.id, period=period)


def test_the_cycle_drafts_this_month_and_finalizes_last_month_from_the_finalize_day(db, tenants, settings):
    settings.POLYCHIP_INVOICE_FINALIZE_DAY = 3
    acme, globex, initech = tenants
    # Across the month boundary: 1 h in November, 2 h in December.
    used(acme, "a", datetime(2026, 11, 30, 23, tzinfo=UTC), 3, now=datetime(2026, 12, 1, 2, tzinfo=UTC))
    used(globex, "g", datetime(2026, 11, 10, tzinfo=UTC), 10, now=datetime(2026, 12, 1, 2, tzinfo=UTC))

    # Before the finalize day: drafts, November's first (a period's usage waits for its own invoice).
    assert billing.invoice_cycle(now=datetime(2026, 12, 2, 12, tzinfo=UTC)) == {"finalized": 0, "drafted": 3}
    assert invoice(acme, DEC).status == InvoiceStatus.DRAFT and invoice(acme, DEC).total == Decimal("4.20")
    assert invoice(acme, NOV).status == InvoiceStatus.DRAFT and invoice(acme, NOV).total == Decimal("2.10")
    assert not Invoice.objects.filter(tenant_id=globex.id, period=DEC).exists()  # nothing to bill: no invoice
    with pytest.raises(billing.BillingError, match="2026-11 is not invoiced yet"):
        billing.finalize_invoice(acme.id, DEC, now=datetime(2027, 1, 5, tzinfo=UTC))

    assert billing.invoice_cycle(now=datetime(2026, 12, 3, 0, 5, tzinfo=UTC)) == {"finalized": 2, "drafted": 1}
    assert invoice(acme, NOV).status == InvoiceStatus.FINALIZED and invoice(acme, NOV).total == Decimal("2.10")
    assert invoice(globex, NOV).total == Decimal("21.00")
    assert not Invoice.objects.filter(tenant_id=initech.id).exists()

    # Usage of November that arrives after it was finalized goes on December's invoice, as an adjustment.
    used(acme, "late", datetime(2026, 11, 20, tzinfo=UTC), 1, now=datetime(2026, 12, 4, tzinfo=UTC))
    billing.invoice_cycle(now=datetime(2026, 12, 4, 1, tzinfo=UTC))
    assert invoice(acme, NOV).total == Decimal("2.10")
    december = billing.get_invoice(tenant_id=acme.id, invoice_id=invoice(acme, DEC).pk)
    assert [(line.kind, line.usage_period, line.amount) for line in december.lines] == [
        ("usage", DEC, Decimal("4.20")),
        ("adjustment", NOV, Decimal("2.10")),
    ]
    assert december.total == Decimal("6.30")
