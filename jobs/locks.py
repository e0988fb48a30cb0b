"""Every row lock the jobs app takes, and the one order it takes them in.

1. the admission lock (one row): a cycle holds it from reading its snapshot of free devices to
   committing its allocations, and anything that hands out or takes away devices takes it first;
2. jobs, in primary-key order;
3. a job's attempts;
4. devices, in device-id order;
5. throughput entries, then a job's own throughput observations.

A transaction that needs several takes them top to bottom, so two of them never wait on each
other in a circle. No other module of the app calls ``select_for_update``. On SQLite these are
no-ops: its write transactions serialize anyway.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import connection
from django.db.models import QuerySet

from jobs.models import (
    AdmissionLock,
    AdmissionWait,
    Device,
    JobAttempt,
    ThroughputEntry,
    ThroughputObservation,
    TrainingJob,
)


def admission_lock(*, wait: bool = True) -> bool:
    """Take the admission lock row for this transaction; without ``wait``, False when another
    cycle holds it."""
    rows = AdmissionLock.objects.filter(pk=1)
    if connection.features.has_select_for_update_skip_locked:
        rows = rows.select_for_update(skip_locked=not wait)
    if list(rows.values_list("pk", flat=True)):  # evaluated, so the row lock is taken here
        return True
    if AdmissionLock.objects.filter(pk=1).exists():
        return False  # held by another cycle
    AdmissionLock.objects.get_or_create(pk=1)  # a database emptied without post_migrate lost the row
    return admission_lock(wait=True)


def ensure_admission_lock_row(*, using: str, apps: Any = None, **_: Any) -> None:
    """post_migrate: the lock's row exists after every migrate and every flush (migration 0002 made it
    once; a flush empties the table and then sends post_migrate, as it does for content types). Without
    the row, the first cycle after a flush would be taken for the first cycle ever, and a request that an
    earlier request covers would run a cycle of its own."""
    try:  # a flush sends no migration state (apps): its models are the current ones
        model = AdmissionLock if apps is None else apps.get_model("jobs", "AdmissionLock")
    except LookupError:  # migrated back to before the lock existed
        return
    model.objects.using(using).get_or_create(pk=1)


def job(job_id: int) -> TrainingJob | None:
    """One job's row, locked; None when there is no such job."""
    return TrainingJob.objects.select_for_update().filter(pk=job_id).first()


def jobs(job_ids: Iterable[int], *, fields: tuple[str, ...] = ()) -> dict[int, TrainingJob]:
    """Several jobs' rows, locked in primary-key order (so that two callers never deadlock)."""
    rows = TrainingJob.objects.select_for_update().filter(pk__in=sorted(set(job_ids))).order_by("pk")
    if fields:
        rows = rows.only(*fields)
    return {row.pk: row for row in rows}


def admission_waits(tenant_ids: Iterable[int]) -> list[AdmissionWait]:
    """The tenants' admission-wait histogram rows, locked in primary-key order (after the admission lock)."""
    return list(AdmissionWait.objects.select_for_update().filter(tenant_id__in=sorted(set(tenant_ids))).order_by("pk"))


def attempt(job_id: int, number: int) -> JobAttempt | None:
    """One attempt's row, locked (after its job's, when both are needed)."""
    return JobAttempt.objects.select_for_update().filter(job_id=job_id, number=number).first()


def devices(rows: QuerySet[Device]) -> QuerySet[Device]:
    """The devices of ``rows``, to be locked in device-id order when evaluated."""
    return rows.select_for_update().order_by("device_id")


def throughput_entries(rows: QuerySet[ThroughputEntry]) -> QuerySet[ThroughputEntry]:
    """The throughput entries of ``rows``, to be locked when evaluated."""
    return rows.select_for_update()


def throughput_observations(rows: QuerySet[ThroughputObservation]) -> QuerySet[ThroughputObservation]:
    """A job's throughput observations in ``rows``, to be locked when evaluated (after the entry)."""
    return rows.select_for_update()
