"""The billing console: price books and accounts are edited here; usage, the ledger, invoices and
alerts are read here, since they are written by the metering path and by invoice runs alone."""

from __future__ import annotations

from typing import Any, TypeVar

from django.contrib import admin, messages
from django.db.models import Model, QuerySet
from django.http import HttpRequest

from billing import rating, services
from billing.models import (
    BillingAccount,
    BudgetAlert,
    Invoice,
    InvoiceLine,
    InvoiceStatus,
    LedgerEntry,
    Price,
    PriceBook,
    UsageRecord,
)

_M = TypeVar("_M", bound=Model)


class ReadOnlyAdmin(admin.ModelAdmin[_M]):
    """Rows only the system writes: listed and viewed, never added, changed or deleted by hand."""

    # Counting a million-row ledger on every page load is slow and tells an operator nothing.
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


# --- prices and accounts ---------------------------------------------------------------------------


class PriceInline(admin.TabularInline[Price, PriceBook]):
    model = Price
    extra = 1
    fields = ("resource", "per_hour", "effective_from")
    ordering = ("resource", "effective_from")


@admin.register(PriceBook)
class PriceBookAdmin(admin.ModelAdmin[PriceBook]):
    list_display = ("name", "currency", "is_default", "description", "created_at")
    search_fields = ("name",)
    inlines = [PriceInline]


@admin.register(BillingAccount)
class BillingAccountAdmin(admin.ModelAdmin[BillingAccount]):
    list_display = ("tenant", "price_book", "soft_budget", "hard_budget", "updated_at")
    list_select_related = ("tenant", "price_book")
    search_fields = ("tenant__slug",)
    autocomplete_fields = ("price_book",)
    fields = ("tenant", "price_book", "soft_budget", "hard_budget")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return ("tenant",) if obj is not None else ()


# --- invoices --------------------------------------------------------------------------------------


class InvoiceLineInline(admin.TabularInline[InvoiceLine, Invoice]):
    model = InvoiceLine
    fields = ("position", "kind", "job_id", "flavor", "usage_period", "unit", "unit_price", "quantity_ms", "amount")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _periods(queryset: QuerySet[Invoice]) -> list[tuple[int, Any, str, str]]:
    return list(queryset.order_by("period", "tenant_id").values_list("tenant_id", "period", "status", "tenant__slug"))


@admin.action(permissions=["bill"], description="Draft invoice again (from the ledger as it stands)")
def draft_again(admin_: admin.ModelAdmin[Invoice], request: HttpRequest, queryset: QuerySet[Invoice]) -> None:
    drafted, skipped = 0, 0
    services.relay_usage()  # so that usage ingested so far is on the drafts
    for tenant_id, period, status, _ in _periods(queryset):
        if status == InvoiceStatus.FINALIZED:
            skipped += 1  # frozen: it stays as it was billed
            continue
        services.draft_invoice(tenant_id, period)
        drafted += 1
    note = f"; {skipped} finalized invoice(s) left as they are" if skipped else ""
    admin_.message_user(request, f"{drafted} invoice(s) drafted again{note}", messages.SUCCESS)


@admin.action(permissions=["bill"], description="Finalize: bill the period and freeze the invoice")
def finalize(admin_: admin.ModelAdmin[Invoice], request: HttpRequest, queryset: QuerySet[Invoice]) -> None:
    # Oldest period first: a tenant's periods must be finalized in order.
    done = 0
    services.relay_usage()
    for tenant_id, period, status, slug in _periods(queryset):
        if status == InvoiceStatus.FINALIZED:
            continue
        try:
            services.finalize_invoice(tenant_id, period)
        except (services.BillingError, rating.RatingError) as exc:
            admin_.message_user(request, f"{slug} {period:%Y-%m}: {exc}", messages.ERROR)
            continue
        done += 1
    admin_.message_user(request, f"{done} invoice(s) finalized", messages.SUCCESS)


@admin.register(Invoice)
class InvoiceAdmin(ReadOnlyAdmin[Invoice]):
    list_display = ("number", "tenant", "period", "status", "currency", "total", "lines", "finalized_at")
    list_filter = ("status", "period")
    list_select_related = ("tenant",)
    search_fields = ("tenant__slug",)
    readonly_fields = (
        "number",
        "tenant",
        "period",
        "status",
        "currency",
        "price_book",
        "total",
        "created_at",
        "updated_at",
        "finalized_at",
    )
    fields = readonly_fields
    inlines = [InvoiceLineInline]
    actions = [draft_again, finalize]

    @admin.display(description="lines")
    def lines(self, invoice: Invoice) -> int:
        return invoice.lines.count()

    def has_bill_permission(self, request: HttpRequest) -> bool:
        # Invoices are never edited by hand; running them is what changing one means here.
        return request.user.has_perm("billing.change_invoice")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A draft may go (its lines with it; no ledger entry points at a draft); a finalized one never.
        if obj is not None and obj.status == InvoiceStatus.FINALIZED:
            return False
        return request.user.has_perm("billing.delete_invoice")

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        # The bulk delete skips the model's guard; PostgreSQL would refuse it for finalized ones anyway.
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions


# --- usage, ledger and alerts ----------------------------------------------------------------------


@admin.register(UsageRecord)
class UsageRecordAdmin(ReadOnlyAdmin[UsageRecord]):
    list_display = ("key", "tenant", "job_id", "flavor", "device_id", "duration_ms", "started_at", "ended_at")
    list_filter = ("flavor", "tenant")
    list_select_related = ("tenant",)
    search_fields = ("key", "device_id")
    readonly_fields = [f.name for f in UsageRecord._meta.fields]


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnlyAdmin[LedgerEntry]):
    list_display = ("key", "tenant", "job_id", "flavor", "period", "duration_ms", "nau_milli", "invoice")
    list_filter = ("period", "flavor", "tenant")
    list_select_related = ("tenant", "invoice__tenant")
    search_fields = ("key",)
    readonly_fields = [f.name for f in LedgerEntry._meta.fields]


@admin.register(BudgetAlert)
class BudgetAlertAdmin(ReadOnlyAdmin[BudgetAlert]):
    list_display = ("tenant", "period", "level", "spend", "budget", "created_at")
    list_filter = ("level", "period")
    list_select_related = ("tenant",)
