"""The jobs app's facade: the use cases that other apps, the API, the admin, tasks and commands call.

Nothing is implemented here. The layers below, each importing only those beneath it (see
``jobs/README.md``; ``make lint`` enforces the order):

    models, errors -> contracts -> bundles -> locks -> transitions -> dispatch -> runs -> artifacts | metrics
    -> pool -> throughput -> metering -> finishing -> snapshot -> admission -> recovery -> resizing -> health
    -> ingest -> lifecycle -> queries | logs -> outlook | advice -> services

Every state change is a claim through the transition table (``jobs.transitions``), locks are taken
in one module in one order (``jobs.locks``), and tasks are sent by name (``jobs.dispatch``).
"""

from __future__ import annotations

from django.conf import settings

from jobs import advice, lifecycle, pool, queries
from jobs.admission import CycleReport as CycleReport
from jobs.admission import admit as admit_queued_jobs
from jobs.admission import cycle_listeners as cycle_listeners
from jobs.admission import run_admission_cycle as run_admission_cycle
from jobs.artifacts import checkpoint_download as checkpoint_download
from jobs.artifacts import job_checkpoints as job_checkpoints
from jobs.artifacts import model_download as model_download
from jobs.backends import get_backend
from jobs.bundles import BundleNotFound as BundleNotFound
from jobs.bundles import BundleRefused as BundleRefused
from jobs.bundles import Readable as Readable
from jobs.bundles import bundle_entrypoint as bundle_entrypoint
from jobs.bundles import bundle_path as bundle_path
from jobs.bundles import get_bundle as get_bundle
from jobs.bundles import list_bundles as list_bundles
from jobs.bundles import max_bytes as bundle_max_bytes
from jobs.bundles import store_bundle as store_bundle
from jobs.contracts import JobAdvice, JobView
from jobs.dispatch import fan_out as fan_out
from jobs.errors import InvalidTransition as InvalidTransition
from jobs.errors import JobNotFound as JobNotFound
from jobs.errors import TelemetryRejected as TelemetryRejected
from jobs.errors import UnknownDevices as UnknownDevices
from jobs.finishing import finish_job as finish_job
from jobs.health import drain_device as drain_device
from jobs.health import drain_node as drain_node
from jobs.health import score_devices as score_devices
from jobs.history import MAX_HOURS as MAX_HISTORY_HOURS
from jobs.history import quota_history as quota_history
from jobs.history import utilization_history as utilization_history
from jobs.ingest import check_ingest_token as check_ingest_token
from jobs.ingest import ingest_telemetry as ingest_telemetry
from jobs.ingest import run_bundle_file as run_bundle_file
from jobs.lifecycle import observe_job as observe_job
from jobs.lifecycle import preview_submit as preview_submit
from jobs.lifecycle import provision_job as provision_job
from jobs.lifecycle import running_job_ids as running_job_ids
from jobs.lifecycle import stale_admitted_job_ids as stale_admitted_job_ids
from jobs.lifecycle import teardown_job as teardown_job
from jobs.lifecycle import untorn_job_ids as untorn_job_ids
from jobs.logs import AttemptLogs as AttemptLogs
from jobs.logs import attempt_logs as attempt_logs
from jobs.logs import follow_logs as follow_logs
from jobs.logs import read_logs as read_logs
from jobs.metering import allocated_ms as allocated_ms
from jobs.metering import idle_usage as idle_usage
from jobs.metering import open_usage as open_usage
from jobs.metrics import DEFAULT_POINTS as DEFAULT_METRIC_POINTS
from jobs.metrics import MAX_POINTS as MAX_METRIC_POINTS
from jobs.metrics import ReportedPoint as ReportedPoint
from jobs.metrics import latest_metric_point_id as latest_metric_point_id
from jobs.metrics import metric_points_after as metric_points_after
from jobs.metrics import metric_series as metric_series
from jobs.metrics import record_points as record_metric_points
from jobs.models import JobState
from jobs.monitoring import families as metric_families
from jobs.moving import request_move as request_move
from jobs.outlook import start_outlook as start_outlook
from jobs.pool import known_flavors as known_flavors
from jobs.pool import pool_fabric as pool_fabric
from jobs.pool import set_device_health as set_device_health
from jobs.pool import sync_pool as sync_pool
from jobs.queries import MAX_NAME_FILTER as MAX_NAME_FILTER
from jobs.queries import STATES_PATTERN as STATES_PATTERN
from jobs.queries import JobFilter as JobFilter
from jobs.queries import cluster_map as cluster_map
from jobs.queries import device_events as device_events
from jobs.queries import get_job as get_job
from jobs.queries import job_filter as job_filter
from jobs.queries import job_states as job_states
from jobs.queries import latest_event_id as latest_event_id
from jobs.queries import list_events as list_events
from jobs.queries import list_jobs as list_jobs
from jobs.queries import pool_summary as pool_summary
from jobs.queries import queue as queue
from jobs.queries import queue_positions as queue_positions
from jobs.queries import quota_usage as quota_usage
from jobs.queries import recent_events as recent_events
from jobs.queries import waiting_jobs as waiting_jobs
from jobs.recovery import grow_back as grow_back
from jobs.recovery import recovering_job_ids as recovering_job_ids
from jobs.recovery import retry_recovering as retry_recovering
from jobs.recovery import shrunk_job_ids as shrunk_job_ids
from jobs.resizing import Resize as Resize
from jobs.resizing import elastic_round as elastic_round
from jobs.runs import ingest_token as ingest_token
from jobs.runs import run_key as run_key
from jobs.throughput import list_entries as list_throughput_entries
from jobs.throughput import store_benchmarks as store_benchmarks
from jobs.throughput import throughput_matrix as throughput_matrix
from runtime.inventory import load_pool
from runtime.jobspec import JobSpec

__all__ = [
    "DEFAULT_METRIC_POINTS",
    "JOB_STATES",
    "MAX_HISTORY_HOURS",
    "MAX_METRIC_POINTS",
    "MAX_NAME_FILTER",
    "STATES_PATTERN",
    "AttemptLogs",
    "BundleNotFound",
    "BundleRefused",
    "CycleReport",
    "InvalidTransition",
    "JobFilter",
    "JobNotFound",
    "Readable",
    "ReportedPoint",
    "Resize",
    "TelemetryRejected",
    "UnknownDevices",
    "admit_queued_jobs",
    "advise_submit",
    "allocated_ms",
    "attempt_logs",
    "bundle_entrypoint",
    "bundle_max_bytes",
    "bundle_path",
    "cancel_job",
    "check_ingest_token",
    "checkpoint_download",
    "cluster_map",
    "cycle_listeners",
    "device_events",
    "drain_device",
    "drain_node",
    "dry_run_submit",
    "elastic_round",
    "fan_out",
    "finish_job",
    "follow_logs",
    "get_bundle",
    "get_job",
    "grow_back",
    "idle_usage",
    "ingest_telemetry",
    "ingest_token",
    "job_checkpoints",
    "job_filter",
    "job_states",
    "known_flavors",
    "latest_event_id",
    "latest_metric_point_id",
    "list_bundles",
    "list_events",
    "list_jobs",
    "list_throughput_entries",
    "metric_families",
    "metric_points_after",
    "metric_series",
    "model_download",
    "observe_job",
    "open_usage",
    "pool_fabric",
    "pool_summary",
    "preview_submit",
    "provision_job",
    "queue",
    "queue_positions",
    "quota_history",
    "quota_usage",
    "read_logs",
    "recent_events",
    "record_metric_points",
    "recovering_job_ids",
    "request_move",
    "retry_recovering",
    "run_admission_cycle",
    "run_bundle_file",
    "run_key",
    "running_job_ids",
    "score_devices",
    "set_device_health",
    "shrunk_job_ids",
    "stale_admitted_job_ids",
    "start_outlook",
    "store_benchmarks",
    "store_bundle",
    "submit_job",
    "sync_cluster_inventory",
    "sync_pool",
    "teardown_job",
    "throughput_matrix",
    "untorn_job_ids",
    "utilization_history",
    "waiting_jobs",
]

# Every state a job may be in, in its life's order (the jobs list's ?state= filter takes them).
JOB_STATES: tuple[str, ...] = tuple(JobState.values)


def sync_cluster_inventory() -> dict[str, int] | None:
    """On a cluster (``POLYCHIP_BACKEND=kubernetes``), its nodes into the pool and its word on their
    health (``jobs.pool.sync_cluster``); None on a backend without a cluster to read."""
    read = getattr(get_backend(), "read_inventory", None)
    if read is None:
        return None
    return pool.sync_cluster(read(load_pool(settings.POLYCHIP_POOL_FILE)))


def submit_job(*, tenant_id: int, user_id: int | None, spec: JobSpec) -> JobView:
    """Store a job (queued, its first attempt, the event) and ask for an admission cycle."""
    return queries.new_job_view(lifecycle.submit_job(tenant_id=tenant_id, user_id=user_id, spec=spec))


def advise_submit(*, tenant_id: int, spec: JobSpec) -> JobAdvice:
    """What submitting the spec now would do and how it would run, in words (``jobs.advice``); stores
    nothing. A spec that could never start gets its reason, not a refusal."""
    return advice.advise(tenant_id=tenant_id, spec=spec)


def dry_run_submit(*, tenant_id: int, spec: JobSpec) -> JobAdvice:
    """Submit's checks (a spec that submit refuses is refused the same way), then the advice; stores nothing."""
    lifecycle.check_submit(tenant_id=tenant_id, spec=spec)
    return advice.advise(tenant_id=tenant_id, spec=spec)


def retry_job(*, tenant_id: int, job_id: int, user_id: int | None) -> JobView:
    """Submit a job that has ended again, as a new job."""
    return queries.new_job_view(lifecycle.retry_job(tenant_id=tenant_id, job_id=job_id, user_id=user_id))


def set_priority(*, tenant_id: int, job_id: int, priority: int) -> JobView:
    lifecycle.set_priority(tenant_id=tenant_id, job_id=job_id, priority=priority)
    return queries.get_job(tenant_id=tenant_id, job_id=job_id)


def cancel_job(*, tenant_id: int, job_id: int) -> JobView:
    """Cancel one of the tenant's jobs; ``JobNotFound`` or ``InvalidTransition`` when it cannot be."""
    lifecycle.cancel_job(tenant_id=tenant_id, job_id=job_id)
    return queries.get_job(tenant_id=tenant_id, job_id=job_id)
