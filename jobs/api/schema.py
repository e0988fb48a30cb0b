"""What the jobs API's OpenAPI schema says of its bodies and query parameters (drf-spectacular).

The job spec is described by its own JSON Schema (``runtime.jobspec.job_spec_schema``, the tables the
parser checks against), so the API's schema and the parser cannot drift apart."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework.request import Request

from controlplane.domain import Invalid
from jobs import services
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


def _advice_part(properties: dict[str, Any]) -> dict[str, Any]:
    sentences = {"type": "array", "items": {"type": "string"}, "description": "Plain sentences; the first heads it."}
    return {
        "type": "object",
        "required": [*properties, "reasoning"],
        "properties": {**properties, "reasoning": sentences},
    }


_INT_OR_NULL = {"type": ["integer", "null"]}
_NUMBER_OR_NULL = {"type": ["number", "null"]}
_COUNTS = {"type": "object", "additionalProperties": {"type": "integer"}, "description": "Devices per flavor."}
# What POST /api/v1/jobs/advise (and POST /api/v1/jobs?dry_run=true) answers (jobs.contracts.job_advice_json).
ADVICE: dict[str, Any] = {
    "type": "object",
    "required": ["spec", "summary", "admission", "start", "batch", "checkpoint", "comm", "cost"],
    "properties": {
        "spec": {"type": "object", "description": "The spec as submit would store it, every default filled in."},
        "summary": {"type": "array", "items": {"type": "string"}, "description": "Each part's headline."},
        "admission": _advice_part(
            {
                "verdict": {"type": "string", "enum": ["now", "waits", "never"]},
                "reason": {"type": "string", "description": "The scheduler's words: why it waits or never starts."},
                "devices": _COUNTS,
                "borrowing": {"type": "boolean"},
                "preempts": {"type": "integer", "description": "Jobs on borrowed capacity it would evict first."},
            }
        ),
        "start": _advice_part(
            {
                "expected_at": _TIME,
                "wait_s": _NUMBER_OR_NULL,
                "jobs_ending": {"type": "integer"},
                "jobs_first": {"type": "integer"},
            }
        ),
        "batch": _advice_part(
            {
                "global_batch": {"type": "integer"},
                "placement": {"type": "string", "enum": ["now", "estimated start", "idle pool", "none"]},
                "param_count": _INT_OR_NULL,
                "activation_bytes_per_sample": _NUMBER_OR_NULL,
                "accumulation": _INT_OR_NULL,
                "flavors": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "flavor": {"type": "string"},
                            "memory_gib": {"type": "number"},
                            "max_micro_batch": _INT_OR_NULL,
                            "devices": {"type": "integer"},
                            "micro_batch": _INT_OR_NULL,
                        },
                    },
                },
            }
        ),
        "checkpoint": _advice_part(
            {
                "weights_every": _INT_OR_NULL,
                "optimizer_every": _INT_OR_NULL,
                "young_s": _NUMBER_OR_NULL,
                "daly_s": _NUMBER_OR_NULL,
                "mtbf_s": _NUMBER_OR_NULL,
                "save_cost_s": _NUMBER_OR_NULL,
                "step_time_s": _NUMBER_OR_NULL,
                "spec_weights_every": {"type": "integer"},
                "spec_optimizer_every": {"type": "integer"},
            }
        ),
        "comm": _advice_part(
            {
                "requested": {"type": "string"},
                "auto_would_choose": {"type": ["string", "null"]},
                "density": _NUMBER_OR_NULL,
                "rank": _INT_OR_NULL,
                "vendor_groups": {"type": "integer"},
                "link_gbit": _NUMBER_OR_NULL,
                "link_source": {"type": "string"},
            }
        ),
        "cost": _advice_part(
            {
                "nau": _NUMBER_OR_NULL,
                "nau_per_device": {"type": "object", "additionalProperties": {"type": "number"}},
                "cost_per_hour": {"type": ["string", "null"], "description": "A decimal, in currency."},
                "currency": {"type": "string"},
            }
        ),
    },
}


def flag(request: Request, key: str) -> bool:
    """The query parameter ``key`` as true or false (absent: false)."""
    raw = (request.query_params.get(key) or "false").lower()
    if raw not in ("true", "false", "1", "0"):
        raise Invalid(f"must be true or false, got {raw[:40]!r}", field=key)
    return raw in ("true", "1")


def page_of(key: str, item: dict[str, Any]) -> dict[str, Any]:
    """A cursor page's body (controlplane.paging)."""
    return {
        "type": "object",
        "required": [key, "limit", "next_cursor", "next"],
        "properties": {
            key: {"type": "array", "items": item},
            "limit": {"type": "integer"},
            "next_cursor": {"type": ["string", "null"], "description": "The next page's cursor; null on the last."},
            "next": {"type": ["string", "null"], "description": "The next page's path and query; null on the last."},
        },
    }


JOB_LIST: dict[str, Any] = page_of("jobs", JOB)
BINARY: dict[str, Any] = {"type": "string", "format": "binary"}


# Query text may not hold a NUL (controlplane.middleware refuses it: PostgreSQL cannot store one).
NO_NUL = r"^[^\u0000]*$"
_CURSOR = r"^c([0-9]+-[0-9]+-[0-9]+-[0-9]+)?(_[0-9]+-[0-9]+-[0-9]+-[0-9]+)*$"


def query(name: str, kind: Any = OpenApiTypes.STR, description: str = "", **extra: Any) -> OpenApiParameter:
    if kind == OpenApiTypes.STR and "enum" not in extra:
        extra.setdefault("pattern", NO_NUL)
    return OpenApiParameter(name, kind, OpenApiParameter.QUERY, description=description, **extra)


def whole(lowest: int, highest: int | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer", "minimum": lowest}
    if highest is not None:
        schema["maximum"] = highest
    return schema


def whole_number(request: Request, key: str, *, low: int, high: int) -> int | None:
    """The query parameter ``key`` as a whole number in ``[low, high]``; None when absent."""
    raw = request.query_params.get(key)
    if raw is None or raw == "":
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 19 or not low <= int(raw) <= high:
        raise Invalid(f"must be a whole number from {low} to {high}, got {raw[:40]!r}", field=key)
    return int(raw)


HOURS_PARAMETER = query("hours", whole(1, services.MAX_HISTORY_HOURS), "How far back, in hours (24 unless asked).")
MAX_STEP = 2**63 - 1
LOG_PARAMETERS = [
    query("rank", whole(0), "One rank (from 0); absent: every rank's lines interleaved by time."),
    query("attempt", whole(0), "Which run, from 0; absent: the newest."),
    query(
        "since",
        {"oneOf": [{"type": "string", "format": "date-time"}, {"type": "string", "pattern": _CURSOR}]},
        "An ISO 8601 time, or the cursor an earlier answer gave (X-Log-Cursor).",
    ),
    query("tail", whole(0, 10_000), "The last N lines only."),
    query("limit", whole(1, 10_000), "At most this many lines (default 10,000); X-Log-More: true says more wait."),
    query("format", OpenApiTypes.STR, "text (default) or jsonl.", enum=["text", "jsonl"]),
    query("follow", OpenApiTypes.BOOL, "Stream new lines until the run has ended."),
]
METRIC_PARAMETERS = [
    query(
        "name",
        {"type": "string", "pattern": r"^[A-Za-z0-9_.:/,-]*$"},
        "Series names (1-64 of letters, digits, _ . : / -), comma-separated or repeated; absent: all.",
    ),
    query("from", whole(0, MAX_STEP), "The first step."),
    query("to", whole(0, MAX_STEP), "The last step."),
    query("points", whole(1, services.MAX_METRIC_POINTS), "At most this many points a series (equal step buckets)."),
]


# The list's filters are parsed in one place for the API and the portal (jobs.queries.job_filter).
MAX_NAME_FILTER = services.MAX_NAME_FILTER
STATES_PATTERN = services.STATES_PATTERN
job_states = services.job_states


JOB_FILTER_PARAMETERS = [
    query(
        "state",
        {"type": "string", "pattern": STATES_PATTERN},
        f"One state or several, comma-separated: {', '.join(services.JOB_STATES)}.",
    ),
    query("name", {"type": "string", "maxLength": MAX_NAME_FILTER, "pattern": NO_NUL}, "Part of the name, any case."),
    query("flavor", description="Jobs that ask for this flavor or ran on it."),
    query("created_after", OpenApiTypes.DATETIME, "Created at or after this time (RFC 3339)."),
    query("created_before", OpenApiTypes.DATETIME, "Created before this time (RFC 3339)."),
]
