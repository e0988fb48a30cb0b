"""Billing's tables: usage records and their outbox, the ledger, price books, invoices, budgets.

Usage flows one way: a usage record and its outbox row are written in the transaction of the change
that caused them (an allocation ended, or an ingested event); the relay turns outbox rows into ledger
entries, one per record and billing period; invoices claim ledger entries when they are finalized.
Each step is keyed, so a replay of any of them changes nothing.
"""

from __future__ import annotations

from datetime import date
from typing import Any

from django.db import models
from django.db.models import F, Q


class UsageRecord(models.Model):
    # The deterministic key makes a replay a no-op, however late it comes.
    key = models.CharField(max_length=200, unique=True)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="usage_records")
    job_id = models.BigIntegerField(db_index=True)
    device_id = models.CharField(max_length=200)
    flavor = models.CharField(max_length=63)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField()
    duration_ms = models.BigIntegerField()
    # The job's throughput on this device in thousandths of a normalized accelerator unit, for price
    # books that charge per NAU-hour (1000 when unknown: one reference device).
    nau_milli = models.PositiveIntegerField(default=1000)
    recorded_at = models.DateTimeField(auto_now_add=True)

    # Non-empty: credited on the invoice (the platform or a device ended the attempt), with the reason.
    credit_reason = models.CharField(max_length=300, blank=True, default="")

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(duration_ms__gte=0), name="usage_duration_not_negative"),
            models.CheckConstraint(condition=Q(ended_at__gte=F("started_at")), name="usage_ends_after_start"),
        ]
        indexes = [models.Index(fields=["tenant", "started_at"])]

    def __str__(self) -> str:
        return f"{self.key}: {self.duration_ms} ms on {self.flavor}"


class UsageOutbox(models.Model):
    """A usage record that the relay has yet to post to the ledger; deleted in the posting transaction."""

    record = models.OneToOneField(UsageRecord, on_delete=models.CASCADE, related_name="outbox")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"outbox {self.pk} → {self.record_id}"


class PriceBook(models.Model):
    """Prices per flavor (per device-hour) and, optionally, per normalized accelerator unit (NAU-hour).

    A flavor's own price applies once it has one; before that, and for flavors without one, the NAU
    price applies, so a book with only a NAU price charges for work done rather than chip names.
    """

    name = models.SlugField(max_length=63, unique=True)
    currency = models.CharField(max_length=3, default="USD")
    is_default = models.BooleanField(default=False)
    description = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["is_default"], condition=Q(is_default=True), name="one_default_price_book")
        ]

    def __str__(self) -> str:
        return self.name


class Price(models.Model):
    book = models.ForeignKey(PriceBook, on_delete=models.CASCADE, related_name="prices")
    resource = models.CharField(max_length=63, help_text="a flavor name, or 'nau' for a price per NAU-hour")
    per_hour = models.DecimalField(max_digits=24, decimal_places=12)
    effective_from = models.DateField(help_text="takes effect at 00:00 UTC of this day")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["book", "resource", "effective_from"], name="price_one_per_day"),
            models.CheckConstraint(condition=Q(per_hour__gte=0), name="price_not_negative"),
        ]
        ordering = ["book", "resource", "effective_from"]

    def __str__(self) -> str:
        return f"{self.book}: {self.resource} {self.per_hour}/h from {self.effective_from}"


class BillingAccount(models.Model):
    """A tenant's billing settings: its price book (the default one when unset) and monthly budgets."""

    tenant = models.OneToOneField("tenants.Tenant", on_delete=models.CASCADE, related_name="billing_account")
    price_book = models.ForeignKey(PriceBook, null=True, blank=True, on_delete=models.PROTECT)
    # A change of book takes effect with a billing period, never inside one (usage already recorded
    # keeps its prices): from ``next_price_book_from`` on, ``next_price_book`` (null: the default) bills.
    next_price_book = models.ForeignKey(PriceBook, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    next_price_book_from = models.DateField(null=True, blank=True)
    # Per calendar month, in the book's currency. A soft budget alerts; a hard one stops admissions.
    soft_budget = models.DecimalField(max_digits=18, decimal_places=2, null=True, blank=True)
    hard_budget = models.DecimalField(max_digits=18, decimal_places=2, null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    # The month's spend as the budget check (beat, every 30 s) last rated it, for /metrics: a scrape reads
    # it rather than rating every tenant's month itself.
    checked_spend = models.DecimalField(max_digits=18, decimal_places=2, null=True, blank=True)
    checked_period = models.DateField(null=True, blank=True)
    checked_currency = models.CharField(max_length=3, blank=True)
    checked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(soft_budget__isnull=True) | Q(soft_budget__gte=0), name="soft_budget_not_negative"
            ),
            models.CheckConstraint(
                condition=Q(hard_budget__isnull=True) | Q(hard_budget__gte=0), name="hard_budget_not_negative"
            ),
        ]

    def __str__(self) -> str:
        return f"billing of {self.tenant}"


class BudgetAlert(models.Model):
    """A budget crossed in a period; one per tenant, period and level, so each alerts once."""

    class Level(models.TextChoices):
        SOFT = "soft"
        HARD = "hard"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="budget_alerts")
    period = models.DateField()
    level = models.CharField(max_length=8, choices=Level.choices)
    spend = models.DecimalField(max_digits=18, decimal_places=2)
    budget = models.DecimalField(max_digits=18, decimal_places=2)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "period", "level"], name="budget_alert_once_per_period")
        ]

    def __str__(self) -> str:
        return f"{self.tenant} {self.level} budget {self.budget} crossed in {self.period:%Y-%m}"


class InvoiceStatus(models.TextChoices):
    DRAFT = "draft"
    FINALIZED = "finalized"


class Invoice(models.Model):
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="invoices")
    period = models.DateField(help_text="the first day of the UTC month billed")
    status = models.CharField(max_length=12, choices=InvoiceStatus.choices, default=InvoiceStatus.DRAFT)
    currency = models.CharField(max_length=3, default="USD")
    price_book = models.CharField(max_length=63)
    total = models.DecimalField(max_digits=18, decimal_places=2, default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finalized_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "period"], name="invoice_one_per_tenant_period")]
        ordering = ["-period", "tenant_id"]

    def __str__(self) -> str:
        return f"{self.tenant} {self.period:%Y-%m} ({self.status})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        # A finalized invoice is immutable; PostgreSQL's trigger (migration 0003) enforces it for
        # every writer, this gives the ORM a clear error first.
        if self.pk and Invoice.objects.filter(pk=self.pk, status=InvoiceStatus.FINALIZED).exists():
            raise ImmutableInvoice(f"invoice {self.number} is finalized and cannot change")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        if self.status == InvoiceStatus.FINALIZED:
            raise ImmutableInvoice(f"invoice {self.number} is finalized and cannot be deleted")
        return super().delete(*args, **kwargs)

    @property
    def number(self) -> str:
        return invoice_number(self.period, self.tenant_id)


def invoice_number(period: date, tenant_id: int) -> str:
    return f"INV-{period:%Y%m}-{tenant_id:05d}"


class ImmutableInvoice(Exception):
    pass


class InvoiceLine(models.Model):
    class Kind(models.TextChoices):
        USAGE = "usage"
        ADJUSTMENT = "adjustment"  # usage of an earlier, already invoiced period that arrived late
        CREDIT = "credit"  # usage of attempts the platform or a device ended, given back (a negative amount)

    invoice = models.ForeignKey(Invoice, on_delete=models.CASCADE, related_name="lines")
    position = models.PositiveIntegerField()
    kind = models.CharField(max_length=12, choices=Kind.choices)
    job_id = models.BigIntegerField()
    flavor = models.CharField(max_length=63)
    usage_period = models.DateField()
    unit = models.CharField(max_length=16)  # device-hour or NAU-hour
    unit_price = models.DecimalField(max_digits=24, decimal_places=12)
    quantity_ms = models.BigIntegerField()  # device-ms; for NAU-hour, milli-NAU-ms
    amount = models.DecimalField(max_digits=18, decimal_places=2)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["invoice", "position"], name="invoice_line_position")]
        ordering = ["invoice", "position"]

    def __str__(self) -> str:
        return f"{self.invoice} #{self.position}: job {self.job_id} {self.flavor} {self.amount}"


class LedgerEntry(models.Model):
    """One usage record's share of one billing period: what invoices are made of.

    ``invoice`` is set once, when the invoice that bills it is finalized; an entry that arrives after
    its period was invoiced waits, unbilled, for the tenant's next invoice (an adjustment line).
    """

    key = models.CharField(max_length=220, unique=True)  # "<usage key>@<YYYY-MM>"
    record = models.ForeignKey(UsageRecord, on_delete=models.PROTECT, related_name="ledger_entries")
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="ledger_entries")
    job_id = models.BigIntegerField()
    flavor = models.CharField(max_length=63)
    period = models.DateField()
    start_ms = models.BigIntegerField()  # epoch milliseconds, UTC
    duration_ms = models.BigIntegerField()
    nau_milli = models.PositiveIntegerField(default=1000)
    invoice = models.ForeignKey(Invoice, null=True, blank=True, on_delete=models.PROTECT, related_name="entries")
    created_at = models.DateTimeField(auto_now_add=True)

    credit_reason = models.CharField(max_length=300, blank=True, default="")  # the record's

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(duration_ms__gte=0), name="ledger_duration_not_negative")]
        indexes = [
            models.Index(fields=["tenant", "period"]),
            models.Index(fields=["tenant"], condition=Q(invoice__isnull=True), name="ledger_unbilled"),
        ]

    def __str__(self) -> str:
        return self.key
