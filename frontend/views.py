"""Portal pages: server-rendered, then kept live by the WebSocket."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from jobs import services as jobs
from jobs.api.serializers import job_json
from tenants import services as tenants


@login_required
def jobs_page(request: HttpRequest) -> HttpResponse:
    tenant = tenants.tenant_for_user(request.user)
    job_list = [job_json(j) for j in jobs.list_jobs(tenant_id=tenant.id)] if tenant else []
    return render(
        request,
        "frontend/jobs.html",
        {"tenant": tenant, "jobs": job_list, "pool": jobs.pool_summary()},
    )
