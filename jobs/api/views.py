"""REST endpoints of the jobs app: validate, call one service, serialize."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.http import FileResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing import services as billing
from controlplane import paging
from controlplane.idempotency import changed_nothing
from controlplane.parsers import StrictJSONParser, YamlParser
from controlplane.throttles import PerJobIngestThrottle
from jobs import services
from jobs.api.schema import (
    ADVICE,
    HOURS_PARAMETER,
    JOB,
    JOB_FILTER_PARAMETERS,
    JOB_LIST,
    JOB_SPEC,
    flag,
    query,
    whole_number,
)
from jobs.contracts import (
    event_json,
    flavor_pool_json,
    job_advice_json,
    job_json,
    queued_job_json,
    quota_history_json,
    quota_json,
    start_outlook_json,
    throughput_entry_json,
)
from jobs.telemetry import parse_events
from runtime.jobspec import parse_job_spec
from tenants.permissions import RequireScope, request_tenant_id


class JobListView(APIView):
    permission_classes = [RequireScope]
    parser_classes = [StrictJSONParser, YamlParser]

    @extend_schema(
        summary="The tenant's jobs, newest first, a page at a time",
        parameters=[*JOB_FILTER_PARAMETERS, *paging.PAGE_PARAMETERS],
        responses={200: JOB_LIST},
    )
    def get(self, request: Request) -> Response:
        tenant_id = request_tenant_id(request)
        page = paging.page_request(request.query_params)
        where = services.job_filter(request.query_params, known_flavors=services.known_flavors())
        jobs = services.list_jobs(tenant_id=tenant_id, after=page.after, limit=page.limit + 1, where=where)
        return paging.page_response(request, "jobs", jobs, page, row_id=lambda job: job.id, render=job_json)

    @extend_schema(
        summary="Submit a job",
        description="The body is a job spec (its JSON Schema: GET /api/v1/job-spec/schema). Every problem of "
        "a spec is answered at once in error.errors. With ?dry_run=true nothing is stored: the spec gets every "
        "check submit makes (and is refused as submit would refuse it), then the advisor's answer, 200, as "
        "POST /api/v1/jobs/advise gives it; an Idempotency-Key sent with a dry run is not used up.",
        parameters=[query("dry_run", OpenApiTypes.BOOL, "Check and advise, store nothing (false unless asked).")],
        request={"application/json": JOB_SPEC, "application/yaml": JOB_SPEC},
        responses={
            201: OpenApiResponse(JOB, description="The job, queued."),
            200: OpenApiResponse(ADVICE, description="A dry run: the advice; nothing stored."),
        },
    )
    def post(self, request: Request) -> Response:
        tenant_id = request_tenant_id(request)
        dry_run = flag(request, "dry_run")
        spec = parse_job_spec(request.data, known_flavors=services.known_flavors())
        if dry_run:
            advice = services.dry_run_submit(tenant_id=tenant_id, spec=spec)
            return changed_nothing(Response({"spec": spec.to_dict(), **job_advice_json(advice)}))
        user_id = request.user.pk if request.user is not None else None
        job = services.submit_job(tenant_id=tenant_id, user_id=user_id, spec=spec)
        return Response(job_json(job), status=status.HTTP_201_CREATED, headers={"Location": f"/api/v1/jobs/{job.id}"})


class JobDetailView(APIView):
    permission_classes = [RequireScope]

    @extend_schema(summary="One job", responses={200: JOB})
    def get(self, request: Request, job_id: int) -> Response:
        # Another tenant's job answers exactly like a missing one (404), so ids cannot be probed.
        return Response(job_json(services.get_job(tenant_id=request_tenant_id(request), job_id=job_id)))


class JobCancelView(APIView):
    permission_classes = [RequireScope]

    @extend_schema(summary="Cancel a job", request=None, responses={200: JOB})
    def post(self, request: Request, job_id: int) -> Response:
        job = services.cancel_job(tenant_id=request_tenant_id(request), job_id=job_id)
        return Response(job_json(job))


class JobEventsView(APIView):
    permission_classes = [RequireScope]

    @extend_schema(summary="A job's events, oldest first, a page at a time", parameters=paging.PAGE_PARAMETERS)
    def get(self, request: Request, job_id: int) -> Response:
        page = paging.page_request(request.query_params)
        tenant_id = request_tenant_id(request)
        events = services.list_events(tenant_id=tenant_id, job_id=job_id, after=page.after, limit=page.limit + 1)
        return paging.page_response(request, "events", events, page, row_id=lambda e: e.id, render=event_json)


class JobOutlookView(APIView):
    """What would let a waiting job start: per flavor it accepts, the devices it lacks and when the jobs
    holding them should end (from their steps left and speed); for a quota wait, the tenant's running
    jobs and when each ends. Estimates; ``waiting`` is false once the job is no longer queued."""

    permission_classes = [RequireScope]

    @extend_schema(responses={200: OpenApiResponse(OpenApiTypes.OBJECT)})
    def get(self, request: Request, job_id: int) -> Response:
        return Response(start_outlook_json(services.start_outlook(tenant_id=request_tenant_id(request), job_id=job_id)))


class JobUsageView(APIView):
    permission_classes = [RequireScope]

    def get(self, request: Request, job_id: int) -> Response:
        tenant_id = request_tenant_id(request)
        services.get_job(tenant_id=tenant_id, job_id=job_id)  # 404 unless it is the tenant's
        rows = billing.usage_by_flavor(tenant_id=tenant_id, job_id=job_id)
        costs = billing.usage_cost(tenant_id=tenant_id, job_id=job_id)
        return Response(
            {
                "currency": billing.price_book_for(tenant_id).currency,
                "usage": [
                    {
                        "flavor": r.flavor,
                        "devices": r.devices,
                        "duration_ms": r.duration_ms,
                        "device_seconds": str(r.device_seconds),
                        "cost": str(costs.get(r.flavor, Decimal("0.00"))),
                    }
                    for r in rows
                ],
            }
        )


class PoolView(APIView):
    permission_classes = [RequireScope]

    def get(self, request: Request) -> Response:
        request_tenant_id(request)
        topology = services.pool_fabric().topology
        return Response(
            {
                "flavors": [flavor_pool_json(row) for row in services.pool_summary()],
                "topology": {"kind": topology.kind, "parameters": topology.parameters()},
            }
        )


class TelemetryIngestView(APIView):
    """Where workers send heartbeats and step telemetry, with the job's own ingest token."""

    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]
    throttle_classes = [PerJobIngestThrottle]
    parser_classes = [StrictJSONParser]

    def post(self, request: Request, job_id: int) -> Response:
        scheme, _, credential = request.headers.get("Authorization", "").partition(" ")
        token = credential.strip() if scheme == "Bearer" else ""
        # The token first: the route is open to anyone, so a body is read only for its own job's worker.
        services.check_ingest_token(job_id=job_id, token=token)
        body = request.data if isinstance(request.data, dict) else {}
        events = parse_events(body.get("events"))
        applied = services.ingest_telemetry(job_id=job_id, token=token, events=events)
        return Response({"applied": applied})


class BundleIngestView(APIView):
    """Where a job's ranks on a cluster fetch its code bundle (``runtime.codefetch``), with the job's own
    ingest token: the stored tar.gz, exactly as the tenant uploaded it."""

    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]
    throttle_classes = [PerJobIngestThrottle]

    @extend_schema(responses={(200, "application/gzip"): OpenApiResponse(OpenApiTypes.BINARY)})
    def get(self, request: Request, job_id: int) -> FileResponse:
        scheme, _, credential = request.headers.get("Authorization", "").partition(" ")
        token = credential.strip() if scheme == "Bearer" else ""
        path = services.run_bundle_file(job_id=job_id, token=token)
        return FileResponse(path.open("rb"), content_type="application/gzip")


class QuotaView(APIView):
    """The tenant's quotas, what is in use against them, and what its cohort could lend now."""

    permission_classes = [RequireScope]

    def get(self, request: Request) -> Response:
        rows = services.quota_usage(tenant_id=request_tenant_id(request))
        return Response({"quotas": [quota_json(row) for row in rows]})


class QuotaHistoryView(APIView):
    """The tenant's use of each quota resource over the last hours, averaged per bucket (96 of them),
    against today's nominal share, and what was borrowed beyond it."""

    permission_classes = [RequireScope]

    @extend_schema(parameters=[HOURS_PARAMETER], responses={200: OpenApiResponse(OpenApiTypes.OBJECT)})
    def get(self, request: Request) -> Response:
        hours = whole_number(request, "hours", low=1, high=services.MAX_HISTORY_HOURS) or 24
        return Response(quota_history_json(services.quota_history(tenant_id=request_tenant_id(request), hours=hours)))


class QueueView(APIView):
    """The tenant's waiting jobs, in admission order, each with its place and reason."""

    permission_classes = [RequireScope]

    def get(self, request: Request) -> Response:
        rows = services.queue(tenant_id=request_tenant_id(request))
        return Response({"queue": [queued_job_json(row) for row in rows]})


class ThroughputView(APIView):
    """The throughput table: samples/s of each job class on N devices of each flavor, with its source.

    The same for every tenant (like the pool); ``?job_class=`` and ``?flavor=`` narrow it."""

    permission_classes = [RequireScope]

    @extend_schema(
        parameters=[
            query("job_class", description="One job class only."),
            query("flavor", description="One flavor only."),
        ]
    )
    def get(self, request: Request) -> Response:
        request_tenant_id(request)
        rows = services.list_throughput_entries(
            job_class=request.query_params.get("job_class") or None, flavor=request.query_params.get("flavor") or None
        )
        return Response({"entries": [throughput_entry_json(row) for row in rows]})
