"""Operator routes of the jobs app (staff, signed in; never a tenant's token): the cluster map with the
actions on it, and the queue across tenants with the cohorts' picture. What the console draws."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.domain import Invalid
from controlplane.parsers import StrictJSONParser
from jobs import services
from jobs.api.schema import HOURS_PARAMETER, query, whole, whole_number
from jobs.contracts import (
    device_event_json,
    flavor_pool_json,
    node_json,
    quota_json,
    utilization_json,
    waiting_job_json,
)
from tenants import services as tenants
from tenants.permissions import IsOperator

# What an operator may set a device to by hand; draining is its own action (it also moves the jobs).
OPERATOR_HEALTH = ("healthy", "degraded", "cordoned", "failed")


MAX_DEVICE_EVENTS = 1000


class _OperatorView(APIView):
    permission_classes = [IsOperator]
    parser_classes = [StrictJSONParser]


class ClusterView(_OperatorView):
    @extend_schema(
        summary="The cluster map: every node and device, its health and what holds it",
        responses={200: OpenApiResponse(OpenApiTypes.OBJECT)},
    )
    def get(self, request: Request) -> Response:
        names = {t.id: t.slug for t in tenants.list_tenants()}
        nodes = [node_json(node) for node in services.cluster_map()]
        for node in nodes:
            for device in node["devices"]:
                if device["job"] is not None:
                    device["job"]["tenant"] = names.get(device["job"]["tenant_id"], "")
        return Response({"nodes": nodes, "flavors": [flavor_pool_json(row) for row in services.pool_summary()]})


class NodeDrainView(_OperatorView):
    @extend_schema(
        summary="Cordon a node and move its running jobs elsewhere, each after a checkpoint",
        request=None,
        responses={200: OpenApiResponse(OpenApiTypes.OBJECT, description="The jobs asked to move.")},
    )
    def post(self, request: Request, node: str) -> Response:
        moved = services.drain_node(node, by=request.user.get_username())
        return Response({"node": node, "moved": moved})


def _health(body: Any) -> str:
    health = body.get("health") if isinstance(body, dict) else None
    if health not in OPERATOR_HEALTH:
        raise Invalid(f"health: one of {', '.join(OPERATOR_HEALTH)}, got {health!r}", field="health")
    return str(health)


class DeviceHealthView(_OperatorView):
    @extend_schema(
        summary="Set a device's health: cordon it, mark it failed, or return it to service",
        request={
            "application/json": {
                "type": "object",
                "required": ["health"],
                "properties": {"health": {"type": "string", "enum": list(OPERATOR_HEALTH)}},
            }
        },
        responses={200: OpenApiResponse(OpenApiTypes.OBJECT)},
    )
    def post(self, request: Request, device_id: str) -> Response:
        health = _health(request.data)
        by = request.user.get_username()
        # A device marked failed first gives back what runs on it: its jobs checkpoint and move.
        moved = services.drain_device(device_id, reason=f"marked failed by {by}") if health == "failed" else []
        changed = services.set_device_health([device_id], health, by=by)
        return Response({"device_id": device_id, "health": health, "changed": changed, "moved": moved})


class OperatorQueueView(_OperatorView):
    @extend_schema(
        summary="Every tenant's waiting jobs, and each tenant's quota use, borrowing and lending",
        responses={200: OpenApiResponse(OpenApiTypes.OBJECT)},
    )
    def get(self, request: Request) -> Response:
        every = tenants.list_tenants()
        names = {t.id: t.slug for t in every}
        queue = [{**waiting_job_json(job), "tenant": names.get(job.tenant_id, "")} for job in services.waiting_jobs()]
        cohorts = [
            {
                "tenant": t.slug,
                "tenant_id": t.id,
                "cohort": t.cohort,
                "quotas": [quota_json(row) for row in services.quota_usage(tenant_id=t.id)],
            }
            for t in every
        ]
        return Response({"queue": queue, "tenants": cohorts})


class UtilizationView(_OperatorView):
    @extend_schema(
        summary="Each flavor's devices held and training over the last hours, averaged per bucket (96 of them)",
        parameters=[HOURS_PARAMETER],
        responses={200: OpenApiResponse(OpenApiTypes.OBJECT)},
    )
    def get(self, request: Request) -> Response:
        hours = whole_number(request, "hours", low=1, high=services.MAX_HISTORY_HOURS) or 24
        return Response(utilization_json(services.utilization_history(hours=hours)))


class DeviceEventsView(_OperatorView):
    @extend_schema(
        summary="Devices' health changes and the failure predictor's alerts, newest first",
        parameters=[
            query("device", description="One device's history (its id, as on the cluster map)."),
            query(
                "limit",
                whole(1, MAX_DEVICE_EVENTS),
                f"How many, newest first (200 unless asked; at most {MAX_DEVICE_EVENTS}).",
            ),
        ],
        responses={200: OpenApiResponse(OpenApiTypes.OBJECT)},
    )
    def get(self, request: Request) -> Response:
        limit = whole_number(request, "limit", low=1, high=MAX_DEVICE_EVENTS) or 200
        device = request.query_params.get("device") or None
        events = services.device_events(device_id=device, limit=limit)
        return Response({"events": [device_event_json(e) for e in events]})
