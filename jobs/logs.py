"""A job's logs: which attempt's, read through the backend from the attempt's handle, and followed.

Every attempt is a run of its own with its own logs (its backend handle is on its ``JobAttempt`` row,
numbered from 0 as ``TrainingJob.attempt`` counts them). The backend keeps each rank's output under a
size cap and reads it (``runtime.backends.base.Backend.logs``); this module only finds the run and,
for a follower, keeps reading until the run has ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async

from controlplane.domain import Invalid, NotFound
from jobs.backends import get_backend
from jobs.errors import JobNotFound
from jobs.models import TERMINAL_STATES, JobAttempt, TrainingJob
from runtime.backends.base import LogPage, Phase

# How often a follower looks for new lines, and for a run to start when its attempt has none yet.
FOLLOW_POLL_S = 0.2
WAIT_FOR_RUN_S = 1.0
_ENDED = (Phase.SUCCEEDED, Phase.FAILED, Phase.STOPPED, Phase.GONE)


@dataclass(frozen=True)
class AttemptLogs:
    """Where one attempt's logs are: its number and its backend handle (None: it never ran)."""

    job_id: int
    attempt: int | None  # None: the job has no attempt at all
    handle: dict[str, Any] | None


def attempt_logs(*, tenant_id: int, job_id: int, attempt: int | None = None) -> AttemptLogs:
    """The tenant's job's attempt (the newest when ``attempt`` is None); ``JobNotFound`` for another
    tenant's job, ``NotFound`` naming ``attempt`` for an attempt the job does not have."""
    job = TrainingJob.scoped.for_tenant(tenant_id).filter(pk=job_id).first()
    if job is None:
        raise JobNotFound(job_id)
    attempts = JobAttempt.objects.filter(job_id=job_id)
    row = attempts.filter(number=attempt).first() if attempt is not None else attempts.order_by("-number").first()
    if row is None and attempt is not None:
        raise NotFound(
            f"job {job_id} has no attempt {attempt} (attempts count from 0; it is on {job.attempt})", field="attempt"
        )
    return AttemptLogs(job_id, row.number if row else None, row.backend_handle if row else None)


def read_logs(
    logs: AttemptLogs,
    *,
    rank: int | None = None,
    since: str | float | None = None,
    limit: int = 1000,
    tail: int | None = None,
) -> LogPage:
    """A page of the attempt's logs (see ``Backend.logs``); an empty page for an attempt that never ran.
    ``Invalid`` naming ``since`` for a cursor that is not one."""
    backend = get_backend()
    handle = logs.handle
    if handle is None or handle.get("backend") != backend.name:
        return LogPage((), since if isinstance(since, str) else "")
    try:
        return backend.logs(handle, rank=rank, since=since, limit=limit, tail=tail)
    except ValueError as exc:
        raise Invalid(f"since: {exc}", field="since") from None


def _run_state(logs: AttemptLogs) -> tuple[dict[str, Any] | None, bool]:
    """The attempt's handle now, and whether the attempt is over without one."""
    if logs.attempt is None:
        return None, True
    row = JobAttempt.objects.filter(job_id=logs.job_id, number=logs.attempt).select_related("job").first()
    if row is None:
        return None, True
    return row.backend_handle, row.ended_at is not None or row.job.state in TERMINAL_STATES


def _run_ended(handle: dict[str, Any]) -> bool:
    return get_backend().observe(handle).phase in _ENDED


async def follow_logs(
    logs: AttemptLogs, *, rank: int | None = None, since: str | float | None = None, poll_s: float = FOLLOW_POLL_S
) -> AsyncIterator[LogPage]:
    """Pages of the attempt's logs as they are written, from ``since`` on, until its run has ended and
    every line is out. An attempt that has not started yet is waited for; one that ended without a run
    gives nothing. Files and the database are read in threads: the event loop never blocks."""
    if logs.attempt is None:
        return
    handle = logs.handle
    while handle is None:
        handle, over = await sync_to_async(_run_state)(logs)
        if handle is None:
            if over:
                return
            await asyncio.sleep(WAIT_FOR_RUN_S)
    started = AttemptLogs(logs.job_id, logs.attempt, handle)
    cursor = since
    while True:
        # Whether the run had ended before this read: if so, this read has its last lines.
        ended = await asyncio.to_thread(_run_ended, handle)
        page = await asyncio.to_thread(read_logs, started, rank=rank, since=cursor)
        if page.lines or page.dropped:
            yield page
        cursor = page.cursor or cursor
        if page.more:
            continue
        if ended:
            return
        await asyncio.sleep(poll_s)
