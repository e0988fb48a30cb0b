"""Portal pages: server-rendered, then kept live by the WebSocket."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from jobs import services as jobs
from jobs.api.serializers import job_json
from jobs.contracts import QuotaUsageView
from tenants import services as tenants


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
    tenant = tenants.tenant_for_user(request.user)
    job_list = [job_json(j) for j in jobs.list_jobs(tenant_id=tenant.id)] if tenant else []
    return render(
        request,
        "frontend/jobs.html",
        {
            "tenant": tenant,
            "jobs": job_list,
            "pool": jobs.pool_summary(),
            "quotas": [_quota_row(q) for q in jobs.quota_usage(tenant_id=tenant.id)] if tenant else [],
        },
    )
