"""The push relay: tails the job event log and pushes each new event to its tenant's group, and tails
the stored metric points and pushes each job's new points to the sockets watching that job's charts.

Transitions happen in Celery workers, which share no memory with the ASGI server; the event log
in the database is what they do share. One relay runs per ASGI process while at least one
WebSocket is open there.

Event ids are given out at insert but become visible at commit, so a slow transaction can commit
an id lower than one already pushed. Each round therefore also re-reads a short window of recent
events and pushes those it has not pushed yet. Consumers drop ids they have already sent, so relays
in several processes feeding one Redis layer cannot make a client see an event twice either.

Metric points are tailed by id alone (their table is the largest, and a time window would scan it),
and only those of the jobs that this process's sockets chart: a point committed late, or overwritten
in place when a step is trained again, is not pushed, and the job page's periodic read of its series
picks it up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from channels.layers import get_channel_layer
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from jobs import services
from jobs.contracts import event_json, job_json

log = logging.getLogger(__name__)
T = TypeVar("T")

# Longer than any transaction that writes an event is expected to stay open.
LATE_COMMIT_WINDOW_S = 10.0

_relay_task: asyncio.Task[None] | None = None
_listeners = 0


def tenant_group(tenant_id: int) -> str:
    return f"tenant-{tenant_id}-jobs"


def job_metrics_group(job_id: int) -> str:
    """The sockets of pages that chart this job (they joined it when they connected, as its tenant)."""
    return f"job-{job_id}-metrics"


class SeenIds:
    """Ids pushed recently; forgets those older than the window so it stays small."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._seen: dict[int, float] = {}

    def add(self, event_id: int) -> bool:
        """True the first time an id is added."""
        if event_id in self._seen:
            return False
        self._seen[event_id] = time.monotonic()
        return True

    def forget_old(self) -> None:
        horizon = time.monotonic() - 2 * self.window_s
        self._seen = {k: at for k, at in self._seen.items() if at >= horizon}


# The relay's queries run on a thread of their own that keeps one database connection open: not
# on the thread that serves the sync views, and not a new connection every round.
_db_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="polychip-relay-db")


async def _on_db_thread(fn: Callable[..., T], *args: Any) -> T:
    def call() -> T:
        try:
            return fn(*args)
        except Exception:
            connection.close()  # a broken connection is replaced on the next round
            raise

    return await asyncio.get_running_loop().run_in_executor(_db_thread, call)


@dataclass
class Cursors:
    event: int
    metric_point: int


def _cursors() -> Cursors:
    return Cursors(event=services.latest_event_id(), metric_point=services.latest_metric_point_id())


# How many of this process's sockets chart each job: only their points are read and sent.
_charted: Counter[int] = Counter()


def chart_joined(job_id: int) -> None:
    _charted[job_id] += 1


def chart_left(job_id: int) -> None:
    _charted[job_id] -= 1
    if _charted[job_id] <= 0:
        del _charted[job_id]


# At most this many points a round; a longer backlog is sent over the next rounds.
POINTS_PER_ROUND = 5000


def _messages(cursors: Cursors, seen: SeenIds, charted: frozenset[int]) -> list[tuple[str, dict[str, Any]]]:
    """The next round's (group, message) pairs; advances ``cursors``."""
    messages: list[tuple[str, dict[str, Any]]] = []
    for event in services.recent_events(after_id=cursors.event, window_s=LATE_COMMIT_WINDOW_S):
        cursors.event = max(cursors.event, event.id)
        if not seen.add(event.id):
            continue
        job = services.get_job(tenant_id=event.tenant_id, job_id=event.job_id)
        message = {"type": "job.event", "event": event_json(event), "job": job_json(job)}
        messages.append((tenant_group(event.tenant_id), message))
    by_job: dict[int, dict[str, Any]] = {}
    latest = services.latest_metric_point_id()
    points = (
        services.metric_points_after(cursors.metric_point, up_to=latest, job_ids=charted, limit=POINTS_PER_ROUND)
        if charted and latest > cursors.metric_point
        else []
    )
    cursors.metric_point = points[-1].id if len(points) == POINTS_PER_ROUND else latest
    for point in points:
        batch = by_job.setdefault(
            point.job_id, {"type": "job.metrics", "job_id": point.job_id, "tenant_id": point.tenant_id, "points": []}
        )
        batch["points"].append({"name": point.name, "step": point.step, "value": point.value})
    messages.extend((job_metrics_group(job_id), batch) for job_id, batch in by_job.items())
    return messages


async def _run() -> None:
    layer = get_channel_layer()
    if layer is None:
        raise ImproperlyConfigured("CHANNEL_LAYERS is not configured")
    cursors = await _on_db_thread(_cursors)
    seen = SeenIds(LATE_COMMIT_WINDOW_S)
    while _listeners > 0:
        try:
            messages = await _on_db_thread(_messages, cursors, seen, frozenset(_charted))
            for group, message in messages:
                await layer.group_send(group, message)
            seen.forget_old()
        except asyncio.CancelledError:
            raise
        except Exception:  # a database hiccup must not end pushes for the life of the process
            log.exception("push relay failed a round; retrying")
            await asyncio.sleep(1)
        await asyncio.sleep(settings.POLYCHIP_PUSH_POLL_S)


def listener_joined() -> None:
    global _relay_task, _listeners
    _listeners += 1
    if _relay_task is None or _relay_task.done():
        _relay_task = asyncio.get_running_loop().create_task(_run(), name="polychip-push-relay")


def listener_left() -> None:
    global _listeners
    _listeners = max(0, _listeners - 1)  # the relay ends by itself after its current round
