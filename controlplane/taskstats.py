"""Celery task counts and runtimes, gathered in each worker process and read by ``/metrics``.

A worker process counts each task as it ends (``task_postrun``: the task's name, how it ended, how
long it ran) in memory, and folds what it counted into ``TaskCounter`` rows at most every
``FLUSH_EVERY_S`` seconds and when it shuts down: one short transaction that locks the rows in name
order, so that concurrent workers add up without deadlocks. Each flush also stamps the worker's
``WorkerBeat``, and so does a thread of the worker's main process every 15 s, tasks or none. Counting
happens only inside a worker (``worker_init``): an eager task in a test or a shell is not a worker's.

If a flush fails (the database is away), the counts stay in memory for the next one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import Error, close_old_connections, transaction
from django.utils import timezone

from controlplane.models import TaskCounter, WorkerBeat

logger = logging.getLogger(__name__)

# Upper bounds, in seconds, of the runtime histogram's buckets (+Inf is implied): a relay pass takes
# milliseconds, an admission cycle at 10,000 queued jobs a few seconds, a launch up to a minute.
RUNTIME_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
FLUSH_EVERY_S = 5.0
# A worker that has flushed within this long is counted as alive; beat sends a task every few seconds.
WORKER_ALIVE_S = 60.0
OUTCOMES = ("succeeded", "failed", "retried")
_OUTCOME_OF_STATE = {"SUCCESS": "succeeded", "FAILURE": "failed", "RETRY": "retried"}


@dataclass
class _Tally:
    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    runtime_sum_s: float = 0.0
    # Per bucket the runs that fell in it (not cumulative); the last is over the largest bound.
    runtime_counts: list[int] = field(default_factory=lambda: [0] * (len(RUNTIME_BUCKETS) + 1))

    def add(self, outcome: str, runtime_s: float) -> None:
        self.outcomes[outcome] += 1
        self.runtime_sum_s += runtime_s
        index = next((i for i, bound in enumerate(RUNTIME_BUCKETS) if runtime_s <= bound), len(RUNTIME_BUCKETS))
        self.runtime_counts[index] += 1

    def merge(self, other: _Tally) -> None:
        for outcome, count in other.outcomes.items():
            self.outcomes[outcome] += count
        self.runtime_sum_s += other.runtime_sum_s
        self.runtime_counts = [a + b for a, b in zip(self.runtime_counts, other.runtime_counts, strict=True)]


class _Recorder:
    """One worker process's counts since its last flush."""

    def __init__(self) -> None:
        self.enabled = False
        self.hostname = ""
        self.started: dict[str, float] = {}
        self.tallies: dict[str, _Tally] = {}
        self.last_flush = time.monotonic()

    def start(self, task_id: str) -> None:
        if self.enabled:
            self.started[task_id] = time.perf_counter()

    def end(self, task_id: str, name: str, state: str, hostname: str) -> None:
        started = self.started.pop(task_id, None)
        outcome = _OUTCOME_OF_STATE.get(state)
        if not self.enabled or started is None or outcome is None:
            return
        self.hostname = hostname or self.hostname
        self.tallies.setdefault(name, _Tally()).add(outcome, time.perf_counter() - started)
        if time.monotonic() - self.last_flush >= FLUSH_EVERY_S:
            self.flush()

    def flush(self) -> None:
        self.last_flush = time.monotonic()
        if not self.tallies and not self.hostname:
            return
        tallies, self.tallies = self.tallies, {}
        try:
            _fold(tallies, self.hostname, timezone.now())
        except Error:  # DatabaseError, or InterfaceError for a connection that went away
            logger.warning("task counts not saved; kept for the next flush", exc_info=True)
            for name, tally in tallies.items():  # merged with any counted meanwhile (a thread pool)
                self.tallies.setdefault(name, _Tally()).merge(tally)


def _fold(tallies: dict[str, _Tally], hostname: str, now: datetime) -> None:
    with transaction.atomic():
        for name in sorted(tallies):  # one lock order for every worker
            tally = tallies[name]
            row, _ = TaskCounter.objects.select_for_update().get_or_create(task=name)
            row.succeeded += tally.outcomes["succeeded"]
            row.failed += tally.outcomes["failed"]
            row.retried += tally.outcomes["retried"]
            row.runtime_sum_s += tally.runtime_sum_s
            cumulative = list(row.runtime_buckets) or [0] * (len(RUNTIME_BUCKETS) + 1)
            running = 0
            for index, count in enumerate(tally.runtime_counts):
                running += count
                cumulative[index] += running
            row.runtime_buckets = cumulative
            row.save()
        if hostname:
            WorkerBeat.objects.update_or_create(hostname=hostname, defaults={"seen_at": now})


recorder = _Recorder()


def connect_signals() -> None:
    """Count tasks in this process from now on: the worker calls it once it starts (worker_init)."""
    recorder.enabled = True


HEARTBEAT_EVERY_S = 15.0
FORGET_WORKER_AFTER_S = 86400.0


def start_heartbeat(hostname: str, every_s: float = HEARTBEAT_EVERY_S) -> tuple[threading.Event, threading.Thread]:
    """Stamp the worker's ``WorkerBeat`` every ``every_s`` from its main process, tasks or none: a
    worker that beat sends nothing to (beat down, another worker faster) is still alive, and
    polychip_celery_workers must say so. A daemon thread, which ends with the worker or once the
    returned event is set (join the returned thread to wait for its last stamp)."""
    stop = threading.Event()

    def beat() -> None:
        while True:
            try:
                now = timezone.now()
                WorkerBeat.objects.update_or_create(hostname=hostname, defaults={"seen_at": now})
                # Workers that left a day ago are gone for good (a node name per pod): their rows go too.
                WorkerBeat.objects.filter(seen_at__lt=now - timedelta(seconds=FORGET_WORKER_AFTER_S)).delete()
            except Error:
                logger.warning("worker heartbeat not saved", exc_info=True)
            finally:
                close_old_connections()
            if stop.wait(every_s):
                return

    thread = threading.Thread(target=beat, name="polychip-worker-heartbeat", daemon=True)
    thread.start()
    return stop, thread


def on_prerun(task_id: str) -> None:
    recorder.start(task_id)


def on_postrun(task: Any, task_id: str, state: str | None) -> None:
    request = getattr(task, "request", None)
    recorder.end(task_id, str(getattr(task, "name", "")), state or "", str(getattr(request, "hostname", "") or ""))


def on_shutdown() -> None:
    if recorder.enabled:
        recorder.flush()


# --- reading (the /metrics collector) ------------------------------------------------------------


@dataclass(frozen=True)
class TaskTotals:
    task: str
    succeeded: int
    failed: int
    retried: int
    runtime_sum_s: float
    runtime_buckets: tuple[int, ...]  # cumulative, one per RUNTIME_BUCKETS bound, then +Inf


def task_totals() -> Iterator[TaskTotals]:
    for row in TaskCounter.objects.order_by("task"):
        buckets = tuple(row.runtime_buckets) or (0,) * (len(RUNTIME_BUCKETS) + 1)
        yield TaskTotals(row.task, row.succeeded, row.failed, row.retried, row.runtime_sum_s, buckets)


def live_workers(now: datetime | None = None) -> int:
    since = (now or timezone.now()) - timedelta(seconds=WORKER_ALIVE_S)
    return WorkerBeat.objects.filter(seen_at__gte=since).count()


def queue_lengths() -> dict[str, int]:
    """Messages waiting in the broker per queue (Celery's one queue, ``celery``)."""
    queue = "celery"
    url = settings.CELERY_BROKER_URL
    if url.startswith("filesystem"):
        folder = Path(str(settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"]))
        return {queue: sum(1 for _ in folder.glob(f"*.{queue}.msg"))} if folder.is_dir() else {queue: 0}
    if url.startswith(("redis://", "rediss://")):
        import redis

        client = redis.Redis.from_url(url, socket_connect_timeout=1.0, socket_timeout=1.0)
        try:
            # kombu keeps a queue's priority levels in lists named after it (the default level is the name).
            names = [queue, *(key.decode() for key in client.scan_iter(match=f"{queue}\x06\x16*", count=100))]
            return {queue: sum(int(client.llen(name)) for name in names)}
        finally:
            client.close()
    return {}
