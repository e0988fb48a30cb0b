"""Billing's contracts as JSON and CSV: money and prices as decimal strings, never floats.

Times are ISO 8601 in UTC to the millisecond (usage is counted in whole milliseconds, so a finer
time would suggest a precision that is not there, and a coarser one would hide some).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from billing import services
from billing.contracts import BudgetStatus, InvoiceLineView, InvoiceView, LedgerEntryView

CENT = Decimal("0.01")

USAGE_COLUMNS = (
    "key",
    "job_id",
    "device_id",
    "flavor",
    "period",
    "started_at",
    "ended_at",
    "duration_ms",
    "nau_milli",
    "invoice",
)
INVOICE_COLUMNS = ("number", "period", "status", "currency", "price_book", "total", "created_at", "finalized_at")
LINE_COLUMNS = (
    "invoice",
    "position",
    "kind",
    "job_id",
    "flavor",
    "usage_period",
    "unit",
    "unit_price",
    "quantity_ms",
    "hours",
    "amount",
)


def utc_text(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def period_text(period: date) -> str:
    return f"{period:%Y-%m}"


def money(value: Decimal) -> str:
    # Fixed-point text: str() of a Decimal may use an exponent (0E-2), which spreadsheets misread.
    return f"{value.quantize(CENT):f}"


def money_or_none(value: Decimal | None) -> str | None:
    return money(value) if value is not None else None


def decimal_text(value: Decimal) -> str:
    return f"{value:f}"


# --- JSON ------------------------------------------------------------------------------------------


def entry_json(entry: LedgerEntryView) -> dict[str, Any]:
    return {
        "key": entry.key,
        "job_id": entry.job_id,
        "device_id": entry.device_id,
        "flavor": entry.flavor,
        "period": period_text(entry.period),
        "started_at": utc_text(entry.started_at),
        "ended_at": utc_text(entry.ended_at),
        "duration_ms": entry.duration_ms,
        "nau_milli": entry.nau_milli,
        "invoice": entry.invoice_number,
    }


def invoice_url(invoice: InvoiceView) -> str:
    return f"/api/v1/invoices/{invoice.id}"


def invoice_json(invoice: InvoiceView) -> dict[str, Any]:
    return {
        "id": invoice.id,
        "number": invoice.number,
        "tenant": invoice.tenant_slug,
        "period": period_text(invoice.period),
        "status": invoice.status,
        "currency": invoice.currency,
        "price_book": invoice.price_book,
        "total": money(invoice.total),
        "created_at": utc_text(invoice.created_at),
        "finalized_at": utc_text(invoice.finalized_at),
        "url": invoice_url(invoice),
        "csv": f"{invoice_url(invoice)}?format=csv",
    }


def line_json(line: InvoiceLineView) -> dict[str, Any]:
    return {
        "position": line.position,
        "kind": line.kind,
        "job_id": line.job_id,
        "flavor": line.flavor,
        "usage_period": period_text(line.usage_period),
        "unit": line.unit,
        "unit_price": decimal_text(line.unit_price),
        "quantity_ms": line.quantity_ms,
        "hours": decimal_text(line.hours),
        "amount": money(line.amount),
    }


def invoice_detail_json(invoice: InvoiceView) -> dict[str, Any]:
    return {
        **invoice_json(invoice),
        "lines": [line_json(line) for line in invoice.lines],
        "by_flavor": [{"flavor": flavor, "amount": money(amount)} for flavor, amount in invoice.by_flavor],
    }


def invoice_summary_json(invoice: InvoiceView) -> dict[str, Any]:
    """An invoice as a run reports it: the invoice and how many lines it has."""
    return {**invoice_json(invoice), "lines": len(invoice.lines)}


def budget_json(status: BudgetStatus, by_flavor: Sequence[tuple[str, Decimal]] = ()) -> dict[str, Any]:
    return {
        "period": period_text(status.period),
        "currency": status.currency,
        "spend": money(status.spend),
        "soft_budget": money_or_none(status.soft_budget),
        "hard_budget": money_or_none(status.hard_budget),
        "soft_reached": status.soft_reached,
        "hard_reached": status.hard_reached,
        "alerts": list(status.alerts),
        # What a queued job of this tenant says while the hard budget holds admissions back.
        "reason": services.hard_budget_reason(status) if status.hard_reached else None,
        "by_flavor": [{"flavor": flavor, "spend": money(amount)} for flavor, amount in by_flavor],
    }


# --- CSV -------------------------------------------------------------------------------------------


class _Echo:
    """A file-like sink that hands each written row back, so a CSV streams row by row."""

    def write(self, value: str) -> str:
        return value


def _cell(value: Any) -> Any:
    # Keys and device ids may come from outside meters: a cell that a spreadsheet would run as a
    # formula is written as text instead (OWASP's CSV injection advice).
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def csv_rows(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(header)
    for row in rows:
        yield writer.writerow([_cell(value) for value in row])


def usage_rows(entries: Iterable[LedgerEntryView]) -> Iterator[Sequence[Any]]:
    for entry in entries:
        yield (
            entry.key,
            entry.job_id,
            entry.device_id,
            entry.flavor,
            period_text(entry.period),
            utc_text(entry.started_at),
            utc_text(entry.ended_at),
            entry.duration_ms,
            entry.nau_milli,
            entry.invoice_number or "",
        )


def invoice_rows(invoices: Iterable[InvoiceView]) -> Iterator[Sequence[Any]]:
    for invoice in invoices:
        yield (
            invoice.number,
            period_text(invoice.period),
            invoice.status,
            invoice.currency,
            invoice.price_book,
            money(invoice.total),
            utc_text(invoice.created_at),
            utc_text(invoice.finalized_at) or "",
        )


def line_rows(invoice: InvoiceView) -> Iterator[Sequence[Any]]:
    """One row per line, then the total (the lines' amounts add up to it exactly)."""
    for line in invoice.lines:
        yield (
            invoice.number,
            line.position,
            line.kind,
            line.job_id,
            line.flavor,
            period_text(line.usage_period),
            line.unit,
            decimal_text(line.unit_price),
            line.quantity_ms,
            decimal_text(line.hours),
            money(line.amount),
        )
    yield (
        invoice.number,
        "",
        "total",
        "",
        "",
        period_text(invoice.period),
        invoice.currency,
        "",
        "",
        "",
        money(invoice.total),
    )
