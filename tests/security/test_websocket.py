"""Issue 17, items 3, 10 and 11: the job-events WebSocket, in process (asgiref's communicator).

An open socket closes when its session signs out or its user leaves the tenant, and sends no event
after either; the Origin must be this server's own (scheme, host and port); a frame from the browser,
JSON or not, is ignored.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from asgiref.testing import ApplicationCommunicator
from channels.layers import get_channel_layer
from django.contrib.sessions.models import Session
from django.db import connection, connections
from django.test import Client

from frontend.consumers import CLOSE_NOT_ALLOWED
from frontend.relay import tenant_group
from tenants.models import Membership

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def app(tenants) -> Iterator[Any]:
    """The ASGI application, imported in a synchronous context: it checks for demo accounts as it loads."""
    from controlplane.asgi import application

    yield application
    if connection.vendor != "postgresql":
        return
    # The consumer's queries run on asgiref's executor thread, whose connection outlives the test and
    # would keep the test database from being dropped at the end of the session: end it here.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


def signed_in(tenant) -> Client:
    client = Client()
    assert client.login(username=tenant.username, password=tenant.password)
    return client


class Socket(ApplicationCommunicator):
    """A WebSocket client speaking ASGI to the application (channels.testing needs daphne)."""

    def __init__(self, app: Any, headers: list[tuple[bytes, bytes]]) -> None:
        scope = {"type": "websocket", "path": "/ws/jobs/", "query_string": b"", "headers": headers, "subprotocols": []}
        super().__init__(app, scope)

    async def connect(self) -> tuple[bool, int | None]:
        await self.send_input({"type": "websocket.connect"})
        response = await self.receive_output(10)
        if response["type"] == "websocket.close":
            return False, response.get("code")
        return True, None

    async def send_to(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        frame = {"text": text_data} if text_data is not None else {"bytes": bytes_data}
        await self.send_input({"type": "websocket.receive", **frame})

    async def receive_json_from(self) -> dict[str, Any]:
        response = await self.receive_output(10)
        assert response["type"] == "websocket.send", response
        return json.loads(response["text"])

    async def disconnect(self) -> None:
        await self.send_input({"type": "websocket.disconnect", "code": 1000})
        await self.wait(5)
        await self.close_connections()

    async def refused(self) -> None:
        """A socket denied at the handshake: nothing to disconnect."""
        await self.wait(5)
        await self.close_connections()

    @staticmethod
    async def close_connections() -> None:
        # The consumer's queries ran on asgiref's thread: close its connection, or the test database
        # cannot be dropped at the end of the session.
        await sync_to_async(connections.close_all)()


def communicator(
    app: Any, client: Client | None, origin: str = "http://testserver", host: str = "testserver"
) -> Socket:
    headers = [(b"host", host.encode()), (b"origin", origin.encode())]
    if client is not None:
        cookie = "; ".join(f"{k}={v.value}" for k, v in client.cookies.items())
        headers.append((b"cookie", cookie.encode()))
    return Socket(app, headers)


async def opened(ws: Socket) -> None:
    connected, code = await ws.connect()
    assert connected, code
    assert (await ws.receive_json_from())["type"] == "hello"
    assert (await ws.receive_json_from())["type"] == "snapshot"


async def in_thread(work: Any) -> Any:
    """Run Django code on a thread of its own, and close that thread's connection after."""

    def run() -> Any:
        try:
            return work()
        finally:
            connections.close_all()

    return await asyncio.to_thread(run)


async def push(tenant_id: int, event_id: int) -> None:
    """What the relay sends to a tenant's group for one job event."""
    message = {"type": "job.event", "event": {"id": event_id, "kind": "transition"}, "job": {"id": 1}}
    await get_channel_layer().group_send(tenant_group(tenant_id), message)


async def heard(ws: Socket, quiet_s: float) -> list[dict[str, Any]]:
    """Every frame the socket sends until it has been quiet for ``quiet_s``."""
    frames = []
    while not await ws.receive_nothing(timeout=quiet_s):
        frames.append(await ws.receive_json_from())
    return frames


async def closed_with(ws: Socket) -> int | None:
    output = await ws.receive_output(timeout=10)
    assert output["type"] == "websocket.close", output
    return output.get("code")


def test_signing_out_closes_the_open_socket_at_once(app, tenants):
    acme = tenants[0]
    client = signed_in(acme)

    async def scenario() -> None:
        ws = communicator(app, client)
        await opened(ws)
        await in_thread(lambda: client.post("/logout/"))
        assert await closed_with(ws) == CLOSE_NOT_ALLOWED
        await ws.disconnect()

    asyncio.run(scenario())


def test_removal_from_the_tenant_closes_the_open_socket_at_once(app, tenants):
    acme = tenants[0]
    client = signed_in(acme)

    async def scenario() -> None:
        ws = communicator(app, client)
        await opened(ws)
        await in_thread(lambda: Membership.objects.filter(user__username=acme.username).delete())
        assert await closed_with(ws) == CLOSE_NOT_ALLOWED
        await ws.disconnect()

    asyncio.run(scenario())


def test_an_event_is_not_sent_once_the_session_is_gone(app, tenants):
    """The backstop when no signal came (a session expired, or deleted by hand): checked per event."""
    acme = tenants[0]
    client = signed_in(acme)

    async def scenario() -> None:
        ws = communicator(app, client)
        await opened(ws)
        await push(acme.id, 1)
        assert (await ws.receive_json_from())["event"]["id"] == 1
        await in_thread(lambda: Session.objects.all().delete())
        await push(acme.id, 2)
        assert await closed_with(ws) == CLOSE_NOT_ALLOWED
        await ws.disconnect()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("origin", "host"),
    [
        ("http://testserver:9999", "testserver"),  # another program on this machine
        ("https://testserver", "testserver"),  # another scheme than the socket's
        ("http://evil.example", "testserver"),
        ("http://evil.example", "evil.example"),  # a rebound DNS name: not an allowed host
        ("null", "testserver"),
    ],
)
def test_a_socket_from_another_origin_is_refused(app, tenants, origin, host):
    client = signed_in(tenants[0])

    async def scenario() -> None:
        ws = communicator(app, client, origin=origin, host=host)
        connected, _ = await ws.connect()
        assert not connected
        await ws.refused()

    asyncio.run(scenario())


def test_the_same_origin_with_its_port_is_accepted(app, tenants):
    client = signed_in(tenants[0])

    async def scenario() -> None:
        ws = communicator(app, client, origin="http://127.0.0.1:8765", host="127.0.0.1:8765")
        await opened(ws)
        await ws.disconnect()

    asyncio.run(scenario())


def test_frames_from_the_browser_are_ignored_json_or_not(app, tenants):
    acme = tenants[0]
    client = signed_in(acme)

    async def scenario() -> None:
        ws = communicator(app, client)
        await opened(ws)
        await ws.send_to(text_data="this is not JSON {")
        await ws.send_to(text_data='{"type": "subscribe"}')
        await ws.send_to(bytes_data=b"\x00\xff")
        await push(acme.id, 7)  # still open, still serving
        assert (await ws.receive_json_from())["event"]["id"] == 7
        await ws.disconnect()

    asyncio.run(scenario())


def _a_job_of(tenant) -> int:
    from jobs import services
    from runtime.jobspec import parse_job_spec

    spec = {"name": "charted", "devices": 1, "flavors": ["a100-sxm"], "workload": {"steps": 50, "global_batch": 64}}
    return services.submit_job(tenant_id=tenant.id, user_id=None, spec=parse_job_spec(spec)).id


def charting(app: Any, client: Client, job: str) -> Socket:
    ws = communicator(app, client)
    ws.scope["query_string"] = f"metrics={job}".encode()
    return ws


def test_a_jobs_page_socket_gets_the_jobs_new_metric_points_through_the_relay(app, tenants, pool):
    from django.utils import timezone

    from jobs.models import MetricPoint

    acme = tenants[0]
    job_id = _a_job_of(acme)
    client = signed_in(acme)

    async def scenario() -> None:
        charts, lists = charting(app, client, str(job_id)), communicator(app, client)
        await opened(charts)
        await opened(lists)
        # The relay starts with the first socket and tails from the newest point it finds: write points
        # until one arrives (each a new step), then check what came is what was written.
        written: dict[int, float] = {}
        for step in range(100):
            written[step] = 1.0 / (step + 1)
            await in_thread(
                lambda s=step: MetricPoint.objects.create(
                    job_id=job_id, name="loss", step=s, value=written[s], recorded_at=timezone.now()
                )
            )
            message = next((m for m in await heard(charts, 0.3) if m["type"] == "job_metrics"), None)
            if message is not None:
                break
        assert message is not None and message["job_id"] == job_id
        assert message["points"] and all(written[p["step"]] == p["value"] for p in message["points"])
        assert {p["name"] for p in message["points"]} == {"loss"}
        # A socket that charts nothing hears the job's events (its submission), never its points.
        assert "job_metrics" not in {m["type"] for m in await heard(lists, 1.0)}
        await charts.disconnect()
        await lists.disconnect()

    asyncio.run(scenario())


@pytest.mark.parametrize("asked", ["other", "not-a-number", "99999999"])
def test_charting_a_job_not_the_tenants_is_refused_at_the_handshake(app, tenants, pool, asked):
    acme, globex = tenants[0], tenants[1]
    job = str(_a_job_of(globex)) if asked == "other" else asked
    client = signed_in(acme)

    async def scenario() -> None:
        ws = charting(app, client, job)
        connected, code = await ws.connect()
        assert (connected, code) == (False, CLOSE_NOT_ALLOWED)
        await ws.disconnect()  # the consumer closed it: the client's side of the close

    asyncio.run(scenario())
