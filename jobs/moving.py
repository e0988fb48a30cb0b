"""Asking a running job to move: checkpoint, stop at a step, and start its next attempt elsewhere or on
another count (``recovery.handle_stop`` then places it). A drain, growing back, the elastic round's
resizes and admission's shrinking of an elastic victim all ask here; admission sits below recovery, so
the asking lives below both.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import transaction
from django.utils import timezone

from jobs import locks, transitions
from jobs.backends import get_backend
from jobs.models import JobEvent, JobState

# How long a run asked to stop gets before the platform stops waiting for it (a preempted run's teardown,
# a shrink that a preempting job waits for); a backend whose stop takes longer to arrive says its own.
STOP_WINDOW_S = 20.0


def stop_window_s() -> float:
    return float(getattr(get_backend(), "stop_window_s", STOP_WINDOW_S))


def request_move(
    job_id: int, reason: str, *, resize_to: int | None = None, resize_flavors: Sequence[str] | None = None
) -> bool:
    """Ask a running job to checkpoint and stop so that it can move (a drain, growing back, a
    predicted failure, an elastic resize to ``resize_to`` devices, on ``resize_flavors`` when the round
    moves it to other chips). False when it is not running or already asked."""
    with transaction.atomic():
        job = locks.job(job_id)
        if job is None or job.state != JobState.RUNNING:
            return False
        run = locks.attempt(job_id, job.attempt)
        if run is None or run.stop_requested or not run.backend_handle:
            return False
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
        handle = run.backend_handle
        transaction.on_commit(lambda: get_backend().request_stop(handle, reason), robust=True)
    return True


def request_shrink(job_id: int, keep: int, reason: str) -> bool:
    """Ask a running elastic job to move onto ``keep`` devices. A job already asked to move goes on with
    that move, on no more than ``keep`` and on its own flavors (its next attempt reads both when it is
    placed). False when it cannot shrink so, and the caller stops it whole: it is not running, its run
    has not launched yet, or a move asked of it more than ``stop_window_s`` ago has not happened (a
    hung run, or a stop that never reached it, must not keep the job that made room waiting)."""
    if request_move(job_id, reason, resize_to=keep):
        return True
    with transaction.atomic():
        job = locks.job(job_id)
        if job is None or job.state != JobState.RUNNING:
            return False
        run = locks.attempt(job_id, job.attempt)
        if run is None or not run.stop_requested or not run.backend_handle:
            return False
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
                message=f"its move goes on, onto no more than {keep} devices: {reason}",
                data={"resize_to": keep},
            )
    return True
