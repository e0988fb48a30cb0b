"""A tenant's actions on a job: retry (a clone), priority, and wait (a long poll)."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections
from django.test import Client

from jobs import services as jobs
from jobs.models import JobEvent, JobState, TrainingJob
from runtime.jobspec import parse_job_spec

pytestmark = [pytest.mark.integration]

SPEC = {"name": "again", "devices": 1, "flavors": ["tpu-v4"], "workload": {"steps": 5}, "priority": 3}


def _api(token: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {token}"})


def _submit(tenant_id: int) -> int:
    return jobs.submit_job(tenant_id=tenant_id, user_id=None, spec=parse_job_spec(SPEC)).id


@pytest.mark.django_db
def test_retry_clones_an_ended_job_and_each_names_the_other(tenants, pool):
    acme = tenants[0]
    job_id = _submit(acme.id)
    client = _api(acme.token)
    refused = client.post(f"/api/v1/jobs/{job_id}/retry")
    assert refused.status_code == 409 and refused.json()["error"]["field"] == "state"
    jobs.cancel_job(tenant_id=acme.id, job_id=job_id)
    retried = client.post(f"/api/v1/jobs/{job_id}/retry")
    assert retried.status_code == 201
    clone = retried.json()
    assert clone["id"] != job_id and clone["state"] == "queued" and retried["Location"] == f"/api/v1/jobs/{clone['id']}"
    assert clone["spec"] == TrainingJob.objects.get(pk=job_id).spec
    assert JobEvent.objects.get(job_id=clone["id"], kind="action").data == {"retry_of": job_id}
    assert JobEvent.objects.get(job_id=job_id, kind="action").data == {"retried_as": clone["id"]}
    # Another tenant's job is not found, and nothing is cloned.
    assert _api(tenants[1].token).post(f"/api/v1/jobs/{job_id}/retry").status_code == 404
    assert TrainingJob.objects.count() == 2


@pytest.mark.django_db
def test_priority_moves_a_waiting_job_up_its_tenants_queue(tenants, pool):
    acme = tenants[0]
    first, second = _submit(acme.id), _submit(acme.id)
    client = _api(acme.token)
    moved = client.post(f"/api/v1/jobs/{second}/priority", {"priority": 10}, content_type="application/json")
    assert moved.status_code == 200
    assert (moved.json()["priority"], moved.json()["spec"]["priority"], moved.json()["queue_position"]) == (10, 10, 1)
    assert jobs.get_job(tenant_id=acme.id, job_id=first).queue_position == 2
    assert JobEvent.objects.get(job_id=second, kind="action").message == "priority 3 → 10"
    for body, field in (({"priority": 1001}, "priority"), ({"priority": "high"}, "priority"), ({}, "priority")):
        response = client.post(f"/api/v1/jobs/{first}/priority", body, content_type="application/json")
        assert response.status_code == 400 and response.json()["error"]["field"] == field, body
    jobs.cancel_job(tenant_id=acme.id, job_id=first)
    ended = client.post(f"/api/v1/jobs/{first}/priority", {"priority": 1}, content_type="application/json")
    assert ended.status_code == 409
    other = _api(tenants[1].token).post(
        f"/api/v1/jobs/{second}/priority", {"priority": 1}, content_type="application/json"
    )
    assert other.status_code == 404
    assert TrainingJob.objects.get(pk=second).priority == 10


@pytest.mark.django_db
def test_wait_answers_at_once_when_the_job_is_there_already_or_no_time_is_given(tenants, pool):
    acme = tenants[0]
    job_id = _submit(acme.id)
    client = _api(acme.token)
    now = client.get(f"/api/v1/jobs/{job_id}/wait", {"until": "queued"}).json()
    assert now["wait"] == {"reached": True, "waited_s": 0.0} and now["id"] == job_id
    assert client.get(f"/api/v1/jobs/{job_id}/wait", {"timeout": "0"}).json()["wait"]["reached"] is False
    for query, field in (
        ({"until": "done"}, "until"),
        ({"timeout": "301"}, "timeout"),
        ({"timeout": "nan"}, "timeout"),
    ):
        response = client.get(f"/api/v1/jobs/{job_id}/wait", query)
        assert response.status_code == 400 and response.json()["error"]["field"] == field
    assert _api(tenants[1].token).get(f"/api/v1/jobs/{job_id}/wait").status_code == 404


def _body(response) -> dict:
    import json

    return json.loads(b"".join(response))  # an async stream, read whole here


@pytest.mark.django_db(transaction=True)
@pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume asynchronous iterators")
def test_wait_returns_when_the_job_ends_or_when_the_time_is_up(tenants, pool):
    acme = tenants[0]
    job_id = _submit(acme.id)
    client = _api(acme.token)

    started = time.monotonic()
    timed_out = _body(client.get(f"/api/v1/jobs/{job_id}/wait", {"timeout": "1.5"}))
    assert timed_out["wait"]["reached"] is False and timed_out["state"] == "queued"
    assert 1.5 <= time.monotonic() - started < 5

    def cancel_soon() -> None:
        time.sleep(1.0)
        try:
            jobs.cancel_job(tenant_id=acme.id, job_id=job_id)
        finally:
            connections.close_all()

    canceller = threading.Thread(target=cancel_soon)
    started = time.monotonic()
    canceller.start()
    ended = _body(client.get(f"/api/v1/jobs/{job_id}/wait", {"timeout": "30"}))
    canceller.join()
    assert (ended["state"], ended["wait"]["reached"]) == (JobState.CANCELLED, True)
    assert time.monotonic() - started < 10
