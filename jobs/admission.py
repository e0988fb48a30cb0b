"""The admission loop's shell: load a capacity snapshot, let the pure scheduler decide, apply.

Kueue's shape: the queue manager, the capacity snapshot and the decisions live in
``runtime.scheduling`` as plain code; this module feeds them from the database and persists what
they decided. A cycle runs under the admission lock (one row, ``AdmissionLock``), so every cycle
sees the usage the previous one committed and a quota is never overshot however many submissions
race. Applying is a claim per job (a conditional UPDATE); a claim that fails leaves the job where
it was, and the next cycle decides again.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from billing import services as billing
from jobs import throughput
from jobs.models import (
    TERMINAL_STATES,
    AdmissionLock,
    AdmissionRequest,
    Allocation,
    Device,
    DeviceHealth,
    Flavor,
    JobEvent,
    JobState,
    TrainingJob,
)
from runtime.scheduling import (
    NAU,
    Admission,
    AdmittedJob,
    FreeDevice,
    Limit,
    PendingJob,
    Preemption,
    Snapshot,
    TenantQuota,
    decayed_usage,
    schedule,
)
from runtime.scheduling.model import MILLI
from runtime.scheduling.policies import Policy, get_policy
from runtime.throughput import ThroughputMatrix, choose_reference
from tenants import services as tenants

log = logging.getLogger(__name__)

HOLDING_STATES = (JobState.ADMITTED, JobState.RUNNING)


@dataclass(frozen=True)
class CycleReport:
    admitted: tuple[int, ...]
    preempted: tuple[int, ...]
    waiting: int
    requeued: tuple[int, ...]  # decided, but the claim failed; the next cycle decides again
    decide_s: float
    snapshot_at: datetime
    decided: tuple[int, ...]  # every queued job this cycle considered


def placement_policy() -> Policy | None:
    name = settings.POLYCHIP_PLACEMENT_POLICY
    return None if name in ("", "none") else get_policy(name)


# --- the snapshot -----------------------------------------------------------------------------


def throughput_matrix() -> ThroughputMatrix:
    peaks = dict(Flavor.objects.values_list("name", "peak_bf16_tflops"))
    if not peaks:
        peaks = {settings.POLYCHIP_NAU_REFERENCE: 1.0}
    # Measured rates from the stored table (benchmarks, then real steps); an empty table leaves the
    # matrix to estimate every rate from peak figures, as it did before there was one.
    return ThroughputMatrix(
        reference_flavor=choose_reference(settings.POLYCHIP_NAU_REFERENCE, peaks),
        peak_tflops=peaks,
        measured=throughput.measured_per_device(),
    )


def _amount(resource: str, value: Decimal) -> int:
    """A quota in the scheduler's integers: devices for a flavor, milli-NAU for NAU."""
    return int(value * MILLI) if resource == NAU else int(value)


def tenant_quotas() -> dict[int, TenantQuota]:
    quotas: dict[int, TenantQuota] = {}
    for view in tenants.quotas_for_admission():
        limits = {
            resource: Limit(
                nominal=_amount(resource, q.nominal),
                borrowing_limit=None if q.borrowing_limit is None else _amount(resource, q.borrowing_limit),
                lending_limit=None if q.lending_limit is None else _amount(resource, q.lending_limit),
            )
            for resource, q in view.quotas.items()
        }
        quotas[view.id] = TenantQuota(tenant_id=view.id, cohort=view.cohort, limits=limits, weight=float(view.weight))
    return quotas


def _free_device(device: Device) -> FreeDevice:
    return FreeDevice(
        device_id=device.device_id,
        node=device.node.name,
        flavor=device.flavor.name,
        degraded=device.health == DeviceHealth.DEGRADED,
    )


def _charge(job_class: str, devices: Iterable[FreeDevice], rates: Mapping[tuple[str, str], int]) -> dict[str, int]:
    demand: dict[str, int] = defaultdict(int)
    for device in devices:
        demand[device.flavor] += 1
        demand[NAU] += rates.get((job_class, device.flavor), MILLI)
    return dict(demand)


def holding_jobs(rates: Mapping[tuple[str, str], int]) -> list[AdmittedJob]:
    by_job: dict[int, list[FreeDevice]] = defaultdict(list)
    open_allocations = (
        Allocation.objects.filter(ended_at__isnull=True, job__state__in=HOLDING_STATES)
        .order_by("job_id", "rank")
        .values_list("job_id", "device__device_id", "device__node__name", "device__flavor__name")
    )
    for job_id, device_id, node, flavor in open_allocations:
        by_job[job_id].append(FreeDevice(device_id=device_id, node=node, flavor=flavor))
    jobs = TrainingJob.objects.filter(pk__in=by_job).only(
        "pk", "tenant_id", "priority", "admitted_at", "demand", "borrowing", "job_class"
    )
    return [
        AdmittedJob(
            job_id=job.pk,
            tenant_id=job.tenant_id,
            priority=job.priority,
            admitted_at=(job.admitted_at or timezone.now()).timestamp(),
            devices=tuple(by_job[job.pk]),
            # Jobs admitted before quotas existed carry no charge: price them as they stand.
            demand=job.demand or _charge(job.job_class, by_job[job.pk], rates),
            borrowing=job.borrowing,
        )
        for job in jobs
    ]


def _pending_jobs() -> list[PendingJob]:
    rows = TrainingJob.objects.filter(state=JobState.QUEUED).values_list(
        "pk", "tenant_id", "priority", "created_at", "spec", "job_class"
    )
    return [
        PendingJob(
            job_id=pk,
            tenant_id=tenant_id,
            priority=priority,
            submitted_at=created_at.timestamp(),
            devices=int(spec["devices"]),
            flavors=tuple(spec["flavors"]),
            job_class=job_class,
        )
        for pk, tenant_id, priority, created_at, spec, job_class in rows
    ]


def _free_devices() -> list[FreeDevice]:
    held = Allocation.objects.filter(ended_at__isnull=True).values("device_id")
    # A device is free only once nothing runs on it: the runs of ended or preempted attempts that
    # the backend has not yet confirmed gone still occupy theirs.
    untorn = TrainingJob.objects.filter(
        ~Q(pending_teardowns=[]) | Q(state__in=TERMINAL_STATES, backend_handle__isnull=False, torn_down_at__isnull=True)
    )
    lingering = Allocation.objects.filter(job__in=untorn).values("device_id")
    devices = (
        # Degraded devices still run work, but placement takes them last (FreeDevice.degraded);
        # cordoned and failed ones are never offered.
        Device.objects.filter(health__in=(DeviceHealth.HEALTHY, DeviceHealth.DEGRADED))
        .exclude(pk__in=held)
        .exclude(pk__in=lingering)
        .select_related("node", "flavor")
        .order_by("device_id")
    )
    return [_free_device(d) for d in devices]


def usage_history(now: datetime, rates: Mapping[tuple[str, str], int]) -> dict[int, dict[str, float]]:
    """Each tenant's decayed usage per resource over the last few half-lives, as an average amount
    in use: last week's burst weighs little, the last hour's a lot."""
    half_life_s = settings.POLYCHIP_FAIR_SHARE_HALF_LIFE_H * 3600.0
    horizon = now - timedelta(seconds=half_life_s * 6)
    rows = Allocation.objects.filter(Q(ended_at__isnull=True) | Q(ended_at__gte=horizon)).values_list(
        "job__tenant_id", "job__job_class", "device__flavor__name", "started_at", "ended_at"
    )
    intervals: dict[tuple[int, str], list[tuple[float, float | None, float]]] = defaultdict(list)
    for tenant_id, job_class, flavor, started_at, ended_at in rows:
        start = started_at.timestamp()
        end = ended_at.timestamp() if ended_at else None
        intervals[(tenant_id, flavor)].append((start, end, 1.0))
        intervals[(tenant_id, NAU)].append((start, end, float(rates.get((job_class, flavor), MILLI))))
    history: dict[int, dict[str, float]] = defaultdict(dict)
    for (tenant_id, resource), spans in intervals.items():
        history[tenant_id][resource] = decayed_usage(spans, now.timestamp(), half_life_s)
    return dict(history)


def load_snapshot(now: datetime) -> Snapshot:
    matrix = throughput_matrix()
    pending = _pending_jobs()
    classes = {job.job_class for job in pending} | set(
        TrainingJob.objects.filter(state__in=HOLDING_STATES).values_list("job_class", flat=True).distinct()
    )
    rates = matrix.rates(classes | {"synthetic-mlp"})
    from jobs.services import pool_fabric

    return Snapshot(
        now=now.timestamp(),
        tenants=tenant_quotas(),
        pending=pending,
        admitted=holding_jobs(rates),
        free=_free_devices(),
        nau_rates=rates,
        history=usage_history(now, rates),
        distance=pool_fabric().hops,  # devices chosen by topology: fewest hops
    )


# --- applying decisions -----------------------------------------------------------------------


def _preempt(preemption: Preemption, now: datetime) -> bool:
    """Give a job's devices back and put it in the queue again as its next attempt."""
    from jobs import services, tasks

    job = TrainingJob.objects.select_for_update().filter(pk=preemption.job_id).first()
    if job is None or job.state not in HOLDING_STATES:
        return False  # it ended meanwhile, and so gave its devices back already
    teardowns = list(job.pending_teardowns)
    if job.backend_handle and job.backend_handle not in teardowns:
        teardowns.append(job.backend_handle)
    won = TrainingJob.objects.filter(pk=job.pk, state=job.state, attempt=job.attempt).update(
        state=JobState.QUEUED,
        state_changed_at=now,
        attempt=F("attempt") + 1,
        preemptions=F("preemptions") + 1,
        provision_claimed_at=None,
        backend_handle=None,
        pending_teardowns=teardowns,
        admitted_at=None,
        started_at=None,
        demand={},
        borrowing=False,
        steps_done=0,
        rank_stats={},
        samples_per_s=None,
        pending_reason="preempted; waiting to be admitted again",
        stop_requested="",
    )
    if won != 1:
        return False
    services.end_allocations(job, now)
    # The old attempt is asked to save a full checkpoint before it is torn down (services.teardown_job),
    # and the next attempt, which launches only once that is done, restores it.
    JobEvent.objects.create(
        job=job,
        tenant_id=job.tenant_id,
        kind=JobEvent.Kind.TRANSITION,
        from_state=job.state,
        to_state=JobState.QUEUED,
        message=f"{preemption.reason}; re-queued, asked to checkpoint first and resume from its newest checkpoint",
        data={"preempted_by": preemption.by_job_id, "attempt": job.attempt + 1},
    )
    if teardowns:
        transaction.on_commit(functools.partial(tasks.teardown_job.delay, job.pk), robust=True)
    return True


def _admit_all(admissions: Iterable[Admission], now: datetime) -> tuple[list[int], list[int]]:
    """Claim the decided jobs and give them their devices: (admitted ids, ids whose claim failed).

    The rows are locked in id order, so a cancel that races waits or wins cleanly; each claim is
    still a conditional UPDATE. Events and allocations go in two bulk inserts. Under the admission
    lock nobody else creates allocations, so the unique index on open allocations is a last guard
    that, if it ever fired, would undo the whole cycle rather than part of it.
    """
    from jobs import tasks

    admissions = list(admissions)
    if not admissions:
        return [], []
    locked = {
        job.pk: job
        for job in TrainingJob.objects.select_for_update()
        .filter(pk__in=[a.job_id for a in admissions])
        .order_by("pk")
        .only("pk", "state", "tenant_id")
    }
    devices = {
        d.device_id: d
        for d in Device.objects.filter(device_id__in=[p.device_id for a in admissions for p in a.devices])
    }
    admitted: list[int] = []
    requeued: list[int] = []
    events: list[JobEvent] = []
    allocations: list[Allocation] = []
    for admission in admissions:
        job = locked.get(admission.job_id)
        won = (
            job is not None
            and job.state == JobState.QUEUED
            and TrainingJob.objects.filter(pk=job.pk, state=JobState.QUEUED).update(
                state=JobState.ADMITTED,
                state_changed_at=now,
                admitted_at=now,
                pending_reason="",
                demand=dict(admission.demand),
                borrowing=admission.borrowing,
            )
            == 1
        )
        if not won or job is None:
            requeued.append(admission.job_id)
            continue
        flavors = list(dict.fromkeys(d.flavor for d in admission.devices))
        nau = admission.demand.get(NAU, 0) / MILLI
        events.append(
            JobEvent(
                job_id=job.pk,
                tenant_id=job.tenant_id,
                kind=JobEvent.Kind.TRANSITION,
                from_state=JobState.QUEUED,
                to_state=JobState.ADMITTED,
                message=(
                    f"admitted on {len(admission.devices)} devices: {', '.join(flavors)} ({nau:.3f} NAU"
                    + (", borrowed from the cohort)" if admission.borrowing else ")")
                ),
                data={
                    "devices": [d.device_id for d in admission.devices],
                    "flavors": flavors,
                    "demand": dict(admission.demand),
                    "borrowing": admission.borrowing,
                },
            )
        )
        allocations.extend(
            Allocation(job_id=job.pk, device=devices[p.device_id], rank=rank, started_at=now)
            for rank, p in enumerate(admission.devices)
        )
        admitted.append(job.pk)
        transaction.on_commit(functools.partial(tasks.provision_job.delay, job.pk), robust=True)
    JobEvent.objects.bulk_create(events)
    Allocation.objects.bulk_create(allocations)
    return admitted, requeued


def _record_waiting(waiting: Iterable[tuple[int, str]]) -> int:
    """Write each waiting job's reason where it changed, a thousand rows per statement.

    Reasons carry live figures ("6 of 8 in use"), so after a busy cycle most of them change; one
    UPDATE per job would cost more than the decision itself at 10,000 jobs.
    """
    wanted = {job_id: reason[:500] for job_id, reason in waiting}
    current = dict(TrainingJob.objects.filter(pk__in=wanted, state=JobState.QUEUED).values_list("pk", "pending_reason"))
    changed = [(job_id, reason) for job_id, reason in wanted.items() if job_id in current and current[job_id] != reason]
    table = connection.ops.quote_name(TrainingJob._meta.db_table)
    with connection.cursor() as cursor:
        for start in range(0, len(changed), 1000):
            chunk = changed[start : start + 1000]
            rows = ", ".join(["(%s, %s)"] * len(chunk))
            # VALUES names its columns column1, column2 on PostgreSQL and SQLite alike; both have
            # UPDATE ... FROM (SQLite since 3.33).
            cursor.execute(
                f"UPDATE {table} SET pending_reason = v.column2 FROM (VALUES {rows}) AS v "
                f"WHERE {table}.id = v.column1 AND {table}.state = %s",
                [value for row in chunk for value in row] + [JobState.QUEUED.value],
            )
    return len(wanted)


def _lock(*, wait: bool) -> bool:
    """Take the admission lock row for this transaction; without ``wait``, False when another
    cycle holds it. (SQLite has no row locks: its IMMEDIATE transactions serialize cycles anyway.)"""
    rows = AdmissionLock.objects.filter(pk=1)
    if connection.features.has_select_for_update_skip_locked:
        rows = rows.select_for_update(skip_locked=not wait)
    if list(rows.values_list("pk", flat=True)):  # evaluated, so the row lock is taken here
        return True
    if AdmissionLock.objects.filter(pk=1).exists():
        return False  # held by another cycle
    AdmissionLock.objects.get_or_create(pk=1)  # a flushed test database lost the row
    return _lock(wait=True)


def _cycle(tasks: Any) -> CycleReport:
    """Decide and apply, inside the caller's transaction and under the admission lock."""
    snapshot_at = timezone.now()
    snapshot = load_snapshot(snapshot_at)
    over_budget = _over_hard_budget({job.tenant_id for job in snapshot.pending}, snapshot_at)
    if over_budget:
        # A tenant past its hard budget admits nothing new; its queued jobs wait, saying why.
        snapshot = replace(snapshot, pending=[job for job in snapshot.pending if job.tenant_id not in over_budget])
    # Allocations start after the snapshot was read: an allocation that a concurrent finish
    # closed just before it must not appear to overlap its successor on the same device.
    now = timezone.now()
    started = time.perf_counter()
    result = schedule(snapshot, blend=settings.POLYCHIP_FAIR_SHARE_BLEND, policy=placement_policy())
    decide_s = time.perf_counter() - started

    preempted = [p.job_id for p in result.preemptions if _preempt(p, now)]
    making_room: list[tuple[int, str]] = []
    for admission in result.admissions:
        if admission.preempts:
            # Evict first, admit later (as Kueue does): the victims' devices are free only once
            # the backend confirms their runs stopped, and a later cycle admits this job.
            victims = ", ".join(str(v) for v in admission.preempts)
            making_room.append((admission.job_id, f"making room: preempting job {victims}"))
    admitted, requeued = _admit_all((a for a in result.admissions if not a.preempts), now)
    budget_waiting = [(job_id, over_budget[tenant_id]) for job_id, tenant_id in _queued_of(over_budget)]
    waiting = _record_waiting([*making_room, *budget_waiting, *((w.job_id, w.reason) for w in result.waiting)])
    if making_room:
        transaction.on_commit(tasks.admit_queued_jobs.delay, robust=True)
    AdmissionLock.objects.filter(pk=1).update(last_cycle_at=now)
    return CycleReport(
        admitted=tuple(admitted),
        preempted=tuple(preempted),
        waiting=waiting,
        requeued=tuple(requeued),
        decide_s=decide_s,
        snapshot_at=snapshot_at,
        decided=tuple(job.job_id for job in snapshot.pending),
    )


def _over_hard_budget(tenant_ids: set[int], now: datetime) -> dict[int, str]:
    """Tenants among ``tenant_ids`` whose spend this month reached their hard budget, with the reason."""
    from jobs.services import open_usage

    budgeted = billing.tenants_with_budgets(tenant_ids) if tenant_ids else []
    if not budgeted:
        return {}
    statuses = billing.check_budgets(budgeted, open_usage(budgeted), now=now)
    return {tenant_id: billing.hard_budget_reason(s) for tenant_id, s in statuses.items() if s.hard_reached}


def _queued_of(tenants: Mapping[int, str]) -> list[tuple[int, int]]:
    if not tenants:
        return []
    return list(
        TrainingJob.objects.filter(state=JobState.QUEUED, tenant_id__in=list(tenants)).values_list("pk", "tenant_id")
    )


def run_admission_cycle() -> CycleReport:
    """One cycle, waiting for the lock if another cycle runs."""
    from jobs import tasks

    with transaction.atomic():
        _lock(wait=True)
        report = _cycle(tasks)
    _notify(report)
    return report


def admit() -> list[int]:
    """Admit what can be admitted now, coalescing with cycles that other workers run.

    Every submission and every ended job asks for a cycle. Rather than queue one cycle per request
    behind the lock, a request is written down first; a worker that finds the lock taken leaves,
    and the worker holding it runs once more if a request arrived after its snapshot. A request
    is never lost: it is written before the lock is tried, and the holder reads requests only
    after it let the lock go. Returns the ids this worker admitted.
    """
    from jobs import tasks

    if not TrainingJob.objects.filter(state=JobState.QUEUED).exists():
        return []  # nothing waits: the sweep's request every second costs one indexed read
    requested = timezone.now()
    if not AdmissionRequest.objects.filter(pk=1).update(requested_at=requested):
        AdmissionRequest.objects.update_or_create(pk=1, defaults={"requested_at": requested})
    admitted: list[int] = []
    while True:
        with transaction.atomic():
            if not _lock(wait=False):
                return admitted  # the holder will see our request
            report = _cycle(tasks)
        _notify(report)
        admitted.extend(report.admitted)
        latest = AdmissionRequest.objects.filter(pk=1).values_list("requested_at", flat=True).first()
        if latest is None or latest < report.snapshot_at:
            return admitted


# Called after each cycle commits, with its report (benchmarks and metrics listen here).
cycle_listeners: list[Callable[[CycleReport], None]] = []


def _notify(report: CycleReport) -> None:
    for listener in cycle_listeners:
        listener(report)
