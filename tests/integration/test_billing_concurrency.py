"""The ledger under concurrency, late usage and tampering, on PostgreSQL.

- Dedup: 32 clients send 100,000 events (10% exact duplicates, 5% replayed days later) while relays
  run; the ledger and the finalized invoices equal the ground truth rated from the events alone.
- 20 invoice runs racing for one tenant and period make exactly one invoice, finalized once.
- Late usage becomes an adjustment on the next invoice; too-late usage and conflicting replays are
  refused, changing nothing.
- PostgreSQL itself refuses to change a finalized invoice, its lines, or a billed ledger entry.
"""

from __future__ import annotations

import os
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError, connection, transaction

from billing import services as billing
from billing.contracts import UsageInterval
from billing.models import ImmutableInvoice, Invoice, InvoiceLine, InvoiceStatus, LedgerEntry, UsageRecord
from tests import billing_load as load

pytestmark = pytest.mark.integration

EVENTS = int(os.environ.get("BILLING_LOAD_EVENTS", "100000"))
JAN, FEB, MAR = date(2027, 1, 1), date(2027, 2, 1), date(2027, 3, 1)


def at(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def usage(tenant_id: int, key: str, start: datetime, held: timedelta, **changes: object) -> UsageInterval:
    fields: dict[str, object] = {
        "key": key,
        "tenant_id": tenant_id,
        "job_id": 1,
        "device_id": "gpu-a100-0/0",
        "flavor": "a100-sxm",
        "started_at": start,
        "ended_at": start + held,
    }
    fields.update(changes)
    return UsageInterval(**fields)  # type: ignore[arg-type]


def line_tuples(lines) -> list[tuple[object, ...]]:
    """Invoice lines (stored or freshly rated) as comparable tuples."""
    return [
        (
            line.kind,
            line.job_id,
            line.flavor,
            line.usage_period,
            line.unit,
            line.unit_price,
            line.quantity_ms,
            line.amount,
        )
        for line in lines
    ]


# --- dedup under load -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(1200)
def test_32_clients_send_100k_events_and_the_ledger_equals_the_ground_truth():
    tenant_ids = load.setup_tenants(8)
    plan = load.make_events(EVENTS, seed=8, tenant_ids=tenant_ids)
    assert plan.sent == EVENTS
    assert len(plan.first_pass) - len(plan.unique) == round(EVENTS * 0.10)
    assert len(plan.replays) == round(EVENTS * 0.05)

    first, later = load.send_plan(plan, clients=32)
    assert first.errors == [] and later.errors == []
    # Every ingest answered exactly: each unique key created once, everything else a duplicate.
    assert (first.created, first.duplicates, first.conflicts) == (
        len(plan.unique),
        len(plan.first_pass) - len(plan.unique),
        0,
    )
    assert (later.created, later.duplicates, later.conflicts) == (0, len(plan.replays), 0)
    assert first.relayed > 0  # the relays ran while clients were still sending
    billing.relay_usage()

    truth = load.ground_truth(plan.unique)
    state = load.ledger_state(tenant_ids)
    assert (state.records, state.outbox) == (truth.records, 0)
    assert state.ms == truth.ms
    assert state.entries == truth.entries
    assert state.keys == truth.keys  # each ledger entry once, with its milliseconds

    invoices = load.finalize_all(tenant_ids)
    for (tenant_id, period), view in invoices.items():
        expected = truth.invoices[tenant_id, period]
        assert view.status == InvoiceStatus.FINALIZED
        assert (view.total, line_tuples(view.lines)) == (expected.total, line_tuples(expected.lines)), (
            tenant_id,
            period,
        )
        assert view.total == sum((line.amount for line in view.lines), Decimal("0.00"))
    assert not LedgerEntry.objects.filter(tenant_id__in=tenant_ids, invoice__isnull=True).exists()
    assert sum(view.total for view in invoices.values()) == sum(rated.total for rated in truth.invoices.values())
    print(
        f"\ndedup: {plan.sent} events sent by {first.clients} clients ({first.relayers} relays meanwhile): "
        f"first pass {first.seconds:.1f} s ({first.events_per_s:.0f} events/s, {first.relayed} relayed concurrently), "
        f"replays {later.seconds:.1f} s; {truth.records} records, {len(truth.keys)} ledger entries"
    )


# --- concurrent invoice runs ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(600)
def test_20_concurrent_invoice_runs_make_one_invoice_finalized_once():
    tenant_ids = load.setup_tenants(3, prefix="race")
    plan = load.make_events(1_500, seed=20, tenant_ids=tenant_ids, duplicates=0.0, replays=0.0)
    result = billing.ingest_usage(plan.unique, now=plan.now)
    assert result.created == len(plan.unique)
    billing.relay_usage()
    truth = load.ground_truth(plan.unique)
    tenant_of = {event.key: event.tenant_id for event in plan.unique}

    rounds = [(tenant_ids[0], load.PERIODS[0]), (tenant_ids[1], load.PERIODS[0]), (tenant_ids[2], load.PERIODS[0])]
    rounds += [(tenant_ids[0], load.PERIODS[1]), (tenant_ids[1], load.PERIODS[1])]
    for number, (tenant_id, period) in enumerate(rounds):
        runs = load.concurrent_invoice_runs(tenant_id, period, runs=20, now=load.FINALIZE_AT, seed=number)
        assert runs.invoices_created == 1
        assert len(runs.ids_seen) == 1
        [invoice] = Invoice.objects.filter(tenant_id=tenant_id, period=period)
        assert invoice.id in runs.ids_seen
        assert invoice.status == InvoiceStatus.FINALIZED and invoice.finalized_at == load.FINALIZE_AT
        view = billing.get_invoice(tenant_id=tenant_id, invoice_id=invoice.id)
        expected = truth.invoices[tenant_id, period]
        assert view.total == sum((line.amount for line in view.lines), Decimal("0.00")) == expected.total
        assert line_tuples(view.lines) == line_tuples(expected.lines)
        # The invoice claimed exactly the period's entries, each once.
        claimed = LedgerEntry.objects.filter(invoice=invoice)
        assert set(claimed.values_list("period", flat=True)) == {period}
        suffix = f"@{period:%Y-%m}"
        expected_keys = {
            key for key in truth.keys if key.endswith(suffix) and tenant_of[key[: -len(suffix)]] == tenant_id
        }
        assert set(claimed.values_list("key", flat=True)) == expected_keys
        assert not LedgerEntry.objects.filter(tenant_id=tenant_id, period=period, invoice__isnull=True).exists()
    # The tenant never invoiced in January is still open there, its December closed.
    assert Invoice.objects.filter(tenant_id=tenant_ids[2]).count() == 1


# --- late usage, refusals, conflicts --------------------------------------------------------------


@pytest.fixture
def late_tenant(db) -> int:
    return load.setup_tenants(1, prefix="late")[0]


def test_usage_after_finalization_is_an_adjustment_on_the_next_invoice(late_tenant):
    tenant = late_tenant
    on_time = usage(tenant, "jan-1", at(2027, 1, 16, 22), timedelta(hours=4))  # across the a100 price change
    assert billing.ingest_usage([on_time], now=at(2027, 2, 1)).created == 1
    billing.relay_usage()
    january = billing.finalize_invoice(tenant, JAN, now=at(2027, 2, 2))
    assert january.status == InvoiceStatus.FINALIZED
    # 2 h at 2.10, 2 h at 2.345678901234: two lines, each rounded once (4.20 + 4.69).
    assert [line.amount for line in january.lines] == [Decimal("4.20"), Decimal("4.69")]
    assert january.total == Decimal("8.89")

    # 19 days after January closed (35 are allowed), more January usage arrives.
    late = usage(
        tenant, "jan-late", at(2027, 1, 30, 12), timedelta(minutes=90), job_id=2, flavor="mi300x", nau_milli=1_500
    )
    assert billing.ingest_usage([late], now=at(2027, 2, 20)).created == 1
    assert billing.relay_usage() == 1
    # January's invoice does not move, however it is asked for again.
    assert billing.draft_invoice(tenant, JAN) == january
    assert billing.finalize_invoice(tenant, JAN, now=at(2027, 2, 21)) == january
    [entry] = LedgerEntry.objects.filter(record__key="jan-late")
    assert entry.invoice_id is None and entry.period == JAN  # waiting, not dropped

    february_usage = usage(tenant, "feb-1", at(2027, 2, 10), timedelta(hours=1))
    billing.ingest_usage([february_usage], now=at(2027, 2, 20))
    billing.relay_usage()
    february = billing.finalize_invoice(tenant, FEB, now=at(2027, 3, 1))
    late_amount = (Decimal("2.200000000003") * Decimal("1.5") * Decimal("1.5")).quantize(Decimal("0.01"))
    assert [
        (line.kind, line.job_id, line.usage_period, line.unit, line.quantity_ms, line.amount) for line in february.lines
    ] == [
        ("usage", 1, FEB, "device-hour", 3_600_000, Decimal("2.35")),
        ("adjustment", 2, JAN, "NAU-hour", 90 * 60_000 * 1_500, late_amount),
    ]
    assert late_amount == Decimal("4.95")
    assert february.total == Decimal("2.35") + late_amount
    entry.refresh_from_db()
    assert entry.invoice_id == february.id  # billed once, on February's invoice
    assert billing.get_invoice(tenant_id=tenant, invoice_id=january.id) == january

    # Replaying the late usage once more, days later, bills nothing again.
    assert billing.ingest_usage([late], now=at(2027, 3, 5)).duplicates == 1
    assert billing.relay_usage() == 0
    assert not LedgerEntry.objects.filter(tenant_id=tenant, invoice__isnull=True).exists()
    assert billing.finalize_invoice(tenant, MAR, now=at(2027, 4, 1)).lines == ()


def test_usage_more_than_35_days_after_its_period_is_refused_naming_ended_at(late_tenant):
    tenant = late_tenant
    good = usage(tenant, "feb-ok", at(2027, 2, 27), timedelta(hours=1))
    ended_in_january = usage(tenant, "jan-too-late", at(2027, 1, 31, 23), timedelta(minutes=59))
    # January closed on Feb 1; 35 days later is Mar 8: accepted that whole day, refused from Mar 9.
    with pytest.raises(billing.BillingError, match="jan-too-late") as refused:
        billing.ingest_usage([good, ended_in_january], now=at(2027, 3, 9))
    assert refused.value.field == "ended_at"
    assert "35 days" in str(refused.value)
    assert not UsageRecord.objects.exists()  # the whole batch is refused, the good usage too

    assert billing.ingest_usage([ended_in_january], now=at(2027, 3, 8, 23, 59)).created == 1


def test_usage_ending_at_midnight_on_the_first_counts_from_the_month_it_was_held(late_tenant):
    january_only = usage(late_tenant, "ends-at-feb-1", at(2027, 1, 31, 23), timedelta(hours=1))
    with pytest.raises(billing.BillingError, match="ends-at-feb-1"):
        billing.ingest_usage([january_only], now=at(2027, 3, 9))


def test_a_conflicting_replay_is_reported_and_changes_nothing(late_tenant):
    tenant = late_tenant
    original = usage(tenant, "conf-1", at(2027, 1, 10), timedelta(hours=2))
    other = usage(tenant, "conf-2", at(2027, 1, 11), timedelta(hours=1))
    assert billing.ingest_usage([original, other], now=at(2027, 1, 20)).created == 2
    billing.relay_usage()
    before = _snapshot()

    altered = [
        usage(tenant, "conf-1", at(2027, 1, 10), timedelta(hours=3)),  # longer
        usage(tenant, "conf-1", at(2027, 1, 10), timedelta(hours=2), flavor="h100-sxm"),
        usage(tenant, "conf-1", at(2027, 1, 10), timedelta(hours=2), nau_milli=2_000),
        usage(tenant, "conf-1", at(2027, 1, 10), timedelta(hours=2), job_id=9),
        usage(tenant, "conf-1", at(2027, 1, 10, 0, 0, 0) + timedelta(microseconds=1), timedelta(hours=2)),
    ]
    for changed in altered:
        result = billing.ingest_usage([changed, other], now=at(2027, 1, 21))
        assert (result.created, result.duplicates, result.conflicts) == (0, 1, ("conf-1",))
        assert billing.relay_usage() == 0
        assert _snapshot() == before
    # A batch with new usage and a conflict: the new usage goes in, the conflict is listed, untouched.
    result = billing.ingest_usage(
        [usage(tenant, "conf-3", at(2027, 1, 12), timedelta(hours=1)), altered[0]], now=at(2027, 1, 21)
    )
    assert (result.created, result.duplicates, result.conflicts) == (1, 0, ("conf-1",))
    assert UsageRecord.objects.get(key="conf-1").duration_ms == 2 * 3_600_000
    # The transactional path raises instead, rolling the whole change back.
    with pytest.raises(billing.UsageConflict, match="conf-1"), transaction.atomic():
        billing.record_usage([usage(tenant, "conf-4", at(2027, 1, 13), timedelta(hours=1)), altered[0]])
    assert not UsageRecord.objects.filter(key="conf-4").exists()


def test_a_conflict_inside_one_batch_is_reported(late_tenant):
    tenant = late_tenant
    first = usage(tenant, "twice", at(2027, 1, 10), timedelta(hours=2))
    second = usage(tenant, "twice", at(2027, 1, 10), timedelta(hours=5))
    result = billing.ingest_usage([first, second], now=at(2027, 1, 20))
    assert result.conflicts == ("twice",)


def _snapshot() -> tuple[object, ...]:
    return (
        sorted(
            UsageRecord.objects.values_list(
                "key", "started_at", "ended_at", "duration_ms", "flavor", "job_id", "nau_milli"
            )
        ),
        sorted(LedgerEntry.objects.values_list("key", "period", "start_ms", "duration_ms", "invoice_id")),
        sorted(Invoice.objects.values_list("id", "status", "total")),
    )


# --- the database guards --------------------------------------------------------------------------


def _refused(sql: str, params: list[object]) -> str:
    with pytest.raises(IntegrityError) as refused, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)
    return str(refused.value)


def test_postgresql_keeps_finalized_invoices_and_billed_entries_immutable(late_tenant):
    tenant = late_tenant
    billing.ingest_usage([usage(tenant, "imm-1", at(2027, 1, 5), timedelta(hours=3))], now=at(2027, 1, 20))
    billing.ingest_usage([usage(tenant, "imm-2", at(2027, 2, 5), timedelta(hours=1))], now=at(2027, 2, 20))
    billing.relay_usage()
    january = billing.finalize_invoice(tenant, JAN, now=at(2027, 2, 2))
    february = billing.draft_invoice(tenant, FEB)
    [line] = InvoiceLine.objects.filter(invoice_id=january.id)
    billed = LedgerEntry.objects.get(key="imm-1@2027-01")
    unbilled = LedgerEntry.objects.get(key="imm-2@2027-02")
    assert billed.invoice_id == january.id and unbilled.invoice_id is None

    assert "is finalized" in _refused("UPDATE billing_invoice SET total = 0 WHERE id = %s", [january.id])
    assert "is finalized" in _refused("UPDATE billing_invoice SET status = 'draft' WHERE id = %s", [january.id])
    assert "is finalized" in _refused("DELETE FROM billing_invoice WHERE id = %s", [january.id])
    with pytest.raises(IntegrityError), transaction.atomic():
        Invoice.objects.filter(pk=january.id).update(total=Decimal("0.01"))
    with pytest.raises(ImmutableInvoice):
        invoice = Invoice.objects.get(pk=january.id)
        invoice.total = Decimal("1.00")
        invoice.save()

    assert "its lines cannot change" in _refused("UPDATE billing_invoiceline SET amount = 0 WHERE id = %s", [line.id])
    assert "its lines cannot change" in _refused("DELETE FROM billing_invoiceline WHERE id = %s", [line.id])
    assert "its lines cannot change" in _refused(
        "INSERT INTO billing_invoiceline (invoice_id, position, kind, job_id, flavor, usage_period, unit, unit_price,"
        " quantity_ms, amount) VALUES (%s, 99, 'usage', 1, 'a100-sxm', '2027-01-01', 'device-hour', 1, 1, 1)",
        [january.id],
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        InvoiceLine.objects.filter(pk=line.id).update(quantity_ms=1)

    assert "immutable" in _refused("UPDATE billing_ledgerentry SET duration_ms = 1 WHERE id = %s", [billed.id])
    assert "immutable" in _refused("UPDATE billing_ledgerentry SET invoice_id = NULL WHERE id = %s", [billed.id])
    assert "immutable" in _refused(
        "UPDATE billing_ledgerentry SET invoice_id = %s WHERE id = %s", [february.id, billed.id]
    )
    assert "is billed" in _refused("DELETE FROM billing_ledgerentry WHERE id = %s", [billed.id])
    # An unbilled entry's figures are fixed too; only an invoice may claim it.
    assert "immutable" in _refused("UPDATE billing_ledgerentry SET duration_ms = 1 WHERE id = %s", [unbilled.id])
    assert "immutable" in _refused("UPDATE billing_ledgerentry SET period = '2027-03-01' WHERE id = %s", [unbilled.id])

    # Nothing changed; and the guards are not too broad: a draft and its lines may still be rewritten.
    assert billing.get_invoice(tenant_id=tenant, invoice_id=january.id) == january
    assert LedgerEntry.objects.get(pk=billed.pk).duration_ms == 3 * 3_600_000
    with transaction.atomic():
        Invoice.objects.filter(pk=february.id).update(total=Decimal("9.99"))
        InvoiceLine.objects.filter(invoice_id=february.id).update(amount=Decimal("9.99"))
        transaction.set_rollback(True)
    assert billing.draft_invoice(tenant, FEB).total == february.total
