"""The job's life through the real stack: REST in, Celery in between, processes underneath."""

from __future__ import annotations

import json
import os
import signal
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

from billing.models import LedgerEntry, UsageOutbox, UsageRecord
from billing.rating import epoch_ms
from jobs.models import Allocation, JobEvent, JobState, TrainingJob
from runtime.backends.local.procs import pid_alive
from tests.attempts import handle_of, run_of
from tests.processes import processes_mentioning
from tests.stack import portal_session

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SPEC = {
    "name": "it-mlp",
    "devices": 2,
    "flavors": ["a100-sxm"],
    "workload": {"steps": 120, "global_batch": 64, "seed": 3},
}


def test_a_submitted_job_trains_to_success_and_is_metered(api_for, tenants, pool):
    acme = tenants[0]
    api = api_for(acme.token)

    response = api.post("/api/v1/jobs", SPEC)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    assert response.headers["Location"] == f"/api/v1/jobs/{job_id}"

    job = api.wait_for(job_id, {"succeeded", "failed", "cancelled"})
    assert job["state"] == "succeeded", job
    assert job["progress"]["steps_done"] == 120
    assert job["loss"]["last"] < 0.6 * job["loss"]["first"], job["loss"]
    assert [d["flavor"] for d in job["devices"]] == ["a100-sxm", "a100-sxm"]
    assert Path(job["artifact"]).is_file()

    transitions = list(
        JobEvent.objects.filter(job_id=job_id, kind="transition").order_by("pk").values_list("from_state", "to_state")
    )
    assert transitions == [("", "queued"), ("queued", "admitted"), ("admitted", "running"), ("running", "succeeded")]

    allocations = list(Allocation.objects.filter(job_id=job_id))
    assert len(allocations) == 2 and all(a.ended_at is not None for a in allocations)
    records = {r.key: r for r in UsageRecord.objects.filter(job_id=job_id)}
    assert set(records) == {f"allocation:{a.pk}" for a in allocations}
    for allocation in allocations:
        record = records[f"allocation:{allocation.pk}"]
        expected_ms = epoch_ms(allocation.ended_at) - epoch_ms(allocation.started_at)
        assert record.duration_ms == expected_ms > 0
        assert record.tenant_id == acme.id and record.flavor == "a100-sxm"
    # The stack's beat posts the usage outbox to the ledger within a few seconds, every millisecond of it.
    _wait(lambda: not UsageOutbox.objects.filter(record__job_id=job_id).exists(), timeout_s=30)
    ledger = LedgerEntry.objects.filter(job_id=job_id)
    assert sum(e.duration_ms for e in ledger) == sum(r.duration_ms for r in records.values())
    assert {e.record.key for e in ledger} == set(records)

    usage = api.get(f"/api/v1/jobs/{job_id}/usage").json()["usage"]
    assert usage == [
        {
            "flavor": "a100-sxm",
            "devices": 2,
            "duration_ms": sum(r.duration_ms for r in records.values()),
            "device_seconds": str(Decimal(sum(r.duration_ms for r in records.values())).scaleb(-3)),
            # The standard price book's a100-sxm list price, rounded once for the flavor.
            "cost": str(
                (Decimal("2.1") * sum(r.duration_ms for r in records.values()) / 3_600_000).quantize(
                    Decimal("0.01"), rounding=ROUND_HALF_UP
                )
            ),
        }
    ]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**SPEC, "devices": 0}, "devices"),
        ({**SPEC, "flavors": ["b200-imaginary"]}, "flavors[0]"),
        ({**SPEC, "flavors": []}, "flavors"),
        ({**SPEC, "workload": {"steps": "many"}}, "workload.steps"),
        ({**SPEC, "tenant": 99}, "tenant"),
        ({"devices": 1, "flavors": ["a100-sxm"]}, "name"),
        ([1, 2], "spec"),
    ],
)
def test_an_invalid_spec_is_refused_naming_the_field_and_changes_nothing(api_for, tenants, pool, body, field):
    response = api_for(tenants[0].token).post("/api/v1/jobs", body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["field"] == field
    assert error["code"] == "invalid_spec" and error["message"]
    assert TrainingJob.objects.count() == 0


def test_another_tenants_job_answers_404_and_no_token_answers_401(api_for, tenants, pool):
    acme, globex, _ = tenants
    # Larger than the pool, and asked to wait for capacity: it stays queued.
    job_id = api_for(acme.token).post("/api/v1/jobs", {**SPEC, "devices": 20, "wait_for_capacity": True}).json()["id"]

    for path in (f"/api/v1/jobs/{job_id}", f"/api/v1/jobs/{job_id}/events", f"/api/v1/jobs/{job_id}/usage"):
        assert api_for(globex.token).get(path).status_code == 404
        assert api_for(None).get(path).status_code == 401
    assert api_for(globex.token).post(f"/api/v1/jobs/{job_id}/cancel").status_code == 404
    assert api_for(globex.token).get("/api/v1/jobs").json()["jobs"] == []
    assert api_for("pc_not-a-real-token").get("/api/v1/jobs").status_code == 401
    assert TrainingJob.objects.get(pk=job_id).state == JobState.QUEUED


def test_a_job_that_cannot_fit_waits_with_a_reason_and_can_be_cancelled(api_for, tenants, pool):
    api = api_for(tenants[0].token)
    spec = {**SPEC, "devices": 5, "flavors": ["tpu-v4"], "wait_for_capacity": True}
    job_id = api.post("/api/v1/jobs", spec).json()["id"]

    def has_reason() -> bool:
        return bool(api.get(f"/api/v1/jobs/{job_id}").json()["pending_reason"])

    _wait(has_reason)
    job = api.get(f"/api/v1/jobs/{job_id}").json()
    assert job["state"] == "queued"
    assert job["pending_reason"] == "waiting for 5 devices; free now: 4 tpu-v4"

    cancelled = api.post(f"/api/v1/jobs/{job_id}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    again = api.post(f"/api/v1/jobs/{job_id}/cancel")
    assert again.status_code == 409 and again.json()["error"]["field"] == "state"


def test_cancelling_a_running_job_stops_its_processes_and_meters_it(api_for, tenants, pool):
    api = api_for(tenants[0].token)
    job_id = api.post("/api/v1/jobs", {**SPEC, "workload": {"steps": 100_000}}).json()["id"]
    api.wait_for(job_id, {"running"})
    _wait(lambda: api.get(f"/api/v1/jobs/{job_id}").json()["progress"]["steps_done"] > 0)

    assert api.post(f"/api/v1/jobs/{job_id}/cancel").json()["state"] == "cancelled"
    handle = handle_of(job_id)
    assert UsageRecord.objects.filter(job_id=job_id).count() == 2
    assert not Allocation.objects.filter(job_id=job_id, ended_at__isnull=True).exists()

    # The teardown runs on the worker after the commit; the sweep retries it until confirmed.
    _wait(lambda: run_of(job_id).torn_down_at is not None, timeout_s=30)
    assert processes_mentioning(handle["run_dir"]) == []


def test_a_rank_that_dies_fails_a_job_without_restarts_left_with_its_reason_and_meters_it(api_for, tenants, pool):
    api = api_for(tenants[0].token)
    job_id = api.post("/api/v1/jobs", {**SPEC, "workload": {"steps": 100_000}, "max_restarts": 0}).json()["id"]
    api.wait_for(job_id, {"running"})
    _wait(lambda: api.get(f"/api/v1/jobs/{job_id}").json()["progress"]["steps_done"] > 0)
    run_dir = handle_of(job_id)["run_dir"]
    # From the run's status, not a command line: a rank in a warm standby has the pool's.
    ranks = json.loads((Path(run_dir) / "status.json").read_text())["ranks"]
    victim = next(r["pid"] for r in ranks if r["rank"] == 1)

    os.kill(victim, signal.SIGKILL)  # a device lost mid-step

    job = api.wait_for(job_id, {"succeeded", "failed", "cancelled"}, timeout_s=60)
    assert job["state"] == "failed"
    assert "rank 1" in job["failure_reason"] and "gave up after 0 restart(s) (max_restarts 0)" in job["failure_reason"]
    events = list(JobEvent.objects.filter(job_id=job_id, kind="transition").values_list("to_state", "data"))
    assert events[-1] == ("failed", {"reason": job["failure_reason"]})
    assert UsageRecord.objects.filter(job_id=job_id).count() == 2
    _wait(lambda: processes_mentioning(run_dir) == [] and not any(pid_alive(r["pid"]) for r in ranks), timeout_s=30)


def _wait(predicate, timeout_s: float = 60) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.2)


def test_the_portal_pushes_each_transition_to_its_tenant_only(stack, api_for, tenants, pool):
    import asyncio
    import json

    import websockets

    acme, _, initech = tenants

    async def scenario() -> tuple[list[dict], list[dict]]:
        sockets = []
        for tenant in (acme, initech):
            session = portal_session(stack, tenant.username, tenant.password)
            cookie = "; ".join(f"{k}={v}" for k, v in session.cookies.items())
            ws = await websockets.connect(
                stack.replace("http", "ws") + "/ws/jobs/", additional_headers={"Cookie": cookie, "Origin": stack}
            )
            assert json.loads(await ws.recv()) == {"type": "hello", "tenant": tenant.slug}
            assert json.loads(await ws.recv()) == {"type": "snapshot", "jobs": []}
            sockets.append(ws)
        await asyncio.sleep(0.5)
        api = api_for(acme.token)
        job_id = (
            await asyncio.to_thread(api.post, "/api/v1/jobs", {**SPEC, "devices": 30, "wait_for_capacity": True})
        ).json()["id"]
        await asyncio.to_thread(api.post, f"/api/v1/jobs/{job_id}/cancel")

        async def drain(ws, want: int, timeout_s: float) -> list[dict]:
            got: list[dict] = []
            try:
                while len(got) < want:
                    got.append(json.loads(await asyncio.wait_for(ws.recv(), timeout=timeout_s)))
            except TimeoutError:
                pass
            return got

        # Acme must get both transitions; initech, listening as long, must get nothing at all.
        acme_got, initech_got = await asyncio.gather(drain(sockets[0], 2, 10), drain(sockets[1], 1, 3))
        for ws in sockets:
            await ws.close()
        return acme_got, initech_got

    acme_got, initech_got = asyncio.run(scenario())
    assert [m["event"]["to_state"] for m in acme_got] == ["queued", "cancelled"]
    assert all(m["job"]["name"] == SPEC["name"] for m in acme_got)
    assert initech_got == []


def test_a_websocket_without_a_session_is_refused(stack):
    import asyncio

    import websockets

    async def connect() -> None:
        async with websockets.connect(
            stack.replace("http", "ws") + "/ws/jobs/", additional_headers={"Origin": stack}
        ) as ws:
            await ws.recv()

    # The consumer closes before accepting, which Channels answers with 403 at the handshake.
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        asyncio.run(connect())
    assert refused.value.response.status_code == 403


def test_up_creates_no_account(stack, stack_var):
    """Issue 17: `polychip up` (this module's stack) makes no user, so no password anyone could know."""
    from django.contrib.auth import get_user_model

    from tenants import services

    assert not (stack_var / "demo-token").exists()
    assert not (stack_var / "demo-password").exists()
    assert not (stack_var / "operator-password").exists()
    assert not get_user_model().objects.filter(username__in=["demo", "operator"]).exists()
    assert services.demo_usernames() == []
