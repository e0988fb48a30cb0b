"""The push relay: tails the job event log and pushes each new event to its tenant's group.

Transitions happen in Celery workers, which share no memory with the ASGI server; the event log
in the database is what they do share. One relay runs per ASGI process, started by the first
WebSocket that connects. Consumers drop an event id they have already sent, so relays in several
processes feeding one Redis layer cannot make a client see an event twice.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings

from jobs import services
from jobs.api.serializers import event_json, job_json

log = logging.getLogger(__name__)

_relay_task: asyncio.Task[None] | None = None


def tenant_group(tenant_id: int) -> str:
    return f"tenant-{tenant_id}-jobs"


@database_sync_to_async
def _next_batch(cursor: int) -> tuple[int, list[tuple[int, dict[str, Any]]]]:
    messages: list[tuple[int, dict[str, Any]]] = []
    events = services.events_after(cursor)
    for event in events:
        job = services.get_job(tenant_id=event.tenant_id, job_id=event.job_id)
        messages.append((event.tenant_id, {"type": "job.event", "event": event_json(event), "job": job_json(job)}))
        cursor = event.id
    return cursor, messages


@database_sync_to_async
def _start_cursor() -> int:
    return services.latest_event_id()


async def _run() -> None:
    layer = get_channel_layer()
    assert layer is not None, "CHANNEL_LAYERS is not configured"
    cursor = await _start_cursor()
    while True:
        try:
            cursor, messages = await _next_batch(cursor)
            for tenant_id, message in messages:
                await layer.group_send(tenant_group(tenant_id), message)
        except asyncio.CancelledError:
            raise
        except Exception:  # a database hiccup must not end pushes for the life of the process
            log.exception("push relay failed a round; retrying")
            await asyncio.sleep(1)
        await asyncio.sleep(settings.POLYCHIP_PUSH_POLL_S)


def ensure_relay_running() -> None:
    global _relay_task
    if _relay_task is None or _relay_task.done():
        _relay_task = asyncio.get_running_loop().create_task(_run(), name="polychip-push-relay")
