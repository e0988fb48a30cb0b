"""What would let a waiting job start, in the terms its tenant can act on.

For each flavor the job accepts: how many devices it asks for, how many are free and in service now,
and when the jobs that hold the rest are expected to give back enough of them, each job's end
estimated from the steps it has left and its measured speed. A quota wait also lists the tenant's
own running jobs and when each ends, since their share comes back then.

Estimates, not promises: jobs ahead in the queue (this tenant's or, by fair share, another's) take
freed devices first, a job may fail or be preempted, and a job that has not reported a step yet has
no estimate. Other tenants' jobs are not named.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from django.db.models import Count, Q
from django.utils import timezone

from jobs.contracts import HolderOutlook, StartFlavorOutlook, StartOutlookView
from jobs.errors import JobNotFound
from jobs.models import Allocation, Device, JobState, TrainingJob
from jobs.pool import SCHEDULABLE
from jobs.queries import queue_position

# A quota refusal says so in these words (runtime.scheduling.quota); a capacity wait does not.
_QUOTA_WORDS = ("your tenant", "no quota for")


def _expected_end(job: TrainingJob, now: datetime) -> datetime | None:
    """When a running job should finish: its steps left at its measured speed (None: not measured)."""
    batch = job.job_spec.workload.global_batch
    if job.state != JobState.RUNNING or not job.samples_per_s or batch <= 0:
        return None
    steps_left = max(0, job.total_steps - job.steps_done)
    return now + timedelta(seconds=steps_left * batch / job.samples_per_s)


def _when_enough(holders: list[HolderOutlook], lacking: int) -> datetime | None:
    """The time by which the holders give back ``lacking`` devices, ending soonest first."""
    freed = 0
    for holder in sorted(holders, key=lambda h: (h.expected_end is None, h.expected_end)):
        if holder.expected_end is None:
            return None
        freed += holder.devices
        if freed >= lacking:
            return holder.expected_end
    return None


def _shown(holders: list[HolderOutlook]) -> tuple[HolderOutlook, ...]:
    """The holders as the tenant sees them: its own jobs one by one, soonest to end first; other
    tenants' jobs as one line (their devices summed, no end time), which tells neither their number,
    their size nor their progress."""
    own = sorted((h for h in holders if h.job_id is not None), key=lambda h: (h.expected_end is None, h.expected_end))
    others = sum(h.devices for h in holders if h.job_id is None)
    return (*own, *([HolderOutlook(job_id=None, devices=others, expected_end=None)] if others else []))


def start_outlook(*, tenant_id: int, job_id: int, now: datetime | None = None) -> StartOutlookView:
    now = now or timezone.now()
    job = TrainingJob.scoped.for_tenant(tenant_id).filter(pk=job_id).first()
    if job is None:
        raise JobNotFound(job_id)
    if job.state != JobState.QUEUED:
        return StartOutlookView(job_id=job.pk, waiting=False, reason="", position=None)
    needed = job.job_spec.devices
    flavors = list(job.job_spec.flavors)
    in_service = dict(
        Device.objects.filter(flavor__name__in=flavors, health__in=SCHEDULABLE)
        .values("flavor__name")
        .annotate(n=Count("pk"))
        .values_list("flavor__name", "n")
    )
    held = (
        Allocation.objects.filter(ended_at__isnull=True, device__flavor__name__in=flavors)
        .values("job_id", "device__flavor__name")
        .annotate(n=Count("pk", filter=Q(device__health__in=SCHEDULABLE)))
    )
    by_flavor: dict[str, dict[int, int]] = defaultdict(dict)
    for row in held:
        by_flavor[row["device__flavor__name"]][row["job_id"]] = row["n"]
    holding = {j.pk: j for j in TrainingJob.objects.filter(pk__in={i for d in by_flavor.values() for i in d})}
    outlooks = []
    for flavor in flavors:
        total = in_service.get(flavor, 0)
        holders = [
            HolderOutlook(
                job_id=holder_id if holding[holder_id].tenant_id == tenant_id else None,
                devices=count,
                expected_end=_expected_end(holding[holder_id], now),
            )
            for holder_id, count in sorted(by_flavor[flavor].items())
            if count
        ]
        free = total - sum(h.devices for h in holders)
        lacking = max(0, needed - free)
        outlooks.append(
            StartFlavorOutlook(
                flavor=flavor,
                in_service=total,
                free=free,
                lacking=lacking,
                never=needed > total,
                expected_at=None if needed > total else (now if not lacking else _when_enough(holders, lacking)),
                holders=_shown(holders),
            )
        )
    quota_blocked = any(word in job.pending_reason for word in _QUOTA_WORDS)
    own_running: tuple[HolderOutlook, ...] = ()
    if quota_blocked:
        mine = TrainingJob.objects.filter(tenant_id=tenant_id, state__in=(JobState.RUNNING, JobState.ADMITTED))
        held_now = Count("allocations", filter=Q(allocations__ended_at__isnull=True))
        own_running = tuple(
            HolderOutlook(job_id=j.pk, devices=j.held_now, expected_end=_expected_end(j, now))
            for j in mine.annotate(held_now=held_now).order_by("pk")
        )
    return StartOutlookView(
        job_id=job.pk,
        waiting=True,
        reason=job.pending_reason,
        position=queue_position(job),
        flavors=tuple(outlooks),
        quota_blocked=quota_blocked,
        own_running=own_running,
    )
