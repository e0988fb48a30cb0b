"""The admission loop's shell: load a capacity snapshot, let the pure scheduler decide, apply.

Kueue's shape: the queue manager, the capacity snapshot and the decisions live in
``runtime.scheduling`` as plain code; ``jobs.snapshot`` feeds them from the database and this module
persists what they decided. A cycle runs under the admission lock (one row, ``AdmissionLock``), so every cycle
sees the usage the previous one committed and a quota is never overshot however many submissions
race. Applying is a claim per job (a conditional UPDATE); a claim that fails leaves the job where
it was, and the next cycle decides again.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, F, QuerySet, Subquery
from django.utils import timezone

from billing import services as billing
from controlplane import bulk, compiled_queries
from controlplane.monitoring import priority_band
from jobs import dispatch, locks, moving, transitions
from jobs.metering import end_allocations_of, open_allocations, open_usage
from jobs.models import (
    AdmissionLock,
    AdmissionRequest,
    AdmissionWait,
    Allocation,
    JobAttempt,
    JobState,
    TrainingJob,
)
from jobs.snapshot import HOLDING_STATES, load_snapshot
from runtime.scheduling import NAU, Admission, PendingJob, Preemption, schedule
from runtime.scheduling.model import MILLI
from runtime.scheduling.policies import Policy, get_policy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CycleReport:
    admitted: tuple[int, ...]
    preempted: tuple[int, ...]
    shrunk: tuple[int, ...]  # elastic victims asked to move onto part of their devices, still running
    waiting: int
    requeued: tuple[int, ...]  # decided, but the claim failed; the next cycle decides again
    decide_s: float
    snapshot_at: datetime
    decided: tuple[int, ...]  # every queued job this cycle considered


def placement_policy() -> Policy | None:
    name = settings.POLYCHIP_PLACEMENT_POLICY
    return None if name in ("", "none") else get_policy(name)


# --- applying decisions -----------------------------------------------------------------------


# What a preempted job's row returns to: the queue, as its next attempt, with what the last one
# measured cleared.
_REQUEUED: dict[str, Any] = {
    "preemptions": F("preemptions") + 1,
    "admitted_at": None,
    "started_at": None,
    "demand": {},
    "borrowing": False,
    "steps_done": 0,
    "rank_stats": {},
    "balance_stats": {},
    "comm_stats": {},
    "samples_per_s": None,
    "pending_reason": "preempted; waiting to be admitted again",
}


def _merged(preemptions: Sequence[Preemption]) -> dict[int, Preemption]:
    """One preemption per victim: an elastic victim can shrink for one job and be shrunk again, or
    evicted, for another in the same cycle; the least it keeps holds (nothing, when one evicts it)."""
    merged: dict[int, Preemption] = {}
    for preemption in preemptions:
        earlier = merged.get(preemption.job_id)
        if earlier is None or (earlier.keep is not None and (preemption.keep or 0) < earlier.keep):
            merged[preemption.job_id] = preemption
    return merged


def _preempt_all(preemptions: Sequence[Preemption], now: datetime) -> tuple[list[int], list[int]]:
    """Make the victims give their devices back, in a few statements for them all (a cycle at scale
    preempts dozens): (the ids preempted, the ids shrunk). A preempted victim goes back to the queue as
    its next attempt. An elastic victim that gives back only part of its devices (``Preemption.keep``)
    keeps running: it is asked to move onto what it keeps (``moving.request_shrink``), and is preempted
    whole only when it cannot move (it has not launched yet). A victim that ended meanwhile has given
    its devices back already and is skipped."""
    if not preemptions:
        return [], []
    merged = _merged(preemptions)
    locked = locks.jobs(merged, fields=("pk", "state", "tenant_id", "attempt", "job_class"))
    victims: dict[int, Preemption] = {}
    shrunk: list[int] = []
    for job_id, p in merged.items():
        if job_id not in locked or locked[job_id].state not in HOLDING_STATES:
            continue
        if p.keep is not None and moving.request_shrink(job_id, p.keep, f"{p.reason} (for job {p.by_job_id})"):
            shrunk.append(job_id)
        else:
            victims[job_id] = p
    if not victims:
        return [], shrunk
    held: dict[int, list[str]] = defaultdict(list)
    open_allocations = Allocation.objects.filter(job_id__in=list(victims), ended_at__isnull=True).order_by("rank")
    for job_id, device_id in open_allocations.values_list("job_id", "device__device_id"):
        held[job_id].append(device_id)
    requeued: list[TrainingJob] = []
    for state in HOLDING_STATES:
        # The old attempt is asked to save a full checkpoint before it is torn down
        # (lifecycle.teardown_job), and the next attempt, which launches only once that is done, restores it.
        moves = [
            transitions.BulkMove(
                job_id=job_id,
                fields=_REQUEUED,
                message=f"{p.reason}; re-queued, asked to checkpoint first and resume from its newest checkpoint",
                data={"preempted_by": p.by_job_id, "attempt": locked[job_id].attempt + 1},
                previous_devices=tuple(held[job_id]),
            )
            for job_id, p in victims.items()
            if locked[job_id].state == state
        ]
        moved, _ = transitions.claim_many(moves, state, JobState.QUEUED, now=now, next_attempt=True)
        requeued += moved
    end_allocations_of(requeued, now)
    launched = JobAttempt.objects.filter(
        job_id__in=[job.pk for job in requeued], backend_handle__isnull=False
    ).values_list("job_id", "number")
    ended_attempt = {job.pk: job.attempt - 1 for job in requeued}
    dispatch.after_commit_each(
        dispatch.TEARDOWN, [(job_id,) for job_id, number in launched if ended_attempt[job_id] == number]
    )
    return [job.pk for job in requeued], shrunk


def _admit_all(admissions: Iterable[Admission], now: datetime) -> tuple[list[int], list[int]]:
    """Claim the decided jobs and give them their devices: (admitted ids, ids whose claim failed).

    One bulk claim (rows locked in id order, so a cancel that races waits or wins cleanly; each
    move a conditional UPDATE); allocations in one insert. Under the admission lock nobody else
    creates allocations, so the unique index on open allocations is a last guard that, if it ever
    fired, would undo the whole cycle rather than part of it.
    """
    decided = {a.job_id: a for a in admissions}
    if not decided:
        return [], []
    moves = []
    for admission in decided.values():
        flavors = list(dict.fromkeys(d.flavor for d in admission.devices))
        nau = admission.demand.get(NAU, 0) / MILLI
        moves.append(
            transitions.BulkMove(
                job_id=admission.job_id,
                fields={
                    "admitted_at": now,
                    "pending_reason": "",
                    "demand": dict(admission.demand),
                    "borrowing": admission.borrowing,
                },
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
    won, requeued = transitions.claim_many(moves, JobState.QUEUED, JobState.ADMITTED, now=now)
    open_allocations({job.pk: [p.device_id for p in decided[job.pk].devices] for job in won}, now)
    dispatch.after_commit_each(dispatch.PROVISION, [(job.pk,) for job in won])
    return [job.pk for job in won], requeued


def _record_waiting(waiting: Iterable[tuple[int, str]]) -> int:
    """Write each waiting job's reason where it changed, in one statement; returns how many wait.

    Reasons carry live figures ("6 of 8 in use"), so after a busy cycle most of them change; one
    UPDATE per job would cost more than the decision itself at 10,000 jobs. The comparison happens in
    the database, so the current reasons are never read out (8,500 of them at 10,000 queued jobs).
    """
    wanted = {job_id: (reason[:500],) for job_id, reason in waiting}
    bulk.update_rows(TrainingJob, ["pending_reason"], wanted, where={"state": JobState.QUEUED}, only_changed=True)
    return len(wanted)


# Upper bounds of polychip_admission_wait_seconds' buckets: from a second to a day.
WAIT_BUCKETS: tuple[float, ...] = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)


def _count_waits(admitted: Iterable[int], pending: Iterable[PendingJob], now: datetime) -> None:
    """Add each admitted job's wait since it last entered the queue to its tenant's and band's
    histogram (a preempted job's first wait was counted when it was first admitted; the admission
    lock is held, so no other cycle adds at the same time). Two statements whatever the number of
    tenants: the rows are read at once, then inserted or updated in one upsert."""
    by_id = {job.job_id: job for job in pending}
    waits: dict[tuple[int, str], list[float]] = defaultdict(list)
    for job_id in admitted:
        job = by_id.get(job_id)
        if job is not None:
            since = job.submitted_at if job.queued_at is None else job.queued_at
            waits[(job.tenant_id, priority_band(job.priority))].append(max(0.0, now.timestamp() - since))
    if not waits:
        return
    tenant_ids = sorted({tenant_id for tenant_id, _ in waits})
    current = {(row.tenant_id, row.band): row for row in locks.admission_waits(tenant_ids)}
    rows = []
    for (tenant_id, band), seconds in sorted(waits.items()):
        row = current.get((tenant_id, band))
        buckets = list(row.buckets) if row is not None and row.buckets else [0] * (len(WAIT_BUCKETS) + 1)
        for wait in seconds:
            for index, bound in enumerate(WAIT_BUCKETS):
                buckets[index] += wait <= bound
            buckets[-1] += 1
        count, sum_s = (row.count, row.sum_s) if row is not None else (0, 0.0)
        rows.append(
            AdmissionWait(
                tenant_id=tenant_id, band=band, buckets=buckets, count=count + len(seconds), sum_s=sum_s + sum(seconds)
            )
        )
    # One upsert for new and existing rows alike, where bulk_update built a CASE expression per row.
    AdmissionWait.objects.bulk_create(
        rows, update_conflicts=True, unique_fields=["tenant", "band"], update_fields=["buckets", "count", "sum_s"]
    )


def _cycle() -> CycleReport:
    """Decide and apply, inside the caller's transaction and under the admission lock."""
    snapshot_at = timezone.now()
    snapshot = load_snapshot(snapshot_at)
    over_budget = over_hard_budget({job.tenant_id for job in snapshot.pending}, snapshot_at)
    if over_budget:
        # A tenant past its hard budget admits nothing new; its queued jobs wait, saying why.
        snapshot = replace(snapshot, pending=[job for job in snapshot.pending if job.tenant_id not in over_budget])
    # Allocations start after the snapshot was read: an allocation that a concurrent finish
    # closed just before it must not appear to overlap its successor on the same device.
    now = timezone.now()
    started = time.perf_counter()
    result = schedule(snapshot, blend=settings.POLYCHIP_FAIR_SHARE_BLEND, policy=placement_policy())
    decide_s = time.perf_counter() - started

    preempted, shrunk = _preempt_all(result.preemptions, now)
    making_room: list[tuple[int, str]] = []
    for admission in result.admissions:
        if admission.preempts:
            # Evict first, admit later (as Kueue does): the victims' devices are free only once
            # the backend confirms their runs stopped (or moved onto less), and a later cycle admits this job.
            evicting = ", ".join(str(v) for v in admission.preempts if v not in shrunk)
            shrinking = ", ".join(str(v) for v in admission.preempts if v in shrunk)
            parts = [f"preempting job {evicting}"] if evicting else []
            parts += [f"shrinking elastic job {shrinking}"] if shrinking else []
            making_room.append((admission.job_id, f"making room: {' and '.join(parts)}"))
    admitted, requeued = _admit_all((a for a in result.admissions if not a.preempts), now)
    _count_waits(admitted, snapshot.pending, now)
    budget_waiting = [(job_id, over_budget[tenant_id]) for job_id, tenant_id in _queued_of(over_budget)]
    waiting = _record_waiting([*making_room, *budget_waiting, *((w.job_id, w.reason) for w in result.waiting)])
    if preempted:
        # The victims' devices are released soon: the next cycle keeps the quota of the job that made room.
        # A victim that only shrinks asks for a cycle itself once its move gives the devices back
        # (``recovery``); asking now would spin cycles that decide the same shrink until then.
        dispatch.after_commit(dispatch.ADMIT)
    cycle_s = (timezone.now() - snapshot_at).total_seconds()
    # served_at: every request sent before the snapshot was read is served once this commits (``admit``).
    AdmissionLock.objects.filter(pk=1).update(last_cycle_at=now, last_cycle_s=cycle_s, served_at=snapshot_at)
    return CycleReport(
        admitted=tuple(admitted),
        preempted=tuple(preempted),
        shrunk=tuple(shrunk),
        waiting=waiting,
        requeued=tuple(requeued),
        decide_s=decide_s,
        snapshot_at=snapshot_at,
        decided=tuple(job.job_id for job in snapshot.pending),
    )


def over_hard_budget(tenant_ids: set[int], now: datetime, *, raise_alerts: bool = True) -> dict[int, str]:
    """Tenants among ``tenant_ids`` whose spend this month reached their hard budget, with the reason.
    The cycle raises budget alerts as budgets are crossed; a preview (``raise_alerts=False``) does not."""
    budgeted = billing.tenants_with_budgets(tenant_ids) if tenant_ids else []
    if not budgeted:
        return {}
    rate = billing.check_budgets if raise_alerts else billing.rate_budgets
    statuses = rate(budgeted, open_usage(budgeted), now=now)
    return {tenant_id: billing.hard_budget_reason(s) for tenant_id, s in statuses.items() if s.hard_reached}


def _queued_of(tenants: Mapping[int, str]) -> list[tuple[int, int]]:
    if not tenants:
        return []
    return list(
        TrainingJob.objects.filter(state=JobState.QUEUED, tenant_id__in=list(tenants)).values_list("pk", "tenant_id")
    )


def run_admission_cycle() -> CycleReport:
    """One cycle, waiting for the lock if another cycle runs."""
    with transaction.atomic():
        dispatch.admit_requests_left_to_this_transaction()
        locks.admission_lock(wait=True)
        report = _cycle()
    _notify(report)
    return report


def admit(requested_at: float | None = None) -> list[int]:
    """Admit what can be admitted now, coalescing with cycles that other workers run.

    Every submission and every ended job asks for a cycle. Rather than queue one cycle per request
    behind the lock, a request is written down first; a worker that finds the lock taken leaves,
    and the worker holding it runs once more if a request arrived, or a job was submitted, after its
    snapshot. A request is never lost: it is written before the lock is tried, and the holder reads
    requests only after it let the lock go. Returns the ids this worker admitted.

    ``requested_at`` (seconds since the epoch): when the request was sent, after the requester's
    commit (or, where requests coalesce, when this worker took it: ``dispatch.take_admission_request``).
    A cycle that read its snapshot later has seen that change; once such a cycle has committed, the
    request is served and costs one read. Without it (beat's sweep) a cycle runs.
    Clocks of different hosts may disagree: a request skipped by mistake waits for the sweep's
    next cycle (a second), and is never lost.
    """
    requested_at = dispatch.take_admission_request(requested_at)
    if not _waiting_and_unserved(requested_at):
        return []  # nothing waits, or a later cycle decided: one indexed read
    requested = timezone.now()
    if not AdmissionRequest.objects.filter(pk=1).update(requested_at=requested):
        AdmissionRequest.objects.update_or_create(pk=1, defaults={"requested_at": requested})
    admitted: list[int] = []
    while True:
        with transaction.atomic():
            if not locks.admission_lock(wait=False):
                return admitted  # the holder will see our request
            report = _cycle()
        _notify(report)
        admitted.extend(report.admitted)
        if not _asked_since(report.snapshot_at):
            return admitted


def _asked_since(moment: datetime) -> bool:
    """Whether, since ``moment`` (a cycle's snapshot), a request for admission was written down or a job
    was submitted: the holder then runs once more. In a burst, a submission's own request may wait in
    the broker behind the burst's others for tens of milliseconds; the job is already there to decide.
    (A job stamped before the snapshot but committed after it is not seen here; its request asks.)"""
    # Stamped by other hosts' clocks: one running ahead could otherwise keep the holder cycling until it is
    # caught up with; past the clocks' slack, a stamp ahead of this host's clock is left to its request.
    since = (moment, timezone.now() + SERVED_SLACK)
    asked = AdmissionRequest.objects.filter(pk=1, requested_at__range=since)
    submitted = TrainingJob.objects.filter(state=JobState.QUEUED, created_at__range=since)
    return (
        AdmissionLock.objects.filter(pk=1)
        .annotate(asked=Exists(asked) | Exists(submitted))
        .values_list("asked", flat=True)
        .first()
        or False
    )


# The clocks of the requester's host and the worker's may disagree by this much: a request is served only
# by a cycle that read its snapshot this long after it was sent. A larger error delays a decision until
# the sweep's next cycle (a second), and loses nothing.
SERVED_SLACK = timedelta(milliseconds=50)


def _waiting_and_unserved(requested_at: float | None) -> bool:
    """Whether a job waits in the queue and, for a request sent at ``requested_at``, no cycle is sure to
    see what the requester committed: none that read its snapshot at or after then has committed, and no
    request written down at or after then is pending (whoever wrote it ran a cycle, or left it to the
    lock's holder, which runs once more for it). One indexed read: the sweep asks every second, and a
    burst of 64 submissions sends 64 requests, most of which a request written down in the burst covers.
    Two workers writing requests down at once may leave the earlier time (a worker stalled between
    reading the clock and writing); a request it covered then waits for the sweep's cycle, a second."""
    rows = compiled_queries.rows("jobs.admission.waiting_and_served", _waiting_and_served_query)
    if not rows:  # no cycle ran on this database yet
        return TrainingJob.objects.filter(state=JobState.QUEUED).exists()
    ((served_at, asked_at, waiting),) = rows
    if not waiting or requested_at is None:
        return bool(waiting)
    try:
        sent = datetime.fromtimestamp(requested_at, tz=UTC)
    except (TypeError, ValueError, OverflowError, OSError):  # from the broker: a stamp that is no time asks for a cycle
        return True
    seen_by = sent + SERVED_SLACK
    return (served_at is None or served_at < seen_by) and (asked_at is None or asked_at < seen_by)


def _waiting_and_served_query() -> QuerySet[AdmissionLock, tuple[Any, ...]]:
    queued = TrainingJob.objects.filter(state=JobState.QUEUED)
    asked = AdmissionRequest.objects.filter(pk=1).values("requested_at")
    return (
        AdmissionLock.objects.filter(pk=1)
        .annotate(asked_at=Subquery(asked), waiting=Exists(queued))
        .values_list("served_at", "asked_at", "waiting")
    )


# Called after each cycle commits, with its report (benchmarks and metrics listen here).
cycle_listeners: list[Callable[[CycleReport], None]] = []


def _notify(report: CycleReport) -> None:
    for listener in cycle_listeners:
        listener(report)
