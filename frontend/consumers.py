"""WebSocket: a signed-in tenant user receives their tenant's job events as they happen."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from frontend.relay import LATE_COMMIT_WINDOW_S, SeenIds, listener_joined, listener_left, tenant_group
from jobs import services as jobs
from jobs.contracts import job_json
from tenants import services as tenants


@database_sync_to_async
def _snapshot(tenant_id: int) -> list[dict[str, Any]]:
    return [job_json(job) for job in jobs.list_jobs(tenant_id=tenant_id)]


class JobEventsConsumer(AsyncJsonWebsocketConsumer):
    group: str | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        tenant = await database_sync_to_async(tenants.tenant_for_user)(user) if user else None
        if tenant is None:
            await self.close(code=4401)
            return
        self.group = tenant_group(tenant.id)
        self.sent = SeenIds(LATE_COMMIT_WINDOW_S)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        listener_joined()
        await self.send_json({"type": "hello", "tenant": tenant.slug})
        # Joined first, then the snapshot: whatever changed since the page was drawn (or while a
        # reconnecting socket was away) is in it, and every later change arrives as an event.
        await self.send_json({"type": "snapshot", "jobs": await _snapshot(tenant.id)})

    async def disconnect(self, code: int) -> None:
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)
            listener_left()

    async def job_event(self, message: dict[str, Any]) -> None:
        if not self.sent.add(message["event"]["id"]):
            return
        self.sent.forget_old()
        await self.send_json({"type": "job_event", "event": message["event"], "job": message["job"]})
