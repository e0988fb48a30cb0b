"""Enqueueing the app's Celery tasks by name, once the caller's transaction commits.

Tasks import the services facade, which imports everything below it; by sending tasks by name the
layers below never import ``jobs.tasks``, so there is no import circle to dodge. ``robust``: a
broker hiccup must not turn a committed change into an error (the beat sweep finds the work anyway).
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from controlplane.celery import app
from jobs.models import AdmissionRequest

ADMIT = "jobs.tasks.admit_queued_jobs"
PROVISION = "jobs.tasks.provision_job"
TEARDOWN = "jobs.tasks.teardown_job"
FAN_OUT = "jobs.tasks.fan_out"
# The tasks a fan-out message may carry: per-job tasks that are safe to run twice.
FANNED_OUT = frozenset({PROVISION, TEARDOWN})
# At most this many tasks are sent one by one; more go as fan-out messages of this many each. A cycle
# that admits 1,500 jobs then sends 15 messages, not 1,500 (0.3 ms each, a quarter of the whole cycle
# at 10,000 queued jobs), and a worker sends the tasks, off the admission's critical path.
FAN_OUT_CHUNK = 100

log = logging.getLogger(__name__)


# Where a request for admission that no worker took yet is marked, in the cache every process shares
# (``POLYCHIP_COALESCE_ADMISSION_REQUESTS``). The mark expires: a request lost on its way to the broker
# holds back the next ones this long at most, and beat's sweep runs a cycle every second meanwhile.
PENDING_ADMIT_KEY = "jobs:admission-request-pending"
PENDING_ADMIT_TTL_S = 2


def send(task_name: str, *args: Any) -> None:
    """Enqueue now. A request for admission carries when it was sent (after the requester's commit):
    a worker that takes it once a cycle begun later has committed has nothing left to do for it
    (``admission.admit``), so a burst of submissions costs one or two cycles, not one each.

    Where the cache is shared, a request is not even sent while another waits in the broker
    (``_admission_request_pending``): a burst of 64 submissions then sends a few requests, not 64,
    and the workers take a few tasks (1-2 ms of CPU each), not 64."""
    if task_name != ADMIT or args:
        app.send_task(task_name, args=args)
        return
    if _admission_request_pending():
        return
    try:
        app.send_task(task_name, args=(time.time(),))
    except Exception:
        _clear_admission_mark()  # not in the broker after all: the next change sends its own
        raise


def _admission_request_pending() -> bool:
    """Whether a request for admission waits in the broker, untaken; if none does, mark the one the
    caller is about to send. Marking is atomic (the cache's add), so of senders at the same instant
    exactly one sends. A sender that finds the mark has committed before the worker that takes the
    marked request clears it (``take_admission_request``), and that worker decides only after clearing
    it: the caller's change is seen without a request of its own."""
    if not settings.POLYCHIP_COALESCE_ADMISSION_REQUESTS:
        return False
    try:
        return not cache.add(PENDING_ADMIT_KEY, 1, timeout=PENDING_ADMIT_TTL_S)
    except Exception:  # the cache only saves work: whatever fails in it, the request is sent
        log.warning("admission request: the shared cache failed; sending the request", exc_info=True)
        return False


def take_admission_request(requested_at: float | None) -> float | None:
    """A worker's half of coalescing, before it looks at the queue: clear the pending mark, and return
    the moment the request now stands for. Senders that found the mark did not send their own, and
    they committed before it was cleared: the request covers every change up to the clearing, so it is
    stamped then, not when it was sent (a cycle between the two would not have seen them). A request
    of beat's sweep (None) is left as it is: it always runs a cycle."""
    if requested_at is None or not settings.POLYCHIP_COALESCE_ADMISSION_REQUESTS:
        return requested_at
    _clear_admission_mark()
    return time.time()


def _clear_admission_mark() -> None:
    if not settings.POLYCHIP_COALESCE_ADMISSION_REQUESTS:
        return
    try:
        cache.delete(PENDING_ADMIT_KEY)
    except Exception:  # the mark then expires; meanwhile the sweep decides what it held back
        log.warning("admission request: the shared cache failed; its mark expires on its own", exc_info=True)


def send_each(task_name: str, args_list: list[tuple[Any, ...]]) -> None:
    """Enqueue one task per args, through one producer (one broker connection for them all); beyond
    ``FAN_OUT_CHUNK`` of them, one fan-out message per chunk, whose task sends them (``fan_out``)."""
    with app.producer_or_acquire() as producer:
        if len(args_list) <= FAN_OUT_CHUNK:
            for args in args_list:
                app.send_task(task_name, args=args, producer=producer)
            return
        if task_name not in FANNED_OUT:
            raise ValueError(f"{task_name} cannot be fanned out; only {', '.join(sorted(FANNED_OUT))} can")
        for start in range(0, len(args_list), FAN_OUT_CHUNK):
            chunk = [list(args) for args in args_list[start : start + FAN_OUT_CHUNK]]
            app.send_task(FAN_OUT, args=(task_name, chunk), producer=producer)


def fan_out(task_name: str, args_list: list[list[Any]]) -> int:
    """A worker's half of ``send_each``: send the chunk's tasks one by one. A message from the broker
    names the task: only the per-job tasks of ``FANNED_OUT`` are sent, and never a further fan-out."""
    if task_name not in FANNED_OUT:
        raise ValueError(f"a fan-out message named {task_name!r}; only {', '.join(sorted(FANNED_OUT))} fan out")
    if len(args_list) > FAN_OUT_CHUNK:
        raise ValueError(f"a fan-out message carried {len(args_list)} tasks; at most {FAN_OUT_CHUNK} do")
    send_each(task_name, [tuple(args) for args in args_list])
    return len(args_list)


def after_commit(task_name: str, *args: Any) -> None:
    """Enqueue once the current transaction commits (at once outside one)."""
    transaction.on_commit(functools.partial(send, task_name, *args), robust=True)


def admit_requests_left_to_this_transaction() -> None:
    """Called by a transaction about to take the admission lock that runs no admission loop of its own
    (recovery, the pool's sync, a device's health, one cycle on demand). A worker that finds the lock
    held writes its request down and leaves it to the holder (``admission.admit``), and every request
    sent before it is then skipped as covered: once this transaction commits, if a request was written
    down since now, ask for the cycle on its behalf."""
    since = timezone.now()

    def ask() -> None:
        if AdmissionRequest.objects.filter(pk=1, requested_at__gte=since).exists():
            send(ADMIT)

    transaction.on_commit(ask, robust=True)


def after_commit_each(task_name: str, args_list: list[tuple[Any, ...]]) -> None:
    """``after_commit`` for many tasks of one name: an admission cycle provisions a thousand jobs."""
    if args_list:
        transaction.on_commit(functools.partial(send_each, task_name, args_list), robust=True)
