"""Asking a running job to move: checkpoint, stop at a step, and start its next attempt elsewhere or on
another count (``recovery.handle_stop`` then places it). A drain, growing back, the elastic round's
resizes and admission's shrinking of an elastic victim all ask here; admission sits below recovery, so
the asking lives below both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from django.db import transaction
from django.utils import timezone

from jobs import locks, transitions
from jobs.backends import get_backend
from jobs.models import JobAttempt, JobEvent, JobState, TrainingJob
from runtime.backends.base import Backend

# How long a run asked to stop gets before the platform stops waiting for it (a preempted run's teardown,
# a shrink that a preempting job waits for); a backend whose stop takes longer to arrive says its own.
STOP_WINDOW_S = 20.0


def stop_window_s(backend: Backend | None = None) -> float:
    return float(getattr(backend or get_backend(), "stop_window_s", STOP_WINDOW_S))


def _running_attempt(job_id: int) -> tuple[TrainingJob, JobAttempt] | None:
    """The job and its current attempt, both locked, when it runs and its run has launched."""
    job = locks.job(job_id)
    if job is None or job.state != JobState.RUNNING:
        return None
    run = locks.attempt(job_id, job.attempt)
    if run is None or not run.backend_handle:
        return None
    return job, run


def _ask_to_move(
    job: TrainingJob, run: JobAttempt, reason: str, resize_to: int | None, resize_flavors: Sequence[str] | None
) -> None:
    run.stop_requested = reason[:300]
    run.stop_asked_at = timezone.now()
    run.resize_to = resize_to
    run.resize_flavors = list(resize_flavors) if resize_flavors else None
    run.save(update_fields=["stop_requested", "stop_asked_at", "resize_to", "resize_flavors"])
    asked: dict[str, object] = {"resize_to": resize_to} if resize_to else {}
    if resize_flavors:
        asked["resize_flavors"] = list(resize_flavors)
    transitions.record_event(
        job,
        kind=JobEvent.Kind.RECOVERY,
        message=f"asked to checkpoint and move: {reason}",
        data={"stop_requested": reason[:300], **asked},
    )
    handle = cast(dict[str, Any], run.backend_handle)  # a launched run's: _running_attempt checked it
    transaction.on_commit(lambda: get_backend().request_stop(handle, reason), robust=True)


def request_move(
    job_id: int, reason: str, *, resize_to: int | None = None, resize_flavors: Sequence[str] | None = None
) -> bool:
    """Ask a running job to checkpoint and stop so that it can move (a drain, growing back, a
    predicted failure, an elastic resize to ``resize_to`` devices, on ``resize_flavors`` when the round
    moves it to other chips). False when it is not running or already asked."""
    with transaction.atomic():
        found = _running_attempt(job_id)
        if found is None or found[1].stop_requested:
            return False
        _ask_to_move(*found, reason, resize_to, resize_flavors)
    return True


def request_shrink(job_id: int, keep: int, reason: str) -> bool:
    """Ask a running elastic job to move onto ``keep`` devices. A job already asked to move goes on with
    that move, on no more than ``keep`` and on its own flavors (its next attempt reads both when it is
    placed). False when it cannot shrink so, and the caller stops it whole: it is not running, its run
    has not launched yet, or a move asked of it more than ``stop_window_s`` ago has not happened (a
    hung run, or a stop that never reached it, must not keep the job that made room waiting)."""
    with transaction.atomic():
        found = _running_attempt(job_id)
        if found is None:
            return False
        job, run = found
        if not run.stop_requested:
            _ask_to_move(job, run, reason, keep, None)
            return True
        asked_at = run.stop_asked_at
        if asked_at is not None and (timezone.now() - asked_at).total_seconds() > stop_window_s():
            return False
        if run.resize_to is None or run.resize_to > keep or run.resize_flavors:
            # The flavors a round was moving it to may be the ones the job that made room counts on.
            run.resize_to = min(keep, run.resize_to or keep)
            run.resize_flavors = None
            run.save(update_fields=["resize_to", "resize_flavors"])
            transitions.record_event(
                job,
                kind=JobEvent.Kind.RECOVERY,
                message=f"its move goes on, onto no more than {run.resize_to} devices: {reason}",
                data={"resize_to": run.resize_to},
            )
    return True
