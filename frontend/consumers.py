"""WebSocket: a signed-in tenant user receives their tenant's job events as they happen."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from frontend.relay import ensure_relay_running, tenant_group
from tenants import services as tenants


class JobEventsConsumer(AsyncJsonWebsocketConsumer):
    group: str | None = None
    last_event_id: int = 0

    async def connect(self) -> None:
        user = self.scope.get("user")
        tenant = await database_sync_to_async(tenants.tenant_for_user)(user) if user else None
        if tenant is None:
            await self.close(code=4401)
            return
        self.group = tenant_group(tenant.id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        ensure_relay_running()
        await self.send_json({"type": "hello", "tenant": tenant.slug})

    async def disconnect(self, code: int) -> None:
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def job_event(self, message: dict[str, Any]) -> None:
        event_id = message["event"]["id"]
        if event_id <= self.last_event_id:
            return
        self.last_event_id = event_id
        await self.send_json({"type": "job_event", "event": message["event"], "job": message["job"]})
