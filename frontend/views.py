"""Portal pages: server-rendered, then kept live by the WebSocket."""

from __future__ import annotations

from datetime import UTC, datetime, time
from decimal import Decimal
from urllib.parse import urlencode

from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from billing import services as billing
from billing.contracts import BudgetStatus
from controlplane import paging
from controlplane.domain import Invalid
from jobs import services as jobs
from jobs.contracts import QuotaUsageView, job_json
from tenants import services as tenants
from tenants.permissions import MANAGE

# Jobs on one page of the list: the API's own default page.
JOBS_PER_PAGE = 50


def _quota_row(quota: QuotaUsageView) -> dict[str, object]:
    """A quota as the page draws it: a bar of the nominal share, overflowing into borrowed."""
    scale = max(quota.nominal, quota.in_use) or 1.0
    return {
        "quota": quota,
        "own_pct": round(100 * min(quota.in_use, quota.nominal) / scale, 1),
        "borrowed_pct": round(100 * quota.borrowed / scale, 1),
        "nominal_pct": round(100 * quota.nominal / scale, 1),
    }


@login_required
def jobs_page(request: HttpRequest) -> HttpResponse:
    """The tenant's jobs a page at a time (keyset paging on the id, so page 2,000 costs what page 1
    does), filtered by state, flavor and name; the first unfiltered page also takes new jobs live."""
    tenant = tenants.tenant_for_user(request.user)
    if tenant is None and request.user.is_staff:
        return redirect("console-cluster")  # an operator of no tenant has no jobs: the console is theirs
    flavors = jobs.known_flavors()
    wanted = {key: request.GET.get(key, "").strip() for key in ("state", "flavor", "name")}
    try:
        where, filter_error = jobs.job_filter(wanted, known_flavors=flavors), ""
    except Invalid as exc:  # shown above an unfiltered list, rather than an error page
        where, filter_error = jobs.JobFilter(), str(exc)
    try:
        page = paging.page_request(request.GET)
    except Invalid:
        page = paging.page_request({})
    job_list: list[dict[str, object]] = []
    next_cursor = None
    if tenant is not None:
        views = jobs.list_jobs(tenant_id=tenant.id, after=page.after, limit=JOBS_PER_PAGE + 1, where=where)
        if len(views) > JOBS_PER_PAGE:
            views = views[:JOBS_PER_PAGE]
            next_cursor = paging.encode_cursor(views[-1].id)
        job_list = [job_json(j) for j in views]
    query = urlencode({k: v for k, v in wanted.items() if v})
    return render(
        request,
        "frontend/jobs.html",
        {
            "tenant": tenant,
            "jobs": job_list,
            "pool": jobs.pool_summary(),
            "quotas": [_quota_row(q) for q in jobs.quota_usage(tenant_id=tenant.id)] if tenant else [],
            "states": jobs.JOB_STATES,
            "flavors": sorted(flavors),
            "wanted": wanted,
            "filter_error": filter_error,
            "next_cursor": next_cursor,
            "first_page": page.after is None,
            "filtered": any(wanted.values()),
            "query": query,
        },
    )


@login_required
def job_page(request: HttpRequest, job_id: int) -> HttpResponse:
    member = tenants.membership_for_user(request.user)
    if member is None:
        raise Http404("no such job")
    try:
        job = jobs.get_job(tenant_id=member.tenant.id, job_id=job_id)
    except jobs.JobNotFound:
        # Another tenant's job answers exactly like a missing one.
        raise Http404("no such job") from None
    context = {"tenant": member.tenant, "job": job_json(job), "job_id": job.id, "name": job.name, "role": member.role}
    return render(request, "frontend/job.html", context)


@login_required
def submit_page(request: HttpRequest) -> HttpResponse:
    tenant = tenants.tenant_for_user(request.user)
    return render(
        request,
        "frontend/submit.html",
        {"tenant": tenant, "flavors": sorted(jobs.known_flavors()), "pool": jobs.pool_summary()},
    )


@login_required
def tokens_page(request: HttpRequest) -> HttpResponse:
    member = tenants.membership_for_user(request.user)
    may_manage = member is not None and MANAGE in tenants.role_scopes(member.role)
    return render(
        request,
        "frontend/tokens.html",
        {"tenant": member.tenant if member else None, "may_manage": may_manage, "role": member.role if member else ""},
    )


# --- the operator console (staff) ------------------------------------------------------------


@staff_member_required(login_url="login")
def console_cluster(request: HttpRequest) -> HttpResponse:
    return render(request, "frontend/console_cluster.html", {"tenant": tenants.tenant_for_user(request.user)})


@staff_member_required(login_url="login")
def console_queue(request: HttpRequest) -> HttpResponse:
    return render(request, "frontend/console_queue.html", {"tenant": tenants.tenant_for_user(request.user)})


@staff_member_required(login_url="login")
def console_prices(request: HttpRequest) -> HttpResponse:
    context = {"tenant": tenants.tenant_for_user(request.user), "flavors": sorted(jobs.known_flavors())}
    return render(request, "frontend/console_prices.html", context)


@staff_member_required(login_url="login")
def console_tenants(request: HttpRequest) -> HttpResponse:
    return render(request, "frontend/console_tenants.html", {"tenant": tenants.tenant_for_user(request.user)})


# --- billing ----------------------------------------------------------------------------------


def _device_time(seconds: float) -> str:
    """Device time as people read it: seconds, minutes or hours."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def _percent(part: Decimal, whole: Decimal) -> str:
    """``part`` as a percentage of ``whole``, for a bar's width: exact decimals, one place."""
    if whole <= 0:
        return "0"
    return f"{min(part / whole * 100, Decimal(100)).quantize(Decimal('0.1')):f}"


def _budget_bar(status: BudgetStatus) -> dict[str, object]:
    """This month's spend as a bar, with the soft and hard budgets as marks along it.

    The bar's scale leaves room past the highest of the three, so that a mark at the very end still
    reads as a mark and spend beyond the hard budget shows as a bar running past it."""
    budgets = [b for b in (status.soft_budget, status.hard_budget) if b is not None]
    scale = max([status.spend, *budgets]) * Decimal("1.1")
    level = "over-hard" if status.hard_reached else "over-soft" if status.soft_reached else "ok"
    return {
        "spend_pct": _percent(status.spend, scale),
        "soft_pct": _percent(status.soft_budget, scale) if status.soft_budget is not None else None,
        "hard_pct": _percent(status.hard_budget, scale) if status.hard_budget is not None else None,
        "level": level,
    }


@login_required
def billing_page(request: HttpRequest) -> HttpResponse:
    tenant = tenants.tenant_for_user(request.user)
    context: dict[str, object] = {"tenant": tenant}
    if tenant is not None:
        context["invoices"] = billing.list_invoices(tenant.id)
        context["period"] = billing.current_period()
        held = jobs.open_usage([tenant.id])
        try:
            status = billing.budget_status(tenant.id, held)
            flavors = billing.spend_by_flavor(tenant.id, held)
            days = billing.spend_by_day(tenant.id, held)
        except billing.RatingError as exc:
            # A flavor without a price: the invoices still show, with what an operator must fix.
            context["pricing_error"] = str(exc)
            return render(request, "frontend/billing.html", context)
        largest = max((amount for _, amount in flavors), default=Decimal(0))
        month_start = datetime.combine(status.period, time.min, tzinfo=UTC)
        context.update(
            spend_days=[{"day": day.isoformat(), "spend": str(amount)} for day, amount in days],
            idle=[
                {
                    "flavor": row.flavor,
                    "held_s": row.held_s,
                    "idle_s": row.idle_s,
                    "held": _device_time(row.held_s),
                    "idle": _device_time(row.idle_s),
                    "idle_pct": f"{100 * row.idle_s / row.held_s:.0f}" if row.held_s else "0",
                }
                for row in jobs.idle_usage(tenant.id, since=month_start)
            ],
            status=status,
            bar=_budget_bar(status),
            hard_reason=billing.hard_budget_reason(status) if status.hard_reached else None,
            flavors=[{"flavor": f, "spend": amount, "pct": _percent(amount, largest)} for f, amount in flavors],
        )
    return render(request, "frontend/billing.html", context)


@login_required
def invoice_page(request: HttpRequest, invoice_id: int) -> HttpResponse:
    tenant = tenants.tenant_for_user(request.user)
    if tenant is None:
        raise Http404("no such invoice")
    try:
        invoice = billing.get_invoice(tenant_id=tenant.id, invoice_id=invoice_id)
    except billing.InvoiceNotFound:
        # Another tenant's invoice answers exactly like a missing one.
        raise Http404("no such invoice") from None
    return render(request, "frontend/invoice.html", {"tenant": tenant, "invoice": invoice})
