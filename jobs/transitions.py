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
    return JobEvent.objects.create(
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
    **fields: Any,
) -> TrainingJob | None:
    """Move a job to ``to_state`` from one of ``from_states`` (default: every state the table lets
    reach it); None when another worker got there first or the job is elsewhere.

    With ``attempt``, the claim holds only for that attempt (a launcher or an observer of an attempt
    that was preempted or recovered meanwhile must not move the next one); ``next_attempt`` makes
    the move end the current attempt and start the next (``previous_devices``: what a restart should
    prefer). Must run inside a transaction.
    """
    sources = _checked_sources(from_states, to_state)
    job = locks.job(job_id)
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
    job.refresh_from_db()
    record_event(job, kind=JobEvent.Kind.TRANSITION, from_state=previous, to_state=to_state, message=message, data=data)
    return job


@dataclass(frozen=True)
class BulkMove:
    """One job's part of a bulk claim: its fields, its event's message and data."""

    job_id: int
    fields: Mapping[str, Any]
    message: str
    data: Mapping[str, Any]


def claim_many(
    moves: Iterable[BulkMove], from_state: str, to_state: str, *, now: datetime
) -> tuple[list[TrainingJob], list[int]]:
    """The bulk form of ``claim`` for an admission cycle: the rows locked in id order, one
    conditional UPDATE each, the events in one insert. Returns (the jobs moved, ids whose claim
    failed: they stay where they are, and the next cycle decides again)."""
    moves = list(moves)
    if not allowed(from_state, to_state):
        raise ValueError(f"the transition table does not allow {from_state} -> {to_state}")
    if not moves:
        return [], []
    locked = locks.jobs((m.job_id for m in moves), fields=("pk", "state", "tenant_id", "attempt"))
    won: list[TrainingJob] = []
    lost: list[int] = []
    events: list[JobEvent] = []
    for move in moves:
        job = locked.get(move.job_id)
        if (
            job is None
            or job.state != from_state
            or TrainingJob.objects.filter(pk=job.pk, state=from_state).update(
                state=to_state, state_changed_at=now, **move.fields
            )
            != 1
        ):
            lost.append(move.job_id)
            continue
        events.append(
            JobEvent(
                job_id=job.pk,
                tenant_id=job.tenant_id,
                kind=JobEvent.Kind.TRANSITION,
                from_state=from_state,
                to_state=to_state,
                message=move.message[:500],
                data=dict(move.data),
            )
        )
        won.append(job)
    JobEvent.objects.bulk_create(events)
    return won, lost
