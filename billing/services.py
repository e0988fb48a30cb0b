"""Use cases of the billing app: usage in, the relay to the ledger, invoices, budgets, reconciliation.

Money moves through keyed rows only. A usage record and its outbox row are written in one
transaction (``INSERT ... ON CONFLICT DO NOTHING`` on the record's key, so a replay writes neither);
the relay claims outbox rows with ``FOR UPDATE SKIP LOCKED`` and, in the same transaction, writes
their ledger entries (keyed again) and deletes them. A process killed anywhere leaves either the
outbox row or the ledger entry, never neither and never two. Invoices claim ledger entries once, when
they are finalized, under the invoice's row lock.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Min, Q, QuerySet, Sum
from django.utils import timezone

from billing import crashpoints, price_books, rating
from billing.contracts import (
    BudgetStatus,
    FlavorUsage,
    IngestResult,
    InvoiceLineView,
    InvoiceView,
    LedgerEntryView,
    OpenUsage,
    PriceBookView,
    Reconciliation,
    ReconciliationRow,
    UsageInterval,
)
from billing.models import (
    BillingAccount,
    BudgetAlert,
    Invoice,
    InvoiceLine,
    InvoiceStatus,
    LedgerEntry,
    Price,
    PriceBook,
    UsageOutbox,
    UsageRecord,
    invoice_number,
)
from billing.price_books import PriceBookInvalid as PriceBookInvalid
from billing.price_books import PriceBookNotFound as PriceBookNotFound
from billing.price_books import assign_price_book as assign_price_book
from billing.price_books import create_price_book as create_price_book
from billing.price_books import get_price_book as get_price_book
from billing.price_books import schedule_price as schedule_price
from billing.rating import RatingError as RatingError  # raised by pricing (a flavor without a price); public here
from billing.usage_sources import UsageSource as UsageSource
from billing.usage_sources import allocated_ms as allocated_ms
from billing.usage_sources import open_usage as open_usage
from billing.usage_sources import register_usage_source as register_usage_source
from billing.usage_sources import unregister_usage_source as unregister_usage_source
from controlplane import domain
from tenants import services as tenants

log = logging.getLogger(__name__)

# Usage may arrive this long after its period ended and still be billed (as an adjustment line on
# the tenant's next invoice); the ingest API refuses anything later, loudly.
LATE_USAGE_DAYS = 35
INGEST_CHUNK = 1000
RELAY_BATCH = 1000  # outbox rows per relay transaction


class BillingError(domain.DomainError, ValueError):
    """A request billing cannot carry out; ``field`` names what to fix ("" when nothing in the request
    is at fault). Its subclass says how the API answers it (``controlplane.errors``)."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message, field=field or None)
        self.field = field


class BillingInvalid(BillingError, domain.Invalid):
    """The request's own figures are wrong (400): a period not written YYYY-MM, a negative budget."""


class BillingConflict(BillingError, domain.Conflict):
    """The request is well formed, but the state of billing forbids it (409): a period not over yet, an
    earlier period still a draft, no default price book."""


class UsageConflict(BillingConflict):
    pass


class InvoiceNotFound(BillingError, domain.NotFound):
    """No such invoice for this tenant: another tenant's invoice answers exactly like a missing one (404)."""


# --- usage in ---------------------------------------------------------------------------------------


def held_ms(started_at: datetime, ended_at: datetime) -> int:
    """Whole milliseconds from start to end, each cut to the millisecond first: back-to-back
    intervals tile exactly, and a replay always agrees."""
    return rating.epoch_ms(ended_at) - rating.epoch_ms(started_at)


def duration_ms(interval: UsageInterval) -> int:
    return held_ms(interval.started_at, interval.ended_at)


def _validate(interval: UsageInterval) -> None:
    if not interval.key or len(interval.key) > 200:
        raise BillingInvalid(f"usage key {interval.key!r}: give 1 to 200 characters", field="key")
    if interval.ended_at < interval.started_at:
        raise BillingInvalid(f"usage {interval.key}: ended_at is before started_at", field="ended_at")
    if interval.nau_milli < 0:
        raise BillingInvalid(f"usage {interval.key}: nau_milli must not be negative", field="nau_milli")


def _row(interval: UsageInterval) -> tuple[Any, ...]:
    return (
        interval.key,
        interval.tenant_id,
        interval.job_id,
        interval.device_id,
        interval.flavor,
        interval.started_at,
        interval.ended_at,
        duration_ms(interval),
        interval.nau_milli,
        interval.credit_reason[:300],
    )


def _insert_records(intervals: Sequence[UsageInterval]) -> IngestResult:
    """Insert new records and their outbox rows, in the caller's transaction; report replays and conflicts."""
    by_key: dict[str, UsageInterval] = {}
    conflicting: set[str] = set()
    for interval in intervals:
        _validate(interval)
        first = by_key.setdefault(interval.key, interval)  # an exact duplicate inside one batch is a replay too
        if _row(first) != _row(interval):
            conflicting.add(interval.key)  # the same key twice in one batch, with other figures
    new_ids: list[int] = []
    new_keys: set[str] = set()
    now = timezone.now()
    unique = sorted(by_key.values(), key=lambda interval: interval.key)  # one lock order: no deadlock between batches
    with connection.cursor() as cursor:
        for start in range(0, len(unique), INGEST_CHUNK):
            rows = [(*_row(interval), now) for interval in unique[start : start + INGEST_CHUNK]]
            cursor.execute(
                *_insert(
                    UsageRecord._meta.db_table, _RECORD_COLUMNS, rows, "ON CONFLICT (key) DO NOTHING RETURNING id, key"
                )
            )
            for record_id, key in cursor.fetchall():
                new_ids.append(record_id)
                new_keys.add(key)
        for start in range(0, len(new_ids), INGEST_CHUNK):
            outbox_rows = [(record_id, now) for record_id in new_ids[start : start + INGEST_CHUNK]]
            cursor.execute(
                *_insert(
                    UsageOutbox._meta.db_table, (("record_id", "bigint"), ("created_at", "timestamptz")), outbox_rows
                )
            )
    replayed = [key for key in by_key if key not in new_keys]
    stored_conflicts = set(_conflicts({key: by_key[key] for key in replayed})) if replayed else set()
    # Each interval sent is new, a replay (the same figures again), or a conflict (other figures
    # under a key already stored, or already sent in this batch).
    duplicates, seen = 0, set()
    for interval in intervals:
        if interval.key in stored_conflicts:
            continue
        if interval.key not in seen:
            seen.add(interval.key)
            duplicates += interval.key not in new_keys
        elif _row(interval) == _row(by_key[interval.key]):
            duplicates += 1
    return IngestResult(
        created=len(new_ids), duplicates=duplicates, conflicts=tuple(sorted(stored_conflicts | conflicting))
    )


UNNEST_FROM = 20  # rows from which arrays beat VALUES
_RECORD_COLUMNS = (
    ("key", "text"),
    ("tenant_id", "bigint"),
    ("job_id", "bigint"),
    ("device_id", "text"),
    ("flavor", "text"),
    ("started_at", "timestamptz"),
    ("ended_at", "timestamptz"),
    ("duration_ms", "bigint"),
    ("nau_milli", "integer"),
    ("credit_reason", "text"),
    ("recorded_at", "timestamptz"),
)
_LEDGER_COLUMNS = (
    ("key", "text"),
    ("record_id", "bigint"),
    ("tenant_id", "bigint"),
    ("job_id", "bigint"),
    ("flavor", "text"),
    ("period", "date"),
    ("start_ms", "bigint"),
    ("duration_ms", "bigint"),
    ("nau_milli", "integer"),
    ("credit_reason", "text"),
    ("created_at", "timestamptz"),
)
_COLUMNS = tuple(name for name, _ in _RECORD_COLUMNS[:-1])  # what a replay must match (not recorded_at)


def _insert(
    table: str, columns: Sequence[tuple[str, str]], rows: Sequence[tuple[Any, ...]], tail: str = ""
) -> tuple[str, list[Any]]:
    """One ``INSERT`` of many rows, with ``tail`` (``ON CONFLICT ...``, ``RETURNING ...``) after it.

    On PostgreSQL the rows travel as one array per column (``unnest``): a dozen parameters instead
    of thousands, which psycopg would otherwise splice into the statement one by one, the slowest
    part of a batch. A few rows, or SQLite (the embedded default): a plain multi-row VALUES.
    """
    names = ", ".join(connection.ops.quote_name(name) for name, _ in columns)
    table = connection.ops.quote_name(table)
    if connection.vendor == "postgresql" and len(rows) >= UNNEST_FROM:
        arrays = ", ".join(f"%s::{kind}[]" for _, kind in columns)
        # S608: the identifiers are our own, quoted; the tail is a constant clause; values travel as parameters.
        return (
            f"INSERT INTO {table} ({names}) SELECT * FROM unnest({arrays}) {tail}",  # noqa: S608
            [list(column) for column in zip(*rows, strict=True)],
        )
    placeholders = ", ".join(["(" + ", ".join(["%s"] * len(columns)) + ")"] * len(rows))
    sql = f"INSERT INTO {table} ({names}) VALUES {placeholders} {tail}"  # noqa: S608 (as above)
    return sql, [v for row in rows for v in row]


def _conflicts(replayed: Mapping[str, UsageInterval]) -> list[str]:
    """Keys whose stored record differs from what was sent again."""
    stored = UsageRecord.objects.filter(key__in=list(replayed)).values_list("key", *_COLUMNS[1:])
    return sorted(key for key, *values in stored if tuple(values) != _row(replayed[key])[1:])


def record_usage(intervals: Iterable[UsageInterval]) -> int:
    """Write usage records; must run inside the transaction of the change that ends the intervals.

    Returns how many were new: a replayed key is ignored, never counted twice. A key replayed with
    different figures is a bug in the caller and raises, rolling the change back.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("record_usage must run inside the transaction that ends the allocation")
    result = _insert_records(list(intervals))
    if result.conflicts:
        raise UsageConflict(f"usage {', '.join(result.conflicts)} was recorded before with other figures")
    return result.created


def ingest_usage(intervals: Sequence[UsageInterval], *, now: datetime | None = None) -> IngestResult:
    """Take usage from outside (a meter, a backend's own accounting) in one transaction.

    Replays are ignored and conflicts reported by key; usage that ended more than
    ``LATE_USAGE_DAYS`` after its period closed is refused whole, naming the first such key.
    """
    now = now or timezone.now()
    for interval in intervals:
        # The period of the last millisecond held: usage ending at 00:00 on the 1st belongs to the month before.
        start_ms, end_ms = rating.epoch_ms(interval.started_at), rating.epoch_ms(interval.ended_at)
        period_end = rating.next_period(rating.period_of(max(start_ms, end_ms - 1)))
        if now.date() > period_end + timedelta(days=LATE_USAGE_DAYS):
            raise BillingInvalid(
                f"usage {interval.key} ended in {interval.ended_at:%Y-%m}, more than {LATE_USAGE_DAYS} days "
                "before now; usage that late is not billed automatically: ask an operator to credit it",
                field="ended_at",
            )
    with transaction.atomic():
        return _insert_records(list(intervals))


# --- the relay -------------------------------------------------------------------------------------


_RECORD_FIELDS = (
    "pk", "key", "tenant_id", "job_id", "flavor", "started_at", "duration_ms", "nau_milli", "credit_reason"
)  # fmt: skip


def _entries_for(
    record_id: int,
    key: str,
    tenant_id: int,
    job_id: int,
    flavor: str,
    started_at: datetime,
    ms: int,
    nau: int,
    credit_reason: str,
) -> list[tuple[str, int, int, int, str, date, int, int, int, str]]:
    """The record's ledger rows (``_LEDGER_COLUMNS`` but the time of writing), one per period it touches."""
    return [
        (
            f"{key}@{period:%Y-%m}",
            record_id,
            tenant_id,
            job_id,
            flavor,
            period,
            piece_start,
            piece_ms,
            nau,
            credit_reason,
        )
        for period, piece_start, piece_ms in rating.split_by_period(rating.epoch_ms(started_at), ms)
    ]


def post_outbox_batch(limit: int = RELAY_BATCH) -> int:
    """Claim up to ``limit`` outbox rows no other relay holds, post them to the ledger, delete them.

    One transaction: killed before the commit, nothing happened; after it, all of it did. The ledger
    key is unique, so even a row posted twice (it cannot be, but a restored backup could) adds nothing.
    """
    with transaction.atomic():
        claimed = list(
            UsageOutbox.objects.select_for_update(skip_locked=True)
            .order_by("id")
            .values_list("id", "record_id")[:limit]
        )
        if not claimed:
            return 0
        crashpoints.reached("claimed")  # the named points are no-ops but in the crash trials
        records = UsageRecord.objects.filter(pk__in=[record_id for _, record_id in claimed])
        now = timezone.now()
        entries = [(*entry, now) for row in records.values_list(*_RECORD_FIELDS) for entry in _entries_for(*row)]
        with connection.cursor() as cursor:
            for start in range(0, len(entries), INGEST_CHUNK):
                chunk = entries[start : start + INGEST_CHUNK]
                cursor.execute(
                    *_insert(LedgerEntry._meta.db_table, _LEDGER_COLUMNS, chunk, "ON CONFLICT (key) DO NOTHING")
                )
        crashpoints.reached("posted")
        UsageOutbox.objects.filter(pk__in=[outbox_id for outbox_id, _ in claimed]).delete()
        crashpoints.reached("outbox_deleted")
    crashpoints.reached("committed")
    return len(claimed)


def relay_usage(*, batch: int = RELAY_BATCH, max_batches: int | None = None) -> int:
    """Post the outbox to the ledger until it is empty (or ``max_batches`` ran); returns rows posted."""
    posted, batches = 0, 0
    while max_batches is None or batches < max_batches:
        count = post_outbox_batch(batch)
        posted, batches = posted + count, batches + 1
        if count < batch:
            break
    return posted


def outbox_backlog() -> int:
    return UsageOutbox.objects.count()


def outbox_state() -> tuple[int, datetime | None]:
    """The usage records waiting for the relay, and when the oldest of them was written (/metrics)."""
    backlog = UsageOutbox.objects.aggregate(rows=Count("id"), oldest=Min("created_at"))
    return backlog["rows"], backlog["oldest"]


# --- prices ----------------------------------------------------------------------------------------


# Illustrative list prices per device-hour for the demo pool's flavors, and a per-NAU-hour price for
# every other flavor (one NAU: one reference device's throughput). Operators edit them in the admin.
STANDARD_PRICES = {
    rating.NAU: Decimal("2.200000000000"),
    "h100-sxm": Decimal("4.250000000000"),
    "a100-sxm": Decimal("2.100000000000"),
    "ascend-910b": Decimal("1.650000000000"),
    "tpu-v4": Decimal("1.950000000000"),
}
STANDARD_FROM = date(2026, 1, 1)


def default_price_book() -> PriceBook:
    """The book of tenants without one of their own; the standard list is created on first use."""
    book = PriceBook.objects.filter(is_default=True).first()
    if book is not None:
        return book
    try:
        with transaction.atomic():
            book = PriceBook.objects.create(
                name="standard", is_default=True, description="List prices; per NAU-hour for other flavors"
            )
            Price.objects.bulk_create(
                Price(book=book, resource=resource, per_hour=per_hour, effective_from=STANDARD_FROM)
                for resource, per_hour in STANDARD_PRICES.items()
            )
    except IntegrityError:
        pass  # another worker created it, or a book named "standard" exists but is not the default
    book = PriceBook.objects.filter(is_default=True).first()
    if book is None:
        raise BillingConflict("no default price book: mark one as default in the admin (Billing > Price books)")
    return book


def list_price_books() -> list[PriceBookView]:
    """Every price book, the default first (the standard one is made if none is there yet)."""
    default_price_book()
    return price_books.list_price_books()


def _book_model(tenant_id: int, period: date | None = None) -> PriceBook:
    """The book that bills the tenant's ``period`` (default: the current one)."""
    account = BillingAccount.objects.filter(tenant_id=tenant_id).select_related("price_book", "next_price_book").first()
    if account is None:
        return default_price_book()
    period = period or current_period()
    changed = account.next_price_book_from is not None and period >= account.next_price_book_from
    book = account.next_price_book if changed else account.price_book
    return book or default_price_book()


def load_price_book(book: PriceBook) -> rating.PriceBook:
    changes = [
        rating.PriceChange(resource=resource, effective_from=effective_from, per_hour=per_hour)
        for resource, effective_from, per_hour in Price.objects.filter(book=book).values_list(
            "resource", "effective_from", "per_hour"
        )
    ]
    return rating.PriceBook(book.name, changes, currency=book.currency)


def price_book_for(tenant_id: int, period: date | None = None) -> rating.PriceBook:
    """The prices that bill the tenant's ``period`` (default: the current one)."""
    return load_price_book(_book_model(tenant_id, period))


# --- invoices --------------------------------------------------------------------------------------


def current_period(now: datetime | None = None) -> date:
    """The first day of the billing period that ``now`` (default: this moment) falls in."""
    return rating.period_of(rating.epoch_ms(now or timezone.now()))


def parse_period(text: str) -> date:
    """``YYYY-MM`` to the period's first day; a clear error otherwise."""
    try:
        year, month = (int(part) for part in text.split("-"))
        return date(year, month, 1)
    except (ValueError, TypeError):
        raise BillingInvalid(f"period {text!r}: write it as YYYY-MM, e.g. 2026-11", field="period") from None


def _rated(entries: Any, book: rating.PriceBook, period: date) -> rating.RatedInvoice:
    rows = entries.values_list("job_id", "flavor", "period", "start_ms", "duration_ms", "nau_milli", "credit_reason")
    usages = (
        rating.RatedUsage(job_id, flavor, usage_period, start, ms, nau, credited=bool(reason))
        for job_id, flavor, usage_period, start, ms, nau, reason in rows.iterator(chunk_size=5000)
    )
    return rating.rate(usages, book, period)


def _open_invoice(tenant_id: int, period: date, book: PriceBook) -> Invoice:
    """The tenant's invoice for the period, created if missing, locked for this transaction.

    However many runs race, the unique constraint lets one insert win; the rest find its row.
    """
    Invoice.objects.bulk_create(
        [Invoice(tenant_id=tenant_id, period=period, currency=book.currency, price_book=book.name)],
        ignore_conflicts=True,
    )
    return Invoice.objects.select_for_update().get(tenant_id=tenant_id, period=period)


def _invoice_statuses(tenant_id: int) -> dict[date, str]:
    return dict(Invoice.objects.filter(tenant_id=tenant_id).values_list("period", "status"))


def _billable(tenant_id: int, period: date, statuses: Mapping[date, str]) -> Any:
    """Unbilled entries this invoice covers: its period's, and late ones of earlier periods that were
    already invoiced (finalized): those become adjustment lines."""
    invoiced_earlier = [p for p, status in statuses.items() if p < period and status == InvoiceStatus.FINALIZED]
    return LedgerEntry.objects.filter(tenant_id=tenant_id, invoice__isnull=True).filter(
        Q(period=period) | Q(period__in=invoiced_earlier)
    )


def _unsettled_before(tenant_id: int, period: date, statuses: Mapping[date, str]) -> list[date]:
    """Earlier periods that still need their own invoice finalized: a draft, or unbilled usage and no
    invoice at all. They come first: an invoice never bills another period's usage before that
    period was invoiced."""
    drafts = {p for p, status in statuses.items() if p < period and status == InvoiceStatus.DRAFT}
    uninvoiced = (
        LedgerEntry.objects.filter(tenant_id=tenant_id, invoice__isnull=True, period__lt=period)
        .exclude(period__in=list(statuses))
        .values_list("period", flat=True)
        .distinct()
    )
    return sorted(drafts | set(uninvoiced))


def _write_lines(invoice: Invoice, rated: rating.RatedInvoice) -> None:
    invoice.lines.all().delete()
    InvoiceLine.objects.bulk_create(
        [
            InvoiceLine(
                invoice=invoice,
                position=position,
                kind=line.kind,
                job_id=line.job_id,
                flavor=line.flavor,
                usage_period=line.usage_period,
                unit=line.unit,
                unit_price=line.unit_price,
                quantity_ms=line.quantity_ms,
                amount=line.amount,
            )
            for position, line in enumerate(rated.lines, start=1)
        ],
        batch_size=INGEST_CHUNK,
    )


def draft_invoice(tenant_id: int, period: date) -> InvoiceView:
    """Create or refresh the tenant's draft for the period from the ledger as it stands; a finalized
    invoice is returned unchanged. Safe to run any number of times, concurrently."""
    book = _book_model(tenant_id, period)
    with transaction.atomic():
        invoice = _open_invoice(tenant_id, period, book)
        if invoice.status == InvoiceStatus.DRAFT:
            billable = _billable(tenant_id, period, _invoice_statuses(tenant_id))
            rated = _rated(billable, load_price_book(book), period)
            _write_lines(invoice, rated)
            Invoice.objects.filter(pk=invoice.pk).update(total=rated.total, updated_at=timezone.now())
    return get_invoice(tenant_id=tenant_id, invoice_id=invoice.pk)


def _refuse_open_period(period: date, now: datetime) -> None:
    if rating.epoch_ms(now) < rating.period_bounds_ms(period)[1]:
        after = rating.next_period(period)
        raise BillingConflict(
            f"period {period:%Y-%m} has not ended: it can be finalized from {after.isoformat()} 00:00 UTC on",
            field="period",
        )


def finalize_invoice(tenant_id: int, period: date, *, now: datetime | None = None) -> InvoiceView:
    """Bill the period: claim its unbilled ledger entries (and earlier periods' late ones), rate them,
    and freeze the invoice. Idempotent: a finalized invoice is returned as it is."""
    now = now or timezone.now()
    _refuse_open_period(period, now)
    book = _book_model(tenant_id, period)
    with transaction.atomic():
        invoice = _open_invoice(tenant_id, period, book)
        if invoice.status == InvoiceStatus.FINALIZED:
            return get_invoice(tenant_id=tenant_id, invoice_id=invoice.pk)
        statuses = _invoice_statuses(tenant_id)
        earlier = _unsettled_before(tenant_id, period, statuses)
        if earlier:
            raise BillingConflict(
                f"{earlier[0]:%Y-%m} is not invoiced yet (a draft, or usage without an invoice): finalize "
                "periods in order",
                field="period",
            )
        # One UPDATE claims what it sees; an entry the relay commits meanwhile stays unbilled and goes
        # on the next invoice as an adjustment. The lines are rated from exactly the claimed entries.
        _billable(tenant_id, period, statuses).update(invoice=invoice)
        rated = _rated(LedgerEntry.objects.filter(invoice=invoice), load_price_book(book), period)
        _write_lines(invoice, rated)
        Invoice.objects.filter(pk=invoice.pk).update(
            total=rated.total, status=InvoiceStatus.FINALIZED, finalized_at=now, updated_at=now
        )
    return get_invoice(tenant_id=tenant_id, invoice_id=invoice.pk)


def tenants_to_invoice(period: date) -> list[int]:
    """Tenants with unbilled usage up to the period, or a draft up to it."""
    with_usage = LedgerEntry.objects.filter(invoice__isnull=True, period__lte=period).values_list(
        "tenant_id", flat=True
    )
    with_draft = Invoice.objects.filter(period__lte=period, status=InvoiceStatus.DRAFT).values_list(
        "tenant_id", flat=True
    )
    return sorted(set(with_usage.distinct()) | set(with_draft.distinct()))


def run_invoices(
    period: date, *, finalize: bool, now: datetime | None = None, tenant_ids: Iterable[int] | None = None
) -> list[InvoiceView]:
    """Draft (or finalize) the period's invoice of every tenant that has something to bill (or of
    ``tenant_ids``), earlier periods still unsettled first, after posting the outbox so nothing
    ingested so far is left out. A tenant with nothing to bill in a period gets no (empty) invoice.
    Finalizing a period that has not ended is refused before anything changes."""
    now = now or timezone.now()
    if finalize:
        _refuse_open_period(period, now)
    relay_usage()
    views: list[InvoiceView] = []
    wanted = None if tenant_ids is None else set(tenant_ids)
    for tenant_id in tenants_to_invoice(period):
        if wanted is not None and tenant_id not in wanted:
            continue
        statuses = _invoice_statuses(tenant_id)
        periods = _unsettled_before(tenant_id, period, statuses)
        if period in statuses or _billable(tenant_id, period, statuses).exists():
            periods.append(period)
        for each in periods:
            views.append(finalize_invoice(tenant_id, each, now=now) if finalize else draft_invoice(tenant_id, each))
    return views


def invoice_cycle(*, now: datetime | None = None) -> dict[str, int]:
    """What beat runs every hour: refresh this month's drafts, and once the finalize day of the month
    has come, finalize last month's invoices (late usage after that becomes adjustment lines)."""
    now = now or timezone.now()
    current = rating.period_of(rating.epoch_ms(now))
    previous = rating.previous_period(current)
    views = run_invoices(previous, finalize=True, now=now) if now.day >= settings.POLYCHIP_INVOICE_FINALIZE_DAY else []
    views += run_invoices(current, finalize=False, now=now)
    return {
        "finalized": sum(view.status == InvoiceStatus.FINALIZED for view in views),
        "drafted": sum(view.status == InvoiceStatus.DRAFT for view in views),
    }


def _invoice_view(invoice: Invoice, *, with_lines: bool) -> InvoiceView:
    lines: tuple[InvoiceLineView, ...] = ()
    flavors: tuple[tuple[str, Decimal], ...] = ()
    if with_lines:
        rows = list(invoice.lines.order_by("position"))
        lines = tuple(
            InvoiceLineView(
                position=row.position,
                kind=row.kind,
                job_id=row.job_id,
                flavor=row.flavor,
                usage_period=row.usage_period,
                unit=row.unit,
                unit_price=row.unit_price,
                quantity_ms=row.quantity_ms,
                hours=rating.hours(row.quantity_ms, row.unit),
                amount=row.amount,
            )
            for row in rows
        )
        sums: dict[str, Decimal] = defaultdict(lambda: Decimal("0.00"))
        for row in rows:
            sums[row.flavor] += row.amount
        flavors = tuple(sorted(sums.items()))
    return InvoiceView(
        id=invoice.pk,
        number=invoice.number,
        tenant_id=invoice.tenant_id,
        tenant_slug=invoice.tenant.slug,
        period=invoice.period,
        status=invoice.status,
        currency=invoice.currency,
        price_book=invoice.price_book,
        total=invoice.total,
        created_at=invoice.created_at,
        finalized_at=invoice.finalized_at,
        lines=lines,
        by_flavor=flavors,
    )


def list_invoices(tenant_id: int, *, after: int | None = None, limit: int | None = None) -> list[InvoiceView]:
    """The tenant's invoices, newest first (by id), after the invoice ``after`` when given, at most ``limit``."""
    invoices = Invoice.objects.filter(tenant_id=tenant_id).select_related("tenant").order_by("-pk")
    if after is not None:
        invoices = invoices.filter(pk__lt=after)
    if limit is not None:
        invoices = invoices[:limit]
    return [_invoice_view(invoice, with_lines=False) for invoice in invoices]


def invoice_count(tenant_id: int) -> int:
    return Invoice.objects.filter(tenant_id=tenant_id).count()


def get_invoice(*, tenant_id: int, invoice_id: int) -> InvoiceView:
    invoice = Invoice.objects.filter(tenant_id=tenant_id, pk=invoice_id).select_related("tenant").first()
    if invoice is None:
        raise InvoiceNotFound(f"no invoice {invoice_id}")
    return _invoice_view(invoice, with_lines=True)


# --- usage out -------------------------------------------------------------------------------------


def usage_by_flavor(*, tenant_id: int, job_id: int | None = None) -> list[FlavorUsage]:
    records = UsageRecord.objects.filter(tenant_id=tenant_id)
    if job_id is not None:
        records = records.filter(job_id=job_id)
    rows = records.values("flavor").annotate(devices=Count("device_id", distinct=True), total=Sum("duration_ms"))
    return [
        FlavorUsage(flavor=row["flavor"], devices=row["devices"], duration_ms=int(row["total"] or 0))
        for row in rows.order_by("flavor")
    ]


def hourly_cost(*, tenant_id: int, devices: Mapping[str, tuple[int, int]], now: datetime | None = None) -> Decimal:
    """What an hour of some devices would cost at the tenant's prices in effect now: ``devices`` maps a
    flavor to (how many, milli-NAU per device for the job's class). A flavor without a price raises
    ``RatingError``, as billing it would."""
    book = price_book_for(tenant_id)
    start_ms = rating.epoch_ms(now or timezone.now())
    hour = [
        rating.RatedUsage(0, flavor, rating.period_of(start_ms), start_ms, 3_600_000, nau_milli, price_at=start_ms)
        for flavor, (count, nau_milli) in sorted(devices.items())
        for _ in range(count)
    ]
    return rating.estimate(hour, book)


def usage_cost(*, tenant_id: int, job_id: int) -> dict[str, Decimal]:
    """What the job's recorded usage costs per flavor at the tenant's prices, each flavor rounded once
    (an estimate for the job's page: the invoice rounds per line)."""
    book = price_book_for(tenant_id)
    by_flavor: dict[str, list[rating.RatedUsage]] = defaultdict(list)
    records = UsageRecord.objects.filter(tenant_id=tenant_id, job_id=job_id).values_list(
        "flavor", "started_at", "duration_ms", "nau_milli"
    )
    for flavor, started_at, ms, nau_milli in records:
        start_ms = rating.epoch_ms(started_at)
        by_flavor[flavor].append(rating.RatedUsage(job_id, flavor, rating.period_of(start_ms), start_ms, ms, nau_milli))
    return {flavor: rating.estimate(usages, book) for flavor, usages in sorted(by_flavor.items())}


def ledger_entries(*, tenant_id: int, period: date | None = None) -> Iterable[LedgerEntryView]:
    """The tenant's ledger, oldest first by when the usage started, streamed (for the CSV export)."""
    return _entry_views(_ledger(tenant_id, period).order_by("start_ms", "key"))


def ledger_page(*, tenant_id: int, period: date | None, after: int | None, limit: int) -> list[LedgerEntryView]:
    """A page of the ledger in the order it was posted (by id): later postings, even of earlier usage,
    come after every page already read, so paging through never skips or repeats an entry."""
    entries = _ledger(tenant_id, period)
    if after is not None:
        entries = entries.filter(pk__gt=after)
    return list(_entry_views(entries.order_by("pk")[:limit]))


def ledger_entry_count(*, tenant_id: int, period: date | None) -> int:
    return _ledger(tenant_id, period).count()


def _ledger(tenant_id: int, period: date | None) -> QuerySet[LedgerEntry]:
    entries = LedgerEntry.objects.filter(tenant_id=tenant_id)
    return entries.filter(period=period) if period is not None else entries


def _entry_views(entries: QuerySet[LedgerEntry]) -> Iterator[LedgerEntryView]:
    rows = entries.values_list(
        "pk",
        "key",
        "job_id",
        "record__device_id",
        "flavor",
        "period",
        "start_ms",
        "duration_ms",
        "nau_milli",
        "invoice__period",
        "invoice__tenant_id",
    )
    for (
        pk,
        key,
        job_id,
        device_id,
        flavor,
        period_,
        start_ms,
        ms,
        nau_milli,
        invoice_period,
        invoice_tenant,
    ) in rows.iterator(chunk_size=2000):
        started = rating.from_epoch_ms(start_ms)
        yield LedgerEntryView(
            id=pk,
            key=key,
            job_id=job_id,
            device_id=device_id,
            flavor=flavor,
            period=period_,
            started_at=started,
            ended_at=rating.from_epoch_ms(start_ms + ms),
            duration_ms=ms,
            nau_milli=nau_milli,
            invoice_number=invoice_number(invoice_period, invoice_tenant) if invoice_period else None,
        )


# --- budgets ---------------------------------------------------------------------------------------


def _period_usage(
    tenant_id: int,
    period: date,
    book: rating.PriceBook,
    open_usage: Iterable[OpenUsage],
    now: datetime,
    *,
    when: bool = False,
) -> list[rating.RatedUsage]:
    """What the tenant used in the period so far: the ledger, the outbox not yet posted, open allocations.
    ``when``: each entry with its own start and length (not summed per flavor where prices hold still)."""
    start_ms, end_ms = rating.period_bounds_ms(period)
    entries = LedgerEntry.objects.filter(tenant_id=tenant_id, period=period)
    if not when and book.constant_between(start_ms, end_ms):
        # One price per flavor all month: sums per flavor and NAU rate price the same as each entry.
        usages = [
            rating.RatedUsage(
                0, row["flavor"], period, start_ms, int(row["total"]), row["nau_milli"], price_at=start_ms
            )
            for row in entries.values("flavor", "nau_milli").annotate(total=Sum("duration_ms"))
        ]
    else:
        usages = [
            rating.RatedUsage(job_id, flavor, period, entry_start, ms, nau)
            for job_id, flavor, entry_start, ms, nau in entries.values_list(
                "job_id", "flavor", "start_ms", "duration_ms", "nau_milli"
            )
        ]
    pending = UsageRecord.objects.filter(tenant_id=tenant_id, outbox__isnull=False).values_list(
        "job_id", "flavor", "started_at", "duration_ms", "nau_milli"
    )
    spans = [(job_id, flavor, rating.epoch_ms(started), ms, nau) for job_id, flavor, started, ms, nau in pending]
    now_ms = rating.epoch_ms(now)
    spans += [
        (u.job_id, u.flavor, rating.epoch_ms(u.started_at), now_ms - rating.epoch_ms(u.started_at), u.nau_milli)
        for u in open_usage
        if u.tenant_id == tenant_id
    ]
    for job_id, flavor, begin, ms, nau in spans:
        clipped_start, clipped_end = max(begin, start_ms), min(begin + ms, end_ms)
        if clipped_end > clipped_start:
            usages.append(rating.RatedUsage(job_id, flavor, period, clipped_start, clipped_end - clipped_start, nau))
    return usages


def spend_by_flavor(
    tenant_id: int, open_usage: Iterable[OpenUsage] = (), *, now: datetime | None = None
) -> list[tuple[str, Decimal]]:
    """This month's spend per flavor, highest first: what ``budget_status`` prices, split by flavor
    and each flavor rounded once (so flavors may differ from the whole, rounded once, by a cent)."""
    now = now or timezone.now()
    period = rating.period_of(rating.epoch_ms(now))
    book = price_book_for(tenant_id, period)
    by_flavor: dict[str, list[rating.RatedUsage]] = defaultdict(list)
    for usage in _period_usage(tenant_id, period, book, open_usage, now):
        by_flavor[usage.flavor].append(usage)
    spends = [(flavor, rating.estimate(group, book)) for flavor, group in by_flavor.items()]
    return sorted(spends, key=lambda item: (-item[1], item[0]))


def spend_by_day(
    tenant_id: int, open_usage: Iterable[OpenUsage] = (), *, now: datetime | None = None
) -> list[tuple[date, Decimal]]:
    """This month's spend per UTC day, from its first day to today (0 for a day without usage): what
    ``budget_status`` prices, each stretch of usage on the day it ran and each day rounded once (so the
    days may differ from the month's whole by a cent or so)."""
    now = now or timezone.now()
    period = rating.period_of(rating.epoch_ms(now))
    book = price_book_for(tenant_id, period)
    by_day: dict[date, list[rating.RatedUsage]] = defaultdict(list)
    for usage in _period_usage(tenant_id, period, book, open_usage, now, when=True):
        for day, start_ms, ms in rating.split_by_day(usage.start_ms, usage.duration_ms):
            by_day[day].append(dataclasses.replace(usage, start_ms=start_ms, duration_ms=ms))
    today = rating.day_of(rating.epoch_ms(now))
    days = [period + timedelta(days=n) for n in range((today - period).days + 1)]
    return [(day, rating.estimate(by_day.get(day, ()), book)) for day in days]


def budget_status(tenant_id: int, open_usage: Iterable[OpenUsage] = (), *, now: datetime | None = None) -> BudgetStatus:
    """The tenant's spend this month (rounded once, as a whole) against its budgets."""
    now = now or timezone.now()
    period = rating.period_of(rating.epoch_ms(now))
    account = BillingAccount.objects.filter(tenant_id=tenant_id).first()
    book = price_book_for(tenant_id, period)
    spend = rating.estimate(_period_usage(tenant_id, period, book, open_usage, now), book)
    alerts = BudgetAlert.objects.filter(tenant_id=tenant_id, period=period).values_list("level", flat=True)
    return BudgetStatus(
        tenant_id=tenant_id,
        period=period,
        currency=book.currency,
        spend=spend,
        soft_budget=account.soft_budget if account else None,
        hard_budget=account.hard_budget if account else None,
        alerts=tuple(sorted(alerts)),
    )


def tenants_with_budgets(tenant_ids: Iterable[int] | None = None) -> list[int]:
    accounts = BillingAccount.objects.filter(Q(soft_budget__isnull=False) | Q(hard_budget__isnull=False))
    if tenant_ids is not None:
        accounts = accounts.filter(tenant_id__in=list(tenant_ids))
    return list(accounts.values_list("tenant_id", flat=True))


def check_budgets_now(*, now: datetime | None = None) -> dict[int, BudgetStatus]:
    """Every budgeted tenant's spend this month, the devices its jobs hold now included (alerts as
    they cross); what the beat task runs."""
    budgeted = tenants_with_budgets()
    now = now or timezone.now()
    statuses = check_budgets(budgeted, open_usage(budgeted), now=now) if budgeted else {}
    for status in statuses.values():
        BillingAccount.objects.filter(tenant_id=status.tenant_id).update(
            checked_spend=status.spend, checked_period=status.period, checked_currency=status.currency, checked_at=now
        )
    return statuses


def checked_budgets(*, now: datetime | None = None) -> list[BudgetStatus]:
    """Each budgeted tenant's spend this month as the last budget check rated it (/metrics), without
    the alerts; a tenant not yet checked this month is left out."""
    period = rating.period_of(rating.epoch_ms(now or timezone.now()))
    accounts = BillingAccount.objects.filter(checked_period=period, checked_spend__isnull=False).order_by("tenant_id")
    return [
        BudgetStatus(
            tenant_id=account.tenant_id,
            period=period,
            currency=account.checked_currency,
            spend=account.checked_spend or Decimal(0),
            soft_budget=account.soft_budget,
            hard_budget=account.hard_budget,
        )
        for account in accounts
    ]


def rate_budgets(
    tenant_ids: Iterable[int] | None, open_usage: Sequence[OpenUsage], *, now: datetime | None = None
) -> dict[int, BudgetStatus]:
    """Each budgeted tenant's status, rated now and stored nowhere: what a preview or the advisor asks,
    which must leave no alert behind (a spec that is only asked about spends nothing)."""
    now = now or timezone.now()
    statuses: dict[int, BudgetStatus] = {}
    for tenant_id in tenants_with_budgets(tenant_ids):
        try:
            statuses[tenant_id] = budget_status(tenant_id, open_usage, now=now)
        except rating.RatingError:
            # A price missing from the tenant's book is the operator's to fix; it must not stop
            # admission for every tenant. The tenant is not held back meanwhile.
            log.exception(
                "budget of tenant %s cannot be priced; not enforced until its price book covers it", tenant_id
            )
    return statuses


def check_budgets(
    tenant_ids: Iterable[int] | None, open_usage: Sequence[OpenUsage], *, now: datetime | None = None
) -> dict[int, BudgetStatus]:
    """Each budgeted tenant's status, raising an alert the first time a budget is crossed in a period."""
    statuses = rate_budgets(tenant_ids, open_usage, now=now)
    for status in statuses.values():
        for level, budget, reached in (
            (BudgetAlert.Level.SOFT, status.soft_budget, status.soft_reached),
            (BudgetAlert.Level.HARD, status.hard_budget, status.hard_reached),
        ):
            if reached and budget is not None and level not in status.alerts:
                _alert(status, level, budget)
    return statuses


def _alert(status: BudgetStatus, level: str, budget: Decimal) -> None:
    try:
        with transaction.atomic():
            BudgetAlert.objects.create(
                tenant_id=status.tenant_id, period=status.period, level=level, spend=status.spend, budget=budget
            )
    except IntegrityError:
        return  # another worker raised it first
    log.warning(
        "tenant %s crossed its %s budget for %s: %s %s of %s",
        status.tenant_id,
        level,
        f"{status.period:%Y-%m}",
        status.currency,
        status.spend,
        budget,
    )


def hard_budget_reason(status: BudgetStatus) -> str:
    next_month = rating.next_period(status.period)
    return (
        f"hard budget reached: {status.currency} {status.spend} spent of {status.hard_budget} in "
        f"{status.period:%Y-%m}; raise the budget (billing settings) or wait until {next_month.isoformat()}"
    )


def set_budgets(tenant_id: int, *, soft: Decimal | None, hard: Decimal | None) -> BudgetStatus:
    for name, value in (("soft_budget", soft), ("hard_budget", hard)):
        if value is not None and (not value.is_finite() or value < 0 or value != value.quantize(Decimal("0.01"))):
            raise BillingInvalid(f"{name} must be a non-negative amount with at most 2 decimals", field=name)
    BillingAccount.objects.update_or_create(tenant_id=tenant_id, defaults={"soft_budget": soft, "hard_budget": hard})
    return budget_status(tenant_id)


# --- reconciliation --------------------------------------------------------------------------------


def reconcile(allocated: Mapping[tuple[int, str], int]) -> Reconciliation:
    """Compare what allocations held (per tenant and flavor, from the caller) with usage records and the
    ledger. Every (tenant, flavor) seen anywhere gets a row; rows that disagree are listed."""
    recorded = _sums(UsageRecord.objects.all(), "duration_ms")
    ledger = _sums(LedgerEntry.objects.all(), "duration_ms")
    pending = _sums(UsageRecord.objects.filter(outbox__isnull=False), "duration_ms")
    keys = sorted(set(allocated) | set(recorded) | set(ledger))
    slugs = tenants.tenant_slugs({t for t, _ in keys})
    rows = tuple(
        ReconciliationRow(
            tenant_id=tenant_id,
            tenant_slug=slugs.get(tenant_id, str(tenant_id)),
            flavor=flavor,
            allocated_ms=allocated.get((tenant_id, flavor), 0),
            recorded_ms=recorded.get((tenant_id, flavor), 0),
            ledger_ms=ledger.get((tenant_id, flavor), 0),
            pending_ms=pending.get((tenant_id, flavor), 0),
        )
        for tenant_id, flavor in keys
    )
    differences = tuple(row for row in rows if row.difference_ms != 0 or row.recorded_ms != row.allocated_ms)
    return Reconciliation(rows=rows, differences=differences)


def _sums(queryset: Any, column: str) -> dict[tuple[int, str], int]:
    return {
        (row["tenant_id"], row["flavor"]): int(row["total"] or 0)
        for row in queryset.values("tenant_id", "flavor").annotate(total=Sum(column))
    }
