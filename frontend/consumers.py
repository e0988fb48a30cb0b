"""WebSocket: a signed-in tenant user receives their tenant's job events as they happen, and, on a
job's page, that job's new metric points.

``/ws/jobs/?metrics=<job id>`` also joins the job's metrics group: the job must be the tenant's (one of
another tenant, or no job, is refused at the handshake like a socket with no tenant). The socket
only sends; frames from the browser are ignored. It stays open only while its session and its
user's membership of the tenant hold (``frontend.access``).
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from frontend.access import still_allowed, user_group
from frontend.relay import (
    LATE_COMMIT_WINDOW_S,
    SeenIds,
    chart_joined,
    chart_left,
    job_metrics_group,
    listener_joined,
    listener_left,
    tenant_group,
)
from jobs import services as jobs
from jobs.contracts import job_json
from tenants import services as tenants


@database_sync_to_async
def _snapshot(tenant_id: int) -> list[dict[str, Any]]:
    return [job_json(job) for job in jobs.list_jobs(tenant_id=tenant_id)]


def _charted_job(scope: dict[str, Any]) -> int | None:
    """The job id the socket asks metrics of (None: none asked); ``ValueError`` for one that is no id."""
    asked = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("metrics")
    if not asked:
        return None
    if not asked[-1].isdigit() or len(asked[-1]) > 18:
        raise ValueError(f"metrics: not a job id: {asked[-1]!r}")
    return int(asked[-1])


@database_sync_to_async
def _tenant_has_job(tenant_id: int, job_id: int) -> bool:
    try:
        jobs.get_job(tenant_id=tenant_id, job_id=job_id)
    except jobs.JobNotFound:
        return False
    return True


# A WebSocket close code in the private range: the socket may no longer hear this tenant.
CLOSE_NOT_ALLOWED = 4401
ACCESS_RECHECK_S = 5.0


class JobEventsConsumer(AsyncJsonWebsocketConsumer):
    group: str | None = None
    metrics_group: str | None = None
    charted: int | None = None
    # Until when (monotonic) the last access check holds for metric batches, which come several a
    # second; a sign-out or a removal closes the socket at once anyway (``access_revoked``).
    allowed_until = 0.0
    user_id: int | None = None
    tenant_id: int | None = None
    session_key: str | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        tenant = await database_sync_to_async(tenants.tenant_for_user)(user) if user else None
        try:
            charted = _charted_job(self.scope)
        except ValueError:
            charted, tenant = None, None
        if tenant is None or (charted is not None and not await _tenant_has_job(tenant.id, charted)):
            await self.close(code=CLOSE_NOT_ALLOWED)
            return
        self.group = tenant_group(tenant.id)
        self.user_id, self.tenant_id = user.pk, tenant.id
        session = self.scope.get("session")
        self.session_key = session.session_key if session is not None else None
        self.sent = SeenIds(LATE_COMMIT_WINDOW_S)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.channel_layer.group_add(user_group(user.pk), self.channel_name)
        if charted is not None:
            self.charted, self.metrics_group = charted, job_metrics_group(charted)
            await self.channel_layer.group_add(self.metrics_group, self.channel_name)
            chart_joined(charted)
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
            self.group = None
        if self.user_id is not None:
            await self.channel_layer.group_discard(user_group(self.user_id), self.channel_name)
        if self.metrics_group is not None and self.charted is not None:
            await self.channel_layer.group_discard(self.metrics_group, self.channel_name)
            chart_left(self.charted)
            self.metrics_group = self.charted = None

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        """The socket only sends: a frame from the browser, JSON or not, is ignored."""

    async def _allowed(self) -> bool:
        if self.user_id is None or self.tenant_id is None:
            return False
        return await database_sync_to_async(still_allowed)(
            session_key=self.session_key, user_id=self.user_id, tenant_id=self.tenant_id
        )

    async def access_revoked(self, message: dict[str, Any]) -> None:
        """Signed out (that session) or removed from the tenant: close now."""
        if message.get("session_key") == self.session_key or message.get("tenant_id") == self.tenant_id:
            await self.close(code=CLOSE_NOT_ALLOWED)

    async def job_event(self, message: dict[str, Any]) -> None:
        if not await self._allowed():
            await self.close(code=CLOSE_NOT_ALLOWED)
            return
        if not self.sent.add(message["event"]["id"]):
            return
        self.sent.forget_old()
        await self.send_json({"type": "job_event", "event": message["event"], "job": message["job"]})

    async def job_metrics(self, message: dict[str, Any]) -> None:
        """A batch of the charted job's new points (the relay sends one a round per job)."""
        if message.get("tenant_id") != self.tenant_id:
            await self.close(code=CLOSE_NOT_ALLOWED)
            return
        if time.monotonic() >= self.allowed_until:
            if not await self._allowed():
                await self.close(code=CLOSE_NOT_ALLOWED)
                return
            self.allowed_until = time.monotonic() + ACCESS_RECHECK_S
        await self.send_json({"type": "job_metrics", "job_id": message["job_id"], "points": message["points"]})
