"""The one way a job's state changes: a claim through the transition table, with its event.

A claim locks the job's row, checks its state (and, for whoever speaks for one attempt, that the
attempt is still the current one), and moves it with a conditional UPDATE whose row count says who
won; the event is appended in the same transaction. A move that ``TRANSITIONS`` does not list is
refused: asking for one is a programming error (``ValueError``); finding the job in a state from
which the move is not allowed is a lost race (the claim returns None).

Starting the next attempt is part of a claim (``next_attempt``): the attempt that ends gets its end
and reason, and the next one its row, in the same transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import F
from django.utils import timezone

from controlplane import bulk
from jobs import locks
from jobs.models import TRANSITIONS, JobAttempt, JobEvent, TrainingJob, sources_of


def record_event(
    job: TrainingJob,
    *,
    kind: str,
    from_state: str = "",
    to_state: str = "",
    message: str = "",
    data: dict[str, Any] | None = None,
) -> JobEvent:
    """Append an event to the job's log (in the caller's transaction)."""
    event = new_event(job, kind=kind, from_state=from_state, to_state=to_state, message=message, data=data)
    event.save()
    return event


def new_event(
    job: TrainingJob,
    *,
    kind: str,
    from_state: str = "",
    to_state: str = "",
    message: str = "",
    data: dict[str, Any] | None = None,
) -> JobEvent:
    """An event of the job's, not yet stored."""
    return JobEvent(
        job=job,
        tenant_id=job.tenant_id,
        kind=kind,
        from_state=from_state,
        to_state=to_state,
        message=message[:500],
        data=data or {},
    )


def allowed(from_state: str, to_state: str) -> bool:
    return to_state in TRANSITIONS.get(from_state, frozenset())


def _checked_sources(from_states: Iterable[str] | None, to_state: str) -> frozenset[str]:
    if from_states is None:
        return sources_of(to_state)
    sources = frozenset(from_states)
    refused = sorted(state for state in sources if not allowed(state, to_state))
    if refused:
        raise ValueError(f"the transition table does not allow {', '.join(refused)} -> {to_state}")
    return sources


def end_attempt(job_id: int, number: int, *, now: datetime, ended_as: str, reason: str) -> None:
    """Mark an attempt ended (once): when, into which state of the job, and why."""
    JobAttempt.objects.filter(job_id=job_id, number=number, ended_at__isnull=True).update(
        ended_at=now, ended_as=ended_as, end_reason=reason[:500]
    )


def _start_attempt(job_id: int, number: int, previous_devices: list[str] | None) -> None:
    JobAttempt.objects.get_or_create(
        job_id=job_id, number=number, defaults={"previous_devices": list(previous_devices or [])}
    )


def claim(
    job_id: int,
    to_state: str,
    *,
    message: str,
    from_states: Iterable[str] | None = None,
    data: dict[str, Any] | None = None,
    attempt: int | None = None,
    next_attempt: bool = False,
    previous_devices: list[str] | None = None,
    locked: TrainingJob | None = None,
    **fields: Any,
) -> TrainingJob | None:
    """Move a job to ``to_state`` from one of ``from_states`` (default: every state the table lets
    reach it); None when another worker got there first or the job is elsewhere.

    With ``attempt``, the claim holds only for that attempt (a launcher or an observer of an attempt
    that was preempted or recovered meanwhile must not move the next one); ``next_attempt`` makes
    the move end the current attempt and start the next (``previous_devices``: what a restart should
    prefer). ``locked``: the job's row as ``locks.job`` returned it, when the caller took that lock
    already in this transaction (a row read less). Must run inside a transaction.
    """
    sources = _checked_sources(from_states, to_state)
    job = locked if locked is not None and locked.pk == job_id else locks.job(job_id)
    if job is None or job.state not in sources or (attempt is not None and job.attempt != attempt):
        return None
    now = timezone.now()
    if next_attempt:
        fields["attempt"] = F("attempt") + 1
    won = TrainingJob.objects.filter(pk=job_id, state=job.state, attempt=job.attempt).update(
        state=to_state, state_changed_at=now, **fields
    )
    if won != 1:
        return None
    previous, number = job.state, job.attempt
    if next_attempt:
        end_attempt(job_id, number, now=now, ended_as=to_state, reason=message)
        _start_attempt(job_id, number + 1, previous_devices)
    # The row as the UPDATE left it, without reading it again: it is locked, so only these changed.
    job.state, job.state_changed_at, job.attempt = to_state, now, number + 1 if next_attempt else number
    computed = []
    for name, value in fields.items():
        if name == "attempt":
            continue
        if hasattr(value, "resolve_expression"):
            computed.append(name)
        else:
            setattr(job, name, value)
    if computed:  # what the database computed (an F(), a Now()) is read back
        job.refresh_from_db(fields=computed)
    record_event(job, kind=JobEvent.Kind.TRANSITION, from_state=previous, to_state=to_state, message=message, data=data)
    return job


@dataclass(frozen=True)
class BulkMove:
    """One job's part of a bulk claim: its fields, its event's message and data."""

    job_id: int
    fields: Mapping[str, Any]
    message: str
    data: Mapping[str, Any]
    # With ``claim_many(next_attempt=True)``: the devices the next attempt should prefer.
    previous_devices: tuple[str, ...] = ()


def claim_many(
    moves: Iterable[BulkMove], from_state: str, to_state: str, *, now: datetime, next_attempt: bool = False
) -> tuple[list[TrainingJob], list[int]]:
    """The bulk form of ``claim`` for an admission cycle: the rows locked in id order, moved in one
    UPDATE, the events in one insert. Returns (the jobs moved, ids whose claim
    failed: they stay where they are, and the next cycle decides again). ``next_attempt`` as for
    ``claim``: each job's current attempt ends (its move's message the reason) and the next starts."""
    moves = list(moves)
    if not allowed(from_state, to_state):
        raise ValueError(f"the transition table does not allow {from_state} -> {to_state}")
    if not moves:
        return [], []
    locked = locks.jobs((m.job_id for m in moves), fields=("pk", "state", "tenant_id", "attempt"))
    claimed = [(locked[m.job_id], m) for m in moves if m.job_id in locked and locked[m.job_id].state == from_state]
    lost = [m.job_id for m in moves if m.job_id not in locked or locked[m.job_id].state != from_state]
    if not claimed:
        return [], lost
    # The rows are locked and in ``from_state``: nothing can move them before this transaction ends, so
    # the claim is one UPDATE for them all, a row of values per job (a cycle claims a thousand jobs at
    # scale: one new version of each row, not one per statement), and one more only for what the
    # database computes (a counter's increment), which must then be the same for every job.
    keys = sorted({key for _, move in claimed for key in move.fields})
    computed = [key for key in keys if any(hasattr(move.fields.get(key), "resolve_expression") for _, move in claimed)]
    plain = [key for key in keys if key not in computed]
    expressions = {key: claimed[0][1].fields.get(key) for key in computed}
    if any(move.fields.get(key) != value for key, value in expressions.items() for _, move in claimed):
        raise ValueError(f"a bulk claim computes {', '.join(computed)} the same way for every job")
    moved = bulk.update_rows(
        TrainingJob,
        ["state", "state_changed_at", *plain],
        {job.pk: (to_state, now, *(move.fields.get(key) for key in plain)) for job, move in claimed},
        where={"state": from_state},
    )
    if moved != len(claimed):  # a row lock that did not hold: undo the cycle rather than part of it
        raise RuntimeError(f"claimed {moved} of {len(claimed)} locked jobs")
    if next_attempt:
        expressions["attempt"] = F("attempt") + 1
    if expressions:
        TrainingJob.objects.filter(pk__in=[job.pk for job, _ in claimed]).update(**expressions)
    # Stamped when written, as auto_now_add stamps one event: the push relay looks back from that
    # time for transactions that committed late (``queries.recent_events``).
    kind, written = JobEvent.Kind.TRANSITION, timezone.now()
    bulk.insert_rows(
        JobEvent,
        ["job", "tenant", "kind", "from_state", "to_state", "message", "data", "created_at"],
        (
            (job.pk, job.tenant_id, kind, from_state, to_state, move.message[:500], dict(move.data), written)
            for job, move in claimed
        ),
    )
    if next_attempt:
        _next_attempts(claimed, to_state, now)
    for job, _ in claimed:
        job.state = to_state
    return [job for job, _ in claimed], lost


def _next_attempts(claimed: list[tuple[TrainingJob, BulkMove]], to_state: str, now: datetime) -> None:
    """End each claimed job's current attempt and start its next, in three statements."""
    reasons = {job.pk: move.message[:500] for job, move in claimed}
    numbers = {job.pk: job.attempt for job, _ in claimed}
    ending = [
        attempt
        for attempt in JobAttempt.objects.filter(job_id__in=list(numbers), ended_at__isnull=True)
        if attempt.number == numbers[attempt.job_id]
    ]
    for attempt in ending:
        attempt.ended_at, attempt.ended_as, attempt.end_reason = now, to_state, reasons[attempt.job_id]
    JobAttempt.objects.bulk_update(ending, ["ended_at", "ended_as", "end_reason"])
    JobAttempt.objects.bulk_create(
        [
            JobAttempt(job_id=job.pk, number=job.attempt + 1, previous_devices=list(move.previous_devices))
            for job, move in claimed
        ],
        ignore_conflicts=True,  # as claim's get_or_create: an attempt row that exists already stays
    )
    for job, _ in claimed:
        job.attempt += 1
