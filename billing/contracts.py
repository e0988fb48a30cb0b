"""What the billing app takes in and gives out; other apps import these and ``billing.services`` only."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal


@dataclass(frozen=True)
class UsageInterval:
    """One device held by one job from ``started_at`` to ``ended_at`` (UTC).

    ``nau_milli`` is the job's throughput on the device in thousandths of a normalized accelerator
    unit (1000: one device of the reference flavor), for price books that charge per NAU-hour.
    """

    key: str
    tenant_id: int
    job_id: int
    device_id: str
    flavor: str
    started_at: datetime
    ended_at: datetime
    nau_milli: int = 1000
    # Non-empty: the platform or a device ended the attempt this usage belongs to; it is metered as
    # always and credited on the invoice, as a line of its own, with this reason.
    credit_reason: str = ""


@dataclass(frozen=True)
class OpenUsage:
    """A device a job holds now: it costs money already, though no usage record exists yet."""

    tenant_id: int
    job_id: int
    flavor: str
    started_at: datetime
    nau_milli: int = 1000


@dataclass(frozen=True)
class IngestResult:
    created: int
    duplicates: int  # the same key with the same content: a replay, ignored
    conflicts: tuple[str, ...] = ()  # the same key with different content: refused, listed by key


@dataclass(frozen=True)
class FlavorUsage:
    flavor: str
    devices: int
    duration_ms: int

    @property
    def device_seconds(self) -> Decimal:
        return Decimal(self.duration_ms).scaleb(-3)


@dataclass(frozen=True)
class InvoiceLineView:
    position: int
    kind: str
    job_id: int
    flavor: str
    usage_period: date
    unit: str
    unit_price: Decimal
    quantity_ms: int
    hours: Decimal
    amount: Decimal


@dataclass(frozen=True)
class InvoiceView:
    id: int
    number: str
    tenant_id: int
    tenant_slug: str
    period: date
    status: str
    currency: str
    price_book: str
    total: Decimal
    created_at: datetime
    finalized_at: datetime | None
    lines: tuple[InvoiceLineView, ...] = ()
    by_flavor: tuple[tuple[str, Decimal], ...] = ()


@dataclass(frozen=True)
class LedgerEntryView:
    id: int  # the posting's id: the order pages of the ledger come in
    key: str
    job_id: int
    device_id: str
    flavor: str
    period: date
    started_at: datetime
    ended_at: datetime
    duration_ms: int
    nau_milli: int
    invoice_number: str | None


@dataclass(frozen=True)
class BudgetStatus:
    tenant_id: int
    period: date
    currency: str
    spend: Decimal
    soft_budget: Decimal | None
    hard_budget: Decimal | None
    alerts: tuple[str, ...] = ()  # levels crossed this period

    @property
    def hard_reached(self) -> bool:
        return self.hard_budget is not None and self.spend >= self.hard_budget

    @property
    def soft_reached(self) -> bool:
        return self.soft_budget is not None and self.spend >= self.soft_budget


@dataclass(frozen=True)
class ReconciliationRow:
    tenant_id: int
    tenant_slug: str
    flavor: str
    allocated_ms: int  # what the allocations held, per the caller
    recorded_ms: int  # usage records
    ledger_ms: int  # ledger entries
    pending_ms: int  # usage records still in the outbox

    @property
    def difference_ms(self) -> int:
        return self.ledger_ms + self.pending_ms - self.allocated_ms


@dataclass(frozen=True)
class Reconciliation:
    rows: tuple[ReconciliationRow, ...]
    differences: tuple[ReconciliationRow, ...] = field(default=())

    @property
    def balanced(self) -> bool:
        return not self.differences


@dataclass(frozen=True)
class PriceView:
    resource: str  # a flavor (per device-hour) or "nau" (per NAU-hour)
    per_hour: Decimal
    effective_from: date  # from 00:00 UTC of this day


@dataclass(frozen=True)
class PriceBookView:
    id: int
    name: str
    currency: str
    is_default: bool
    description: str
    prices: tuple[PriceView, ...]  # the whole schedule, by resource, oldest first
    tenants: tuple[str, ...]  # the slugs of the tenants it bills this period (not listed for the default book)
    next_tenants: tuple[str, ...] = ()  # those it bills from ``next_from`` on, by a change already made
    next_from: date | None = None
