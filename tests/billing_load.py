"""Billing under load: many clients sending usage at once, relays running meanwhile, invoice runs racing.

Shared by tests/integration/test_billing_concurrency.py (which asserts) and bench/billing.py (which
prints figures). Everything here goes through ``billing.services``; the ground truth is computed from
the events alone with ``billing.rating``, never read back from the database.

Each client is a thread with its own database connection, closed when the thread ends. Call these
from a process where Django is set up and the database is reachable from any thread (in pytest, a
``django_db(transaction=True)`` test: a plain ``db`` test's rows are invisible to other connections).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any, NamedTuple

from billing import rating
from billing.contracts import UsageInterval
from tests.threads import at_once

# --- the world: tenants on one price book ---------------------------------------------------------

BOOK_NAME = "load"
# Prices change in the middle of the months the load covers, and one flavor is priced per NAU-hour only.
PRICES: tuple[rating.PriceChange, ...] = (
    rating.PriceChange(rating.NAU, date(2026, 11, 1), Decimal("1.999999999999")),
    rating.PriceChange(rating.NAU, date(2026, 12, 15), Decimal("2.200000000003")),
    rating.PriceChange("a100-sxm", date(2026, 11, 1), Decimal("2.100000000000")),
    rating.PriceChange("a100-sxm", date(2027, 1, 17), Decimal("2.345678901234")),
    rating.PriceChange("h100-sxm", date(2027, 1, 10), Decimal("4.250000000001")),  # per NAU before that
    rating.PriceChange("tpu-v4", date(2026, 11, 1), Decimal("18.000000000000")),  # 1 s costs half a cent
)
FLAVORS = ("a100-sxm", "h100-sxm", "mi300x", "tpu-v4")  # mi300x: per NAU-hour only
PERIODS = (date(2026, 12, 1), date(2027, 1, 1))
WINDOW = (datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 28, tzinfo=UTC))  # starts; every usage ends by Jan 31
FIRST_PASS_AT = datetime(2027, 2, 1, 6, tzinfo=UTC)  # December's usage may come until Feb 5 (35 days)
REPLAYS_AT = datetime(2027, 2, 4, 18, tzinfo=UTC)  # "days later", still inside the window
FINALIZE_AT = datetime(2027, 2, 5, tzinfo=UTC)


def price_book() -> rating.PriceBook:
    return rating.PriceBook(BOOK_NAME, PRICES)


def setup_tenants(count: int, *, prefix: str = "load") -> list[int]:
    """``count`` tenants billed on the load price book (created once; found again after that)."""
    from billing.models import BillingAccount, Price, PriceBook
    from tenants.models import Tenant

    book, created = PriceBook.objects.get_or_create(name=BOOK_NAME, defaults={"description": "load tests"})
    if created:
        Price.objects.bulk_create(
            Price(book=book, resource=change.resource, per_hour=change.per_hour, effective_from=change.effective_from)
            for change in PRICES
        )
    ids = []
    for index in range(count):
        tenant, _ = Tenant.objects.get_or_create(slug=f"{prefix}-{index}", defaults={"name": f"{prefix} {index}"})
        BillingAccount.objects.update_or_create(tenant=tenant, defaults={"price_book": book})
        ids.append(tenant.pk)
    return ids


# --- events ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadPlan:
    unique: tuple[UsageInterval, ...]  # the ground truth: each key once
    first_pass: tuple[UsageInterval, ...]  # every unique event, plus exact duplicates, shuffled
    replays: tuple[UsageInterval, ...]  # sent again days later (exact copies)
    now: datetime = FIRST_PASS_AT
    later: datetime = REPLAYS_AT

    @property
    def sent(self) -> int:
        return len(self.first_pass) + len(self.replays)


def make_events(
    n: int,
    seed: int,
    tenant_ids: Sequence[int],
    *,
    duplicates: float = 0.10,
    replays: float = 0.05,
    jobs_per_tenant: int = 20,
    key_prefix: str = "load",
) -> LoadPlan:
    """``n`` events to send in all: ``duplicates`` of them exact copies sent in the first pass, ``replays``
    of them copies sent days later, the rest unique. Times cross month boundaries and price changes, with
    microseconds below the millisecond; some usages last 0 ms."""
    rng = random.Random(seed)
    dup_count, replay_count = round(n * duplicates), round(n * replays)
    unique_count = n - dup_count - replay_count
    if unique_count < 1:
        raise ValueError("make_events: duplicates and replays leave no unique event")
    lo_us = (WINDOW[0] - _EPOCH) // timedelta(microseconds=1)
    hi_us = (WINDOW[1] - _EPOCH) // timedelta(microseconds=1)
    # Starts cluster around the instants where rating cuts: month boundaries and price changes.
    hot = [(datetime(2027, 1, 1, tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1)] + [
        (datetime.combine(change.effective_from, datetime.min.time(), UTC) - _EPOCH) // timedelta(microseconds=1)
        for change in PRICES
        if WINDOW[0].date() < change.effective_from < WINDOW[1].date()
    ]
    unique: list[UsageInterval] = []
    for index in range(unique_count):
        tenant_id = rng.choice(tenant_ids)
        if rng.random() < 0.3:
            start_us = rng.choice(hot) + rng.randrange(-6 * 3_600_000_000, 6 * 3_600_000_000)
        else:
            start_us = rng.randrange(lo_us, hi_us)
        shape = rng.random()
        if shape < 0.03:
            held_us = rng.randrange(0, 1_000)  # 0 ms (or 1, when it crosses a millisecond)
        elif shape < 0.5:
            held_us = rng.randrange(1_000, 3_600_000_000)
        else:
            held_us = rng.randrange(3_600_000_000, 3 * 86_400_000_000)
        started = _EPOCH + timedelta(microseconds=start_us)
        unique.append(
            UsageInterval(
                key=f"{key_prefix}:{seed}:{index}",
                tenant_id=tenant_id,
                job_id=rng.randrange(1, jobs_per_tenant + 1),
                device_id=f"dev-{rng.randrange(64)}",
                flavor=rng.choice(FLAVORS),
                started_at=started,
                ended_at=started + timedelta(microseconds=held_us),
                nau_milli=rng.choice((0, 1, 500, 1_000, 1_000, 1_333, 2_750)),
            )
        )
    first = unique + [rng.choice(unique) for _ in range(dup_count)]
    rng.shuffle(first)
    later = [rng.choice(unique) for _ in range(replay_count)]
    return LoadPlan(unique=tuple(unique), first_pass=tuple(first), replays=tuple(later))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# --- sending --------------------------------------------------------------------------------------


@dataclass
class SendStats:
    events: int = 0
    batches: int = 0
    created: int = 0
    duplicates: int = 0
    conflicts: int = 0
    relayed: int = 0  # outbox rows the concurrent relays posted
    clients: int = 0
    relayers: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0


def _in_thread(work: Callable[[], Any]) -> Any:
    """Run ``work`` on this thread's own connection, and close it after."""
    from django.db import connection

    try:
        return work()
    finally:
        connection.close()


def send_concurrently(
    events: Sequence[UsageInterval],
    *,
    clients: int = 32,
    batch: int = 500,
    now: datetime | None = None,
    relayers: int = 4,
    relay_batch: int = 500,
    seed: int = 0,
) -> SendStats:
    """Send ``events`` from ``clients`` threads in batches of ``batch`` through ``ingest_usage`` (each
    client takes every ``clients``-th batch), while ``relayers`` more threads keep posting the outbox.
    Returns the summed ingest results; a client's exception is recorded in ``errors`` and ends it."""
    from billing import services

    batches = [list(events[i : i + batch]) for i in range(0, len(events), batch)]
    random.Random(seed).shuffle(batches)
    stats = SendStats(events=len(events), batches=len(batches), clients=clients, relayers=relayers)
    lock = threading.Lock()
    start = threading.Barrier(clients + relayers)
    ingesting = threading.Event()
    ingesting.set()

    def client(mine: list[list[UsageInterval]]) -> None:
        start.wait()
        for chunk in mine:
            try:
                result = services.ingest_usage(chunk, now=now)
            except Exception as exc:  # recorded; the test fails on any
                with lock:
                    stats.errors.append(f"ingest: {type(exc).__name__}: {exc}")
                return
            with lock:
                stats.created += result.created
                stats.duplicates += result.duplicates
                stats.conflicts += len(result.conflicts)

    def relay() -> None:
        start.wait()
        posted = 0
        try:
            while True:
                count = services.post_outbox_batch(relay_batch)
                posted += count
                if count == 0:
                    if not ingesting.is_set():
                        break
                    time.sleep(0.01)
        except Exception as exc:
            with lock:
                stats.errors.append(f"relay: {type(exc).__name__}: {exc}")
        with lock:
            stats.relayed += posted

    senders = [
        threading.Thread(target=_in_thread, args=(lambda mine=batches[i::clients]: client(mine),), name=f"client-{i}")
        for i in range(clients)
    ]
    relays = [threading.Thread(target=_in_thread, args=(relay,), name=f"relay-{i}") for i in range(relayers)]
    began = time.perf_counter()
    for thread in senders + relays:
        thread.start()
    for thread in senders:
        thread.join()
    stats.seconds = time.perf_counter() - began
    ingesting.clear()
    for thread in relays:
        thread.join()
    return stats


def send_plan(plan: LoadPlan, *, clients: int = 32, batch: int = 500, relayers: int = 4) -> tuple[SendStats, SendStats]:
    """The first pass (with its duplicates) at ``plan.now``, then the replays at ``plan.later``, each
    with relays running concurrently."""
    first = send_concurrently(plan.first_pass, clients=clients, batch=batch, now=plan.now, relayers=relayers, seed=1)
    later = send_concurrently(plan.replays, clients=clients, batch=batch, now=plan.later, relayers=relayers, seed=2)
    return first, later


# --- the ground truth, from the events alone -----------------------------------------------------


@dataclass(frozen=True)
class GroundTruth:
    records: int
    ms: dict[tuple[int, str], int]  # per (tenant, flavor): device-milliseconds
    entries: dict[tuple[int, str], int]  # per (tenant, flavor): ledger entries (one per record and month)
    keys: dict[str, int]  # ledger key -> its milliseconds
    invoices: dict[tuple[int, date], rating.RatedInvoice]  # per (tenant, period), rated at once


def ground_truth(unique: Iterable[UsageInterval], book: rating.PriceBook | None = None) -> GroundTruth:
    """What the ledger and the invoices must hold for these events, each key counted once (a repeated key
    must carry the same figures), computed with billing.rating alone."""
    book = book or price_book()
    seen: dict[str, UsageInterval] = {}
    for event in unique:
        if seen.setdefault(event.key, event) != event:
            raise ValueError(f"ground_truth: {event.key} appears with different figures")
    ms: Counter[tuple[int, str]] = Counter()
    entries: Counter[tuple[int, str]] = Counter()
    keys: dict[str, int] = {}
    usages: dict[tuple[int, date], list[rating.RatedUsage]] = defaultdict(list)
    for event in seen.values():
        start = rating.epoch_ms(event.started_at)
        held = rating.epoch_ms(event.ended_at) - start
        ms[event.tenant_id, event.flavor] += held
        for period, piece_start, piece_ms in rating.split_by_period(start, held):
            entries[event.tenant_id, event.flavor] += 1
            keys[f"{event.key}@{period:%Y-%m}"] = piece_ms
            usages[event.tenant_id, period].append(
                rating.RatedUsage(event.job_id, event.flavor, period, piece_start, piece_ms, event.nau_milli)
            )
    invoices = {(tenant, period): rating.rate(rows, book, period) for (tenant, period), rows in usages.items()}
    return GroundTruth(len(seen), dict(ms), dict(entries), keys, invoices)


@dataclass(frozen=True)
class LedgerState:
    records: int
    outbox: int
    ms: dict[tuple[int, str], int]
    entries: dict[tuple[int, str], int]
    keys: dict[str, int]


def ledger_state(tenant_ids: Sequence[int]) -> LedgerState:
    from django.db.models import Count, Sum

    from billing.models import LedgerEntry, UsageOutbox, UsageRecord

    ledger = LedgerEntry.objects.filter(tenant_id__in=list(tenant_ids))
    rows = ledger.values("tenant_id", "flavor").annotate(ms=Sum("duration_ms"), n=Count("id"))
    return LedgerState(
        records=UsageRecord.objects.filter(tenant_id__in=list(tenant_ids)).count(),
        outbox=UsageOutbox.objects.filter(record__tenant_id__in=list(tenant_ids)).count(),
        ms={(row["tenant_id"], row["flavor"]): int(row["ms"]) for row in rows},
        entries={(row["tenant_id"], row["flavor"]): row["n"] for row in rows},
        keys=dict(ledger.values_list("key", "duration_ms").iterator(chunk_size=20_000)),
    )


def finalize_all(tenant_ids: Sequence[int], *, now: datetime = FINALIZE_AT) -> dict[tuple[int, date], Any]:
    """Finalize every tenant's invoices period by period (the outbox is relayed first)."""
    from billing import services

    services.relay_usage()
    return {
        (tenant_id, period): services.finalize_invoice(tenant_id, period, now=now)
        for tenant_id in tenant_ids
        for period in PERIODS
    }


# --- invoice runs racing --------------------------------------------------------------------------


class InvoiceRuns(NamedTuple):
    ids_seen: set[int]
    invoices_created: int


def concurrent_invoice_runs(
    tenant_id: int,
    period: date,
    runs: int = 20,
    *,
    now: datetime | None = None,
    seed: int = 0,
) -> InvoiceRuns:
    """``runs`` threads, released together by a barrier, each drafting or finalizing the tenant's invoice
    for ``period`` (a random mix, at least one of each). Returns the invoice ids the runs answered and
    how many invoices the tenant has for the period afterwards. Raises the first run's error, if any."""
    from billing import services
    from billing.models import Invoice

    now = now or datetime.combine(rating.next_period(period), datetime.min.time(), UTC) + timedelta(days=4)
    rng = random.Random(seed)
    finalizing = [rng.random() < 0.5 for _ in range(runs)]
    finalizing[0], finalizing[-1] = True, False
    rng.shuffle(finalizing)

    def run(index: int) -> int:
        if finalizing[index]:
            return services.finalize_invoice(tenant_id, period, now=now).id
        return services.draft_invoice(tenant_id, period).id

    seen = at_once(runs, run)
    return InvoiceRuns(set(seen), Invoice.objects.filter(tenant_id=tenant_id, period=period).count())
