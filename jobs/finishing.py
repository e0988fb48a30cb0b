"""Ending a job: the terminal claim, its allocations closed and metered, its run torn down."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction
from django.utils import timezone

from jobs import dispatch, locks, transitions
from jobs.errors import InvalidTransition
from jobs.metering import end_allocations
from jobs.models import TERMINAL_STATES, JobAttempt


def finish_job(
    job_id: int,
    state: str,
    *,
    reason: str = "",
    message: str = "",
    from_states: Iterable[str] | None = None,
    attempt: int | None = None,
    credit_reason: str = "",
) -> bool:
    """End a job in a terminal state (from any state the table allows, or ``from_states``), closing
    its allocations and metering their usage; True when this call ended it.

    Whoever speaks for one attempt (an observer, a launcher) passes it, so that news of a preempted
    attempt never ends the job's next one.
    """
    if state not in TERMINAL_STATES:
        raise InvalidTransition(f"{state} is not a terminal state")
    with transaction.atomic():
        # Lock first, then read the clock: an admission that committed just before must not have
        # started an allocation after the moment this one ends it.
        locked = locks.job(job_id)
        now = timezone.now()
        job = transitions.claim(
            job_id,
            state,
            locked=locked,
            from_states=from_states,
            attempt=attempt,
            message=message or reason or state,
            data={"reason": reason} if reason else None,
            finished_at=now,
            failure_reason=reason,
        )
        if job is None:
            return False
        transitions.end_attempt(job_id, job.attempt, now=now, ended_as=state, reason=message or reason or state)
        end_allocations(job, now, credit_reason=credit_reason)
        if JobAttempt.objects.filter(job_id=job_id, backend_handle__isnull=False, torn_down_at__isnull=True).exists():
            dispatch.after_commit(dispatch.TEARDOWN, job_id)
        dispatch.after_commit(dispatch.ADMIT)
    return True
