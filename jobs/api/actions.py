"""A tenant's actions on one job beyond cancel: retry it, change its priority, wait for it.

``wait`` is a long poll: it answers as soon as the job is in one of the asked-for states, or when the
asked-for time is up, whichever comes first, with the job and whether it got there. Over ASGI it
holds no server thread while it waits (an async stream that reads the job every half second); the
body is the job's JSON, preceded by blank space every few seconds so that proxies see a live answer.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.http import HttpResponse, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.domain import Invalid
from controlplane.parsers import StrictJSONParser
from jobs import services
from jobs.api.schema import JOB, STATES_PATTERN, job_states, query
from jobs.contracts import job_json
from runtime.jobspec import MAX_PRIORITY
from tenants.permissions import RequireScope, request_tenant_id

MAX_WAIT_S = 300
POLL_S = 0.5
KEEPALIVE_S = 10.0
ENDED = ("succeeded", "failed", "cancelled")
_PRIORITY = f"a whole number from {-MAX_PRIORITY} to {MAX_PRIORITY}"


class JobRetryView(APIView):
    permission_classes = [RequireScope]

    @extend_schema(
        summary="Submit an ended job again, as a new job",
        request=None,
        responses={201: OpenApiResponse(JOB, description="The new job, queued.")},
    )
    def post(self, request: Request, job_id: int) -> Response:
        user_id = request.user.pk if request.user is not None else None
        job = services.retry_job(tenant_id=request_tenant_id(request), job_id=job_id, user_id=user_id)
        return Response(job_json(job), status=status.HTTP_201_CREATED, headers={"Location": f"/api/v1/jobs/{job.id}"})


class JobPriorityView(APIView):
    permission_classes = [RequireScope]
    parser_classes = [StrictJSONParser]

    @extend_schema(
        summary="Change a waiting or running job's priority",
        request={
            "application/json": {
                "type": "object",
                "additionalProperties": False,
                "required": ["priority"],
                "properties": {"priority": {"type": "integer", "minimum": -MAX_PRIORITY, "maximum": MAX_PRIORITY}},
            }
        },
        responses={200: JOB},
    )
    def post(self, request: Request, job_id: int) -> Response:
        tenant_id = request_tenant_id(request)
        services.get_job(tenant_id=tenant_id, job_id=job_id)  # another tenant's job: 404, whatever the body
        body = request.data
        if not isinstance(body, Mapping) or set(body) != {"priority"}:
            raise Invalid(f'the body is {{"priority": N}}, {_PRIORITY}', field="priority")
        priority = body["priority"]
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise Invalid(f"priority: {_PRIORITY}, got {priority!r}", field="priority")
        job = services.set_priority(tenant_id=tenant_id, job_id=job_id, priority=priority)
        return Response(job_json(job))


def _states(raw: str | None) -> tuple[str, ...]:
    return job_states(raw or "", "until") or ENDED


def _seconds(raw: str | None) -> float:
    if raw is None:
        return 30.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= MAX_WAIT_S:  # also refuses nan
        raise Invalid(f"timeout: seconds from 0 to {MAX_WAIT_S}, got {raw[:20]!r}", field="timeout")
    return value


def _answer(job: Any, reached: bool, waited_s: float) -> bytes:
    return json.dumps({**job_json(job), "wait": {"reached": reached, "waited_s": round(waited_s, 3)}}).encode()


def _read_job(tenant_id: int, job_id: int) -> Any:
    try:
        return services.get_job(tenant_id=tenant_id, job_id=job_id)
    finally:
        close_old_connections()  # a worker thread of the wait, not a request's: leave no connection open


class JobWaitView(APIView):
    permission_classes = [RequireScope]

    @extend_schema(
        summary="Wait for a job to reach a state (long poll)",
        parameters=[
            query(
                "until",
                {"type": "string", "pattern": STATES_PATTERN},
                "The states to wait for, comma-separated; absent: any end (succeeded, failed, cancelled).",
            ),
            query(
                "timeout",
                {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S},
                f"Seconds to wait at most: 30 unless asked, at most {MAX_WAIT_S}.",
            ),
        ],
        responses={
            200: OpenApiResponse(
                OpenApiTypes.OBJECT,
                description="The job, with wait.reached (whether it is in one of the states) and wait.waited_s.",
            )
        },
    )
    def get(self, request: Request, job_id: int) -> HttpResponse | StreamingHttpResponse:
        tenant_id = request_tenant_id(request)
        until = _states(request.query_params.get("until"))
        timeout = _seconds(request.query_params.get("timeout"))
        job = services.get_job(tenant_id=tenant_id, job_id=job_id)  # 404 now, before any stream
        if job.state in until or timeout == 0:
            return HttpResponse(_answer(job, job.state in until, 0.0), content_type="application/json")
        return StreamingHttpResponse(_wait(tenant_id, job_id, until, timeout), content_type="application/json")


async def _wait(tenant_id: int, job_id: int, until: tuple[str, ...], timeout: float) -> AsyncIterator[bytes]:
    read = sync_to_async(_read_job, thread_sensitive=False)
    started = last_sent = time.monotonic()
    while True:
        await asyncio.sleep(POLL_S)
        job = await read(tenant_id, job_id)
        now = time.monotonic()
        if job.state in until or now - started >= timeout:
            yield _answer(job, job.state in until, now - started)
            return
        if now - last_sent >= KEEPALIVE_S:
            last_sent = now
            yield b" "  # blank space before a JSON value is still that value
