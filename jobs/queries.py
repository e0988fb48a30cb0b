"""Reads: jobs, their events, the queue, the pool and quota use, as the contracts that leave the app.

Nothing here changes anything. The views of a job's balance, exchange and recovery are built from
what ingest stored and from the job's typed spec.
"""

from __future__ import annotations

import re
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet, Subquery, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from controlplane import paging
from controlplane.domain import Invalid
from jobs.contracts import (
    DeviceCellView,
    DeviceEventView,
    DeviceView,
    EventView,
    FlavorPoolView,
    JobView,
    NodeView,
    QueuedJobView,
    QuotaUsageView,
    WaitingJobView,
)
from jobs.errors import JobNotFound
from jobs.models import (
    Allocation,
    Device,
    DeviceEvent,
    DeviceHealth,
    Flavor,
    JobAttempt,
    JobEvent,
    JobState,
    Node,
    TrainingJob,
)
from jobs.snapshot import holding_jobs, tenant_quotas
from jobs.throughput import throughput_matrix
from runtime.recovery.advisor import advise, job_mtbf_s
from runtime.scheduling import QuotaLedger
from runtime.scheduling.model import MILLI, NAU

_DEVICE_COLUMNS = (
    "job_id",
    "rank",
    "device__device_id",
    "device__flavor__name",
    "device__node__name",
    "started_at",
    "ended_at",
)


def devices_of(job_ids: Collection[int]) -> dict[int, tuple[DeviceView, ...]]:
    """The devices each job held or holds (every attempt's), by rank then start, in one flat query.

    Flat rows rather than prefetched models: ``prefetch_related`` builds a filtered queryset per job,
    which cost a page of 50 jobs more than its SQL did."""
    rows = (
        Allocation.objects.filter(job_id__in=job_ids)
        .order_by("job_id", "rank", "started_at")
        .values_list(*_DEVICE_COLUMNS)
    )
    found: dict[int, list[DeviceView]] = {}
    for job_id, rank, device_id, flavor, node, started_at, ended_at in rows:
        found.setdefault(job_id, []).append(
            DeviceView(
                rank=rank, device_id=device_id, flavor=flavor, node=node, started_at=started_at, ended_at=ended_at
            )
        )
    return {job_id: tuple(views) for job_id, views in found.items()}


QUEUE_ORDER = ("-priority", "created_at", "pk")  # as the scheduler orders a tenant's queue
# The same order as expressions, for a window's ROW_NUMBER().
_QUEUE_ORDER_BY = (F("priority").desc(), F("created_at").asc(), F("pk").asc())


def queue_positions(tenant_id: int) -> dict[int, int]:
    """Each waiting job's place in its tenant's queue (1 = next), in the order admission considers
    them; computed when read, so a cycle never rewrites thousands of rows to shift them by one."""
    queued = TrainingJob.scoped.for_tenant(tenant_id).filter(state=JobState.QUEUED).order_by(*QUEUE_ORDER)
    return {job_id: place for place, job_id in enumerate(queued.values_list("pk", flat=True), start=1)}


def queue_position(job: TrainingJob) -> int:
    """One waiting job's place, by counting who is ahead of it (the push relay asks this per event,
    so it must not read the whole queue)."""
    same = Q(priority=job.priority)
    ahead = (
        Q(priority__gt=job.priority)
        | (same & Q(created_at__lt=job.created_at))
        | (same & Q(created_at=job.created_at, pk__lt=job.pk))
    )
    queued = TrainingJob.scoped.for_tenant(job.tenant_id).filter(state=JobState.QUEUED)
    return queued.filter(ahead).count() + 1


def to_view(job: TrainingJob, *, position: int | None = None, devices: tuple[DeviceView, ...] | None = None) -> JobView:
    """The job as it leaves the app; ``devices`` when the caller fetched them for a whole page."""
    return JobView(
        id=job.pk,
        tenant_id=job.tenant_id,
        name=job.name,
        state=job.state,
        spec=job.spec,
        pending_reason=job.pending_reason,
        failure_reason=job.failure_reason,
        created_at=job.created_at,
        admitted_at=job.admitted_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        steps_done=job.steps_done,
        total_steps=job.total_steps,
        first_loss=job.first_loss,
        last_loss=job.last_loss,
        recent_losses=tuple(job.recent_losses),
        samples_per_s=job.samples_per_s,
        rank_stats=job.rank_stats,
        artifact_path=job.artifact_path,
        devices=devices_of([job.pk]).get(job.pk, ()) if devices is None else devices,
        priority=job.priority,
        queue_position=position if job.state == JobState.QUEUED else None,
        demand=dict(job.demand),
        borrowing=job.borrowing,
        attempt=job.attempt,
        preemptions=job.preemptions,
        balance=balance_view(job),
        comm=comm_view(job),
        restarts=job.restarts,
        recovery=recovery_view(job),
    )


def new_job_view(job: TrainingJob) -> JobView:
    """A job just stored (submitted or cloned): it holds no device and nothing was asked of its first
    attempt yet, so its view needs no query."""
    job.__dict__["current_stop_requested"] = ""  # what with_current_attempt would have annotated
    return to_view(job, devices=())


def balance_view(job: TrainingJob) -> dict[str, Any]:
    """The job's balancing as the API and portal show it: the spec's mode and, once rank 0 reported,
    the current split (chunks of per-rank samples), its balance efficiency on the predicted speeds,
    the predicted per-rank samples/s, and how many times the split changed."""
    stored = job.balance_stats
    mode = job.job_spec.balancing.mode
    split = stored.get("split")
    return {
        "mode": mode,
        "efficiency": stored.get("efficiency"),
        "split": split,
        "micro_batches": [sum(chunk[r] for chunk in split) for r in range(len(split[0]))] if split else None,
        "accumulation": len(split) if split else None,
        "predicted_samples_per_s": stored.get("predicted"),
        "rebalances": stored.get("rebalances", 0),
        "last_rebalance": stored.get("last_rebalance"),
        "stragglers": sorted({rank for rank, _ in stored.get("stragglers", [])}),
    }


def comm_view(job: TrainingJob) -> dict[str, Any]:
    """The job's communication as the API and portal show it: the spec's requested policy and, once
    rank 0 reported, the policy that ran with its reason (why auto chose it), the vendor groups, the
    link emulation, and per-step figures: the latest step's while the job runs, the run's averages
    (``comm_summary``) once it has ended."""
    stored = job.comm_stats
    requested = job.job_spec.comm.to_json()
    ran = stored.get("ran") or {}
    last, summary = stored.get("last_step"), stored.get("summary")
    per_step: dict[str, Any] | None = None
    if summary:  # the run's averages, once the job has ended
        per_step = {"source": "run", "steps": summary.get("steps")}
        per_step |= {name: summary.get(key) for name, (key, _) in _PER_STEP_FIELDS.items()}
    elif last:  # rank 0's latest step while it runs
        per_step = {"source": "step", "step": last.get("step")}
        per_step |= {name: last.get(key) for name, (_, key) in _PER_STEP_FIELDS.items()}
    return {
        "requested": requested,
        **{key: ran.get(key) or None for key in ("policy", "compression", "reason")},
        **{key: ran.get(key) for key in ("hierarchical", "groups", "buckets", "overlap", "link", "link_gbit_measured")},
        "per_step": per_step,
    }


# The per-step figures the API shows: (key in the worker's comm_summary, key in its step events).
_PER_STEP_FIELDS = {
    "bytes_cross": ("bytes_cross_per_step", "comm_bytes_cross"),
    "bytes_intra": ("bytes_intra_per_step", "comm_bytes_intra"),
    "collective_s": ("collective_s_per_step", "collective_s"),
    "exposed_s": ("exposed_s_per_step", "exposed_s"),
    "hidden_share": ("hidden_share", "hidden_share"),
}


def get_job(*, tenant_id: int, job_id: int) -> JobView:
    job = with_current_attempt(TrainingJob.scoped.for_tenant(tenant_id).filter(pk=job_id)).first()
    if job is None:
        raise JobNotFound(job_id)
    return to_view(job, position=queue_position(job) if job.state == JobState.QUEUED else None)


@dataclass(frozen=True)
class JobFilter:
    """Which of a tenant's jobs a list shows; an empty field does not narrow it."""

    states: tuple[str, ...] = ()
    name: str = ""  # part of the name, any case
    flavor: str = ""  # asked for in the spec, or ran on in any attempt
    created_after: datetime | None = None
    created_before: datetime | None = None


MAX_NAME_FILTER = 120
_STATE = "|".join(JobState.values)
# One state or several, comma-separated: exactly what the API takes, so that a schema-valid value is never
# refused (schemathesis checks both ways).
STATES_PATTERN = rf"^(({_STATE})(,({_STATE}))*)?$"


def job_states(raw: str, field: str) -> tuple[str, ...]:
    """The states a query names (``STATES_PATTERN``), or ``Invalid`` naming ``field``; empty: none."""
    if re.fullmatch(STATES_PATTERN, raw) is None:
        known = ", ".join(JobState.values)
        raise Invalid(f"{field}: one or more of {known}, comma-separated, got {raw[:60]!r}", field=field)
    return tuple(raw.split(",")) if raw else ()


def job_filter(params: Mapping[str, str], *, known_flavors: Collection[str]) -> JobFilter:
    """A list's filter from query parameters (state, name, flavor, created_after, created_before), as
    the API and the portal take them; ``Invalid`` naming the first one that is not one."""
    states = job_states(params.get("state", ""), "state")
    flavor = params.get("flavor", "")
    if flavor and flavor not in known_flavors:
        raise Invalid(
            f"flavor: {flavor!r} is not a flavor of this pool; one of {', '.join(sorted(known_flavors))}",
            field="flavor",
        )
    name = params.get("name", "")
    if len(name) > MAX_NAME_FILTER:
        raise Invalid(f"name: at most {MAX_NAME_FILTER} characters, got {len(name)}", field="name")
    created_after, created_before = paging.moment(params, "created_after"), paging.moment(params, "created_before")
    return JobFilter(
        states=states, name=name, flavor=flavor, created_after=created_after, created_before=created_before
    )


def _filtered(jobs: QuerySet[TrainingJob], where: JobFilter) -> QuerySet[TrainingJob]:
    if where.states:
        jobs = jobs.filter(state__in=where.states)
    if where.name:
        jobs = jobs.filter(name__icontains=where.name)
    if where.created_after is not None:
        jobs = jobs.filter(created_at__gte=where.created_after)
    if where.created_before is not None:
        jobs = jobs.filter(created_at__lt=where.created_before)
    if where.flavor:
        ran_on = Allocation.objects.filter(job_id=OuterRef("pk"), device__flavor__name=where.flavor)
        # The spec's flavor list as JSON text holds the name in quotes: exact, on SQLite and PostgreSQL alike.
        jobs = jobs.filter(Q(spec__flavors__icontains=f'"{where.flavor}"') | Exists(ran_on))
    return jobs


def list_jobs(
    *, tenant_id: int, limit: int = 100, after: int | None = None, where: JobFilter | None = None
) -> list[JobView]:
    """The tenant's jobs, newest first (by id), after the job ``after`` when given, at most ``limit``."""
    jobs = _filtered(TrainingJob.scoped.for_tenant(tenant_id), where or JobFilter())
    if after is not None:
        jobs = jobs.filter(pk__lt=after)
    page = list(with_current_attempt(jobs.order_by("-pk"))[:limit])
    positions = _queue_places(tenant_id, [job.pk for job in page if job.state == JobState.QUEUED])
    devices = devices_of([job.pk for job in page])
    return [to_view(job, position=positions.get(job.pk), devices=devices.get(job.pk, ())) for job in page]


def _queue_places(tenant_id: int, job_ids: list[int]) -> dict[int, int]:
    """The places of some waiting jobs in their tenant's queue, in one query however long it is."""
    if not job_ids:
        return {}
    ranked = (
        TrainingJob.scoped.for_tenant(tenant_id)
        .filter(state=JobState.QUEUED)
        .annotate(place=Window(RowNumber(), order_by=list(_QUEUE_ORDER_BY)))
        .filter(pk__in=job_ids)
    )
    return dict(ranked.values_list("pk", "place"))


def event_view(event: JobEvent) -> EventView:
    return EventView(
        id=event.pk,
        job_id=event.job_id,
        tenant_id=event.tenant_id,
        kind=event.kind,
        from_state=event.from_state,
        to_state=event.to_state,
        message=event.message,
        data=event.data,
        created_at=event.created_at,
    )


def list_events(*, tenant_id: int, job_id: int, after: int | None = None, limit: int | None = None) -> list[EventView]:
    """A job's events, oldest first, after the event ``after`` when given, at most ``limit``."""
    if not TrainingJob.scoped.for_tenant(tenant_id).filter(pk=job_id).exists():
        raise JobNotFound(job_id)
    events = JobEvent.scoped.for_tenant(tenant_id).filter(job_id=job_id).order_by("pk")
    if after is not None:
        events = events.filter(pk__gt=after)
    return [event_view(e) for e in (events[:limit] if limit is not None else events)]


def recent_events(*, after_id: int, window_s: float, limit: int = 500) -> list[EventView]:
    """Events after ``after_id``, and those written in the last ``window_s`` seconds whatever their
    id (a slow transaction commits late), oldest first: what the push relay considers next."""
    since = timezone.now() - timedelta(seconds=window_s)
    events = JobEvent.objects.filter(Q(pk__gt=after_id) | Q(created_at__gte=since)).order_by("pk")[:limit]
    return [event_view(e) for e in events]


def device_events(*, device_id: str | None = None, limit: int = 200) -> list[DeviceEventView]:
    """Devices' health changes and predictor alerts, newest first (one device's with ``device_id``)."""
    events = DeviceEvent.objects.order_by("-pk")
    if device_id is not None:
        events = events.filter(device__device_id=device_id)
    rows = events.values_list(
        "pk",
        "device__device_id",
        "device__node__name",
        "device__flavor__name",
        "kind",
        "from_health",
        "to_health",
        "by",
        "score",
        "created_at",
    )[:limit]
    return [DeviceEventView(*row) for row in rows]


def latest_event_id() -> int:
    last = JobEvent.objects.order_by("-pk").values_list("pk", flat=True).first()
    return last or 0


def pool_summary() -> list[FlavorPoolView]:
    health_counts = {
        state.value: Count("devices", filter=Q(devices__health=state), distinct=True) for state in DeviceHealth
    }
    flavors = Flavor.objects.annotate(
        total=Count("devices", distinct=True),
        allocated=Count(
            "devices",
            filter=Q(devices__allocations__ended_at__isnull=True, devices__allocations__isnull=False),
            distinct=True,
        ),
        **{f"health_{state}": count for state, count in health_counts.items()},
    ).order_by("-peak_bf16_tflops")
    return [
        FlavorPoolView(
            flavor=f.name,
            vendor=f.vendor,
            kind=f.kind,
            model=f.model,
            peak_bf16_tflops=f.peak_bf16_tflops,
            memory_gib=f.memory_gib,
            interconnect=f.interconnect,
            devices=f.total,
            healthy=getattr(f, f"health_{DeviceHealth.HEALTHY}"),
            allocated=f.allocated,
            by_health={state: getattr(f, f"health_{state}") for state in health_counts},
        )
        for f in flavors
    ]


def quota_usage(*, tenant_id: int) -> list[QuotaUsageView]:
    """The tenant's quotas with what its running work holds against them, and what its cohort
    could lend it now, computed by the same ledger that admission uses."""
    quotas = tenant_quotas()
    own = quotas.get(tenant_id)
    if own is None:
        return []
    rates = throughput_matrix().rates(["synthetic-mlp"])
    ledger = QuotaLedger(quotas, holding_jobs(rates))
    usage = ledger.usage(tenant_id)

    def show(resource: str, amount: int | None) -> float | None:
        if amount is None:
            return None
        return round(amount / MILLI, 3) if resource == NAU else float(amount)

    rows = []
    for resource, limit in sorted(own.limits.items(), key=lambda item: (item[0] == NAU, item[0])):
        in_use = usage.get(resource, 0)
        rows.append(
            QuotaUsageView(
                resource=resource,
                unit="NAU" if resource == NAU else "devices",
                nominal=show(resource, limit.nominal) or 0.0,
                borrowing_limit=show(resource, limit.borrowing_limit),
                lending_limit=show(resource, limit.lending_limit),
                in_use=show(resource, in_use) or 0.0,
                borrowed=show(resource, max(0, in_use - limit.nominal)) or 0.0,
                cohort=own.cohort,
                cohort_can_lend=show(resource, ledger.lendable_free(own.cohort, resource)) if own.cohort else None,
            )
        )
    return rows


def queue(*, tenant_id: int, limit: int = 500) -> list[QueuedJobView]:
    """The tenant's waiting jobs in the order admission considers them, with place and reason."""
    jobs = TrainingJob.scoped.for_tenant(tenant_id).filter(state=JobState.QUEUED).order_by(*QUEUE_ORDER)[:limit]
    return [
        QueuedJobView(
            id=job.pk,
            name=job.name,
            priority=job.priority,
            position=place,
            reason=job.pending_reason or "waiting for the next admission cycle",
            submitted_at=job.created_at,
        )
        for place, job in enumerate(jobs, start=1)
    ]


def cluster_map() -> list[NodeView]:
    """Every node with its devices in index order, each with its health and the job holding it (for
    operators): three queries however large the pool."""
    holders = {
        device_id: (job_id, tenant_id, rank, state)
        for device_id, job_id, tenant_id, rank, state in Allocation.objects.filter(ended_at__isnull=True).values_list(
            "device_id", "job_id", "job__tenant_id", "rank", "job__state"
        )
    }
    by_node: dict[int, list[DeviceCellView]] = {}
    devices = Device.objects.select_related("flavor").order_by("node_id", "index")
    for device in devices:
        job_id, tenant_id, rank, state = holders.get(device.pk, (None, None, None, None))
        by_node.setdefault(device.node_id, []).append(
            DeviceCellView(
                device_id=device.device_id,
                index=device.index,
                flavor=device.flavor.name,
                health=device.health,
                failure_score=device.failure_score,
                job_id=job_id,
                tenant_id=tenant_id,
                rank=rank,
                job_state=state,
            )
        )
    return [
        NodeView(
            name=node.name,
            flavor=node.flavor.name,
            rack=node.rack,
            coords=tuple(node.coords or ()),
            devices=tuple(by_node.get(node.pk, ())),
        )
        for node in Node.objects.select_related("flavor").order_by("flavor__name", "name")
    ]


def waiting_jobs(*, limit: int = 1000) -> list[WaitingJobView]:
    """Every tenant's waiting jobs (operators), each with its place in its own tenant's queue, in the
    order: tenant, then as admission considers them."""
    ranked = (
        TrainingJob.objects.filter(state=JobState.QUEUED)
        .annotate(place=Window(RowNumber(), partition_by=[F("tenant_id")], order_by=list(_QUEUE_ORDER_BY)))
        .order_by("tenant_id", "place")
        .only("pk", "tenant_id", "name", "priority", "pending_reason", "spec", "created_at")[:limit]
    )
    return [
        WaitingJobView(
            id=job.pk,
            tenant_id=job.tenant_id,
            name=job.name,
            priority=job.priority,
            position=job.place,
            reason=job.pending_reason or "waiting for the next admission cycle",
            devices=job.job_spec.devices,
            flavors=job.job_spec.flavors,
            submitted_at=job.created_at,
        )
        for job in ranked
    ]


_RATE_CACHE: dict[str, Any] = {}
RATE_CACHE_S = 60.0


def pool_failure_rate() -> tuple[float, str]:
    """``failures_per_device_hour``, recomputed at most once a minute (every job view shows it)."""
    cached = _RATE_CACHE.get("rate")
    if cached is None or time.monotonic() - cached[0] > RATE_CACHE_S:
        cached = (time.monotonic(), failures_per_device_hour())
        _RATE_CACHE["rate"] = cached
    return cached[1]


def failures_per_device_hour(now: datetime | None = None, window: timedelta = timedelta(days=30)) -> tuple[float, str]:
    """The pool's measured failure rate, with where it came from: failures that marked a device
    failed over the device-hours run in the window; the configured prior until 100 device-hours
    of history exist."""
    now = now or timezone.now()
    since = now - window
    rows = Allocation.objects.filter(Q(ended_at__isnull=True) | Q(ended_at__gte=since)).values_list(
        "started_at", "ended_at"
    )
    hours = sum(((end or now) - max(start, since)).total_seconds() for start, end in rows) / 3600.0
    failures = JobEvent.objects.filter(created_at__gte=since, data__has_key="device_failed").count()
    prior = settings.POLYCHIP_DEVICE_FAILURES_PER_HOUR
    if hours < 100.0:
        return (
            prior,
            f"the configured prior of {prior:g} failures per device-hour ({hours:.0f} device-hours seen so far)",
        )
    return (
        failures / hours,
        f"{failures} device failure(s) in {hours:.0f} device-hours over the last {window.days} days",
    )


def recovery_view(job: TrainingJob) -> dict[str, Any]:
    """Recovery as the API and portal show it: the checkpoint policy, restarts, the last failure and
    restore, and the interval advisor's suggestion with its reasoning."""
    spec = job.job_spec
    devices, min_devices = spec.devices, spec.min_devices or spec.devices
    stored = job.recovery or {}
    saves = stored.get("checkpoints") or {}
    count = saves.get("count") or 0
    checkpoints = None
    if count:
        latest = saves.get("latest") or {}
        checkpoints = {
            "count": count,
            "latest_step": latest.get("step"),
            "latest_kind": latest.get("checkpoint_kind"),
            "bytes": latest.get("bytes"),
            "stall_ms_avg": round(saves["stall_ms_sum"] / count, 3),
            "write_ms_avg": round(saves["write_ms_sum"] / count, 3),
            "background": latest.get("background"),
        }
    return {
        "checkpoint": spec.checkpoint.to_json(),
        "restarts": job.restarts,
        "max_restarts": spec.max_restarts,
        "devices": devices,
        "min_devices": min_devices,
        "stop_requested": _stop_requested(job) or None,
        "checkpoints": checkpoints,
        "last_failure": stored.get("last_failure"),
        "restored": stored.get("restored"),
        "resumed": stored.get("resumed"),
        "advice": _advice(job, checkpoints, devices),
    }


def _advice(job: TrainingJob, checkpoints: dict[str, Any] | None, devices: int) -> dict[str, Any] | None:
    """Young/Daly intervals from this job's measured checkpoint cost and step time and the pool's
    failure rate; None until the job has saved a checkpoint and reported its step time."""
    step_time = None
    rank0 = (job.rank_stats or {}).get("0") or {}
    if rank0.get("step_time_s"):
        step_time = float(rank0["step_time_s"])
    elif job.samples_per_s:
        step_time = float(job.job_spec.workload.global_batch) / job.samples_per_s
    if checkpoints is None or not step_time:
        return None
    rate, source = pool_failure_rate()
    cost_s = max(checkpoints["stall_ms_avg"], 0.001) / 1000.0
    advice = advise(cost_s, job_mtbf_s(devices, rate), step_time)
    return {**advice.to_json(), "failure_rate_source": source}


def with_current_attempt(jobs: QuerySet[TrainingJob]) -> QuerySet[TrainingJob]:
    """``jobs`` with what their current attempt says that a view shows (one query for a whole list)."""
    current = JobAttempt.objects.filter(job_id=OuterRef("pk"), number=OuterRef("attempt"))
    return jobs.annotate(current_stop_requested=Subquery(current.values("stop_requested")[:1]))


def _stop_requested(job: TrainingJob) -> str:
    """The move asked of the job's current attempt, if any."""
    if "current_stop_requested" in job.__dict__:  # annotated by with_current_attempt
        return str(job.__dict__["current_stop_requested"] or "")
    found = JobAttempt.objects.filter(job_id=job.pk, number=job.attempt).values_list("stop_requested", flat=True)
    return found.first() or ""
