"""What the jobs API's OpenAPI schema says of its bodies and query parameters (drf-spectacular).

The job spec is described by its own JSON Schema (``runtime.jobspec.job_spec_schema``, the tables the
parser checks against), so the API's schema and the parser cannot drift apart."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter

from runtime.jobspec import job_spec_schema


def _spec() -> dict[str, Any]:
    schema = job_spec_schema()
    schema.pop("$schema", None)
    return schema


_TIME = {"type": ["string", "null"], "format": "date-time"}
JOB_SPEC: dict[str, Any] = _spec()
JOB: dict[str, Any] = {
    "type": "object",
    "required": ["id", "name", "state", "spec", "created_at", "progress", "loss", "devices"],
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string"},
        "state": {"type": "string", "description": "queued, admitted, running, recovering, succeeded, failed, ..."},
        "priority": {"type": "integer"},
        "pending_reason": {"type": ["string", "null"]},
        "queue_position": {"type": ["integer", "null"]},
        "quota": {"type": ["object", "null"]},
        "attempt": {"type": "integer", "description": "the current run, from 0"},
        "preemptions": {"type": "integer"},
        "failure_reason": {"type": ["string", "null"]},
        "spec": JOB_SPEC,
        "created_at": _TIME,
        "admitted_at": _TIME,
        "started_at": _TIME,
        "finished_at": _TIME,
        "progress": {
            "type": "object",
            "properties": {
                "steps_done": {"type": "integer"},
                "total_steps": {"type": "integer"},
                "fraction": {"type": "number"},
                "samples_per_s": {"type": ["number", "null"]},
            },
        },
        "loss": {
            "type": "object",
            "properties": {
                "first": {"type": ["number", "null"]},
                "last": {"type": ["number", "null"]},
                "recent": {"type": "array", "items": {"type": "number"}},
            },
        },
        "devices": {"type": "array", "items": {"type": "object"}},
        "ranks": {"type": "array", "items": {"type": "object"}},
        "balance": {"type": ["object", "null"]},
        "comm": {"type": ["object", "null"]},
        "restarts": {"type": "integer"},
        "recovery": {"type": ["object", "null"]},
        "artifact": {"type": ["string", "null"]},
    },
}
JOB_LIST: dict[str, Any] = {"type": "object", "properties": {"jobs": {"type": "array", "items": JOB}}}
BINARY: dict[str, Any] = {"type": "string", "format": "binary"}


def query(name: str, kind: Any = OpenApiTypes.STR, description: str = "", **extra: Any) -> OpenApiParameter:
    return OpenApiParameter(name, kind, OpenApiParameter.QUERY, description=description, **extra)


LOG_PARAMETERS = [
    query("rank", OpenApiTypes.INT, "One rank (from 0); absent: every rank's lines interleaved by time."),
    query("attempt", OpenApiTypes.INT, "Which run, from 0; absent: the newest."),
    query("since", OpenApiTypes.STR, "An ISO 8601 time, or the cursor an earlier answer gave (X-Log-Cursor)."),
    query("tail", OpenApiTypes.INT, "The last N lines only (at most 10,000)."),
    query("limit", OpenApiTypes.INT, "At most this many lines (default and most 10,000); X-Log-More says more wait."),
    query("format", OpenApiTypes.STR, "text (default) or jsonl.", enum=["text", "jsonl"]),
    query("follow", OpenApiTypes.BOOL, "Stream new lines until the run has ended."),
]
METRIC_PARAMETERS = [
    query("name", OpenApiTypes.STR, "Series names, comma-separated or repeated; absent: all."),
    query("from", OpenApiTypes.INT, "The first step."),
    query("to", OpenApiTypes.INT, "The last step."),
    query("points", OpenApiTypes.INT, "At most this many points per series (downsampled in equal step buckets)."),
]
