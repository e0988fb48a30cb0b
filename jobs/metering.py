"""What jobs hold and what it costs: allocations closed into usage records (billing's outbox, in
the same transaction), the devices held now for budgets, what a placement charges a quota, and how
much of the held time trained nothing."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from django.db import connection
from django.db.models import Q
from django.utils import timezone

from billing import services as billing
from billing.contracts import OpenUsage, UsageInterval
from controlplane import bulk
from jobs.contracts import IdleUsage
from jobs.models import Allocation, Device, JobAttempt, TrainingJob
from jobs.throughput import nau_rates
from runtime.scheduling import NAU, FreeDevice
from runtime.scheduling.model import MILLI


def charge(job_class: str, devices: Iterable[FreeDevice], rates: Mapping[tuple[str, str], int]) -> dict[str, int]:
    """What holding ``devices`` charges a quota: devices per flavor, and milli-NAU."""
    demand: dict[str, int] = defaultdict(int)
    for device in devices:
        demand[device.flavor] += 1
        demand[NAU] += rates.get((job_class, device.flavor), MILLI)
    return dict(demand)


def open_allocations(gangs: Mapping[int, Sequence[str]], started_at: datetime) -> int:
    """Open an allocation of each job in ``gangs`` (job id -> its devices' names, rank order) on each of
    its devices, from ``started_at``; returns how many. On PostgreSQL one INSERT ... SELECT over three
    arrays (an admission cycle opens 9,000 at 10,000 queued jobs: building a model object for each, and
    reading the devices' keys out first, cost more than the insert). The open-allocation unique indexes
    are the guard against double-booking either way."""
    rows = [(job_id, name, rank) for job_id, names in gangs.items() for rank, name in enumerate(names)]
    if not rows:
        return 0
    if connection.vendor == "postgresql":
        allocation = connection.ops.quote_name(Allocation._meta.db_table)
        device = connection.ops.quote_name(Device._meta.db_table)
        with bulk.array_cursor() as cursor:
            # Only the quoted table names are spliced into the statement; every value goes as a parameter.
            cursor.execute(
                f"INSERT INTO {allocation} (job_id, device_id, rank, started_at) "  # noqa: S608
                f"SELECT v.job_id, d.id, v.rank, %b FROM unnest(%b::bigint[], %b::text[], %b::int[]) "
                f"AS v(job_id, name, rank) JOIN {device} d ON d.device_id = v.name",
                [started_at, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]],
            )
            opened = cursor.rowcount
    else:
        keys = dict(Device.objects.filter(device_id__in={r[1] for r in rows}).values_list("device_id", "pk"))
        opened = len(
            Allocation.objects.bulk_create(
                (
                    Allocation(job_id=job_id, device_id=keys[name], rank=rank, started_at=started_at)
                    for job_id, name, rank in rows
                    if name in keys
                ),
                batch_size=2000,
            )
        )
    if opened != len(rows):  # a device that left the pool mid-cycle: undo the cycle rather than part of it
        raise RuntimeError(f"opened {opened} of {len(rows)} allocations: a device is no longer in the pool")
    return opened


def end_allocations(job: TrainingJob, ended_at: datetime, *, credit_reason: str = "") -> int:
    """Close the job's open allocations and write their usage in the current transaction (billing's
    outbox goes with it, so the ledger learns of every interval exactly once). ``credit_reason``: the
    platform or a device ended this attempt, so its usage is credited on the invoice."""
    return end_allocations_of([job], ended_at, credit_reason=credit_reason)


def end_allocations_of(jobs: Sequence[TrainingJob], ended_at: datetime, *, credit_reason: str = "") -> int:
    """``end_allocations`` for several jobs at once, in a few statements (an admission cycle preempts
    dozens): the number of allocations closed."""
    by_pk = {job.pk: job for job in jobs}
    if not by_pk:
        return 0
    open_allocations = list(
        Allocation.objects.filter(job_id__in=list(by_pk), ended_at__isnull=True).select_related("device__flavor")
    )
    if not open_allocations:
        return 0
    for allocation in open_allocations:
        allocation.ended_at = ended_at
    Allocation.objects.bulk_update(open_allocations, ["ended_at"])
    rates = nau_rates({job.job_class for job in by_pk.values()})
    billing.record_usage(
        UsageInterval(
            key=f"allocation:{a.pk}",
            tenant_id=by_pk[a.job_id].tenant_id,
            job_id=a.job_id,
            device_id=a.device.device_id,
            flavor=a.device.flavor.name,
            started_at=a.started_at,
            ended_at=ended_at,
            nau_milli=rates.get((by_pk[a.job_id].job_class, a.device.flavor.name), 1000),
            credit_reason=credit_reason,
        )
        for a in open_allocations
    )
    return len(open_allocations)


def open_usage(tenant_ids: Iterable[int] | None = None) -> list[OpenUsage]:
    """The devices jobs hold now, for budgets: they cost money before any usage record exists.
    Billing asks for it through the source that ``JobsConfig.ready`` registers."""
    allocations = Allocation.objects.filter(ended_at__isnull=True)
    if tenant_ids is not None:
        allocations = allocations.filter(job__tenant_id__in=list(tenant_ids))
    rows = list(
        allocations.values_list("job__tenant_id", "job_id", "job__job_class", "device__flavor__name", "started_at")
    )
    rates = nau_rates({job_class for _, _, job_class, _, _ in rows}) if rows else {}
    return [
        OpenUsage(
            tenant_id=tenant_id,
            job_id=job_id,
            flavor=flavor,
            started_at=started_at,
            nau_milli=rates.get((job_class, flavor), 1000),
        )
        for tenant_id, job_id, job_class, flavor, started_at in rows
    ]


def allocated_ms() -> dict[tuple[int, str], int]:
    """Milliseconds held by closed allocations per (tenant, flavor), each counted exactly as billing
    counts the usage record it wrote (whole epoch milliseconds of the end less those of the start),
    so that a reconciliation compares like with like. Open allocations have no usage record yet."""
    totals: dict[tuple[int, str], int] = {}
    rows = Allocation.objects.filter(ended_at__isnull=False).values_list(
        "job__tenant_id", "device__flavor__name", "started_at", "ended_at"
    )
    for tenant_id, flavor, started_at, ended_at in rows.iterator(chunk_size=5000):
        if ended_at is not None:  # always: only closed ones were selected
            totals[(tenant_id, flavor)] = totals.get((tenant_id, flavor), 0) + billing.held_ms(started_at, ended_at)
    return totals


def training_windows(job_ids: Iterable[int]) -> dict[int, list[tuple[datetime, datetime]]]:
    """Each run's training window, per job: when its attempt reported its first and its latest step
    (kept on the attempt at ingest; the runs of one job never overlap in time)."""
    windows: dict[int, list[tuple[datetime, datetime]]] = defaultdict(list)
    for job_id, first, last in JobAttempt.objects.filter(
        job_id__in=list(job_ids), first_step_at__isnull=False
    ).values_list("job_id", "first_step_at", "last_step_at"):
        if first is not None and last is not None:  # set together, at the attempt's first step
            windows[job_id].append((first, last))
    return windows


def idle_usage(tenant_id: int, since: datetime, *, now: datetime | None = None) -> list[IdleUsage]:
    """The tenant's device time since ``since``, per flavor: held, and held while training nothing.

    A run trains between the first and the latest step it reports (``training_windows``); a device's
    time outside that window is idle: provisioning, starting the processes and loading the code,
    restoring a checkpoint, a run that failed before its first step, the wait for the last report to
    end it. Steps between two reports count as training, so this is a floor on what was wasted."""
    now = now or timezone.now()
    held = list(
        Allocation.objects.filter(job__tenant_id=tenant_id)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=since))
        .values_list("job_id", "device__flavor__name", "started_at", "ended_at")
    )
    windows = training_windows({job_id for job_id, *_ in held})
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for job_id, flavor, started_at, ended_at in held:
        start, end = max(started_at, since), min(ended_at or now, now)
        if end <= start:
            continue
        training = sum(
            max(0.0, (min(end, last) - max(start, first)).total_seconds()) for first, last in windows.get(job_id, ())
        )
        span = (end - start).total_seconds()
        totals[flavor][0] += span
        totals[flavor][1] += max(0.0, span - training)
    return [IdleUsage(flavor=f, held_s=round(h, 3), idle_s=round(i, 3)) for f, (h, i) in sorted(totals.items())]
