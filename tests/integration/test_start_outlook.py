"""What would let a waiting job start (GET /api/v1/jobs/{id}/outlook), on PostgreSQL: the devices it
lacks per flavor and when the jobs holding them should end, another tenant's job unnamed, a job that
can never fit said so, a quota wait listing the tenant's own running jobs. The demo pool has 2 a100-sxm
and 2 h100-sxm."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from jobs import services
from jobs.models import JobState, TrainingJob
from runtime.jobspec import parse_job_spec

pytestmark = pytest.mark.integration


def submit(tenant, name: str, devices: int, flavors: list[str]) -> int:
    spec = {
        "name": name,
        "devices": devices,
        "flavors": flavors,
        "workload": {"steps": 1100, "global_batch": 96},
        "wait_for_capacity": devices > 2,  # more than the pool has: it waits for devices to be added
    }
    return services.submit_job(tenant_id=tenant.id, user_id=None, spec=parse_job_spec(spec)).id


def client_of(tenant) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {tenant.token}")
    return client


def test_a_waiting_job_is_told_what_it_lacks_and_when_it_should_be_free(db, pool, tenants):
    acme, globex, initech = tenants
    ours = submit(acme, "ours", 2, ["a100-sxm"])
    theirs = submit(globex, "theirs", 2, ["h100-sxm"])
    assert sorted(services.admit_queued_jobs()) == sorted([ours, theirs])
    # Ours runs at 96 samples/s, one step a second, 1,000 steps left; theirs has reported no speed yet.
    TrainingJob.objects.filter(pk=ours).update(state=JobState.RUNNING, samples_per_s=96.0, steps_done=100)
    TrainingJob.objects.filter(pk=theirs).update(state=JobState.RUNNING)
    waiting = submit(acme, "waiting", 2, ["a100-sxm", "h100-sxm"])
    huge = submit(acme, "huge", 30, ["a100-sxm"])
    assert services.admit_queued_jobs() == []

    before = timezone.now()
    body = client_of(acme).get(f"/api/v1/jobs/{waiting}/outlook").json()
    assert body["waiting"] and body["position"] == 1 and body["reason"].startswith("waiting for 2 devices")
    a100, h100 = body["flavors"]
    assert (a100["flavor"], a100["in_service"], a100["free"], a100["lacking"], a100["never"]) == (
        "a100-sxm",
        2,
        0,
        2,
        False,
    )
    assert [(h["job_id"], h["devices"]) for h in a100["holders"]] == [(ours, 2)]
    expected = timezone.datetime.fromisoformat(a100["expected_at"])
    assert before + timedelta(seconds=999) <= expected <= timezone.now() + timedelta(seconds=1001)
    # Another tenant's job holds the h100s: not named, and with no speed yet, no estimate.
    assert [(h["job_id"], h["devices"], h["expected_end"]) for h in h100["holders"]] == [(None, 2, None)]
    assert h100["expected_at"] is None and not body["quota_blocked"]

    never = client_of(acme).get(f"/api/v1/jobs/{huge}/outlook").json()["flavors"][0]
    assert never["never"] and never["expected_at"] is None

    # A quota wait: the tenant's own running jobs, and when each ends.
    TrainingJob.objects.filter(pk=waiting).update(pending_reason="waiting: 2 of 2 devices in use by your tenant")
    quota = client_of(acme).get(f"/api/v1/jobs/{waiting}/outlook").json()
    assert quota["quota_blocked"] and [h["job_id"] for h in quota["own_running"]] == [ours]

    # Another tenant cannot ask; a job no longer waiting says so.
    assert client_of(initech).get(f"/api/v1/jobs/{waiting}/outlook").status_code == 404
    assert client_of(acme).get(f"/api/v1/jobs/{ours}/outlook").json() == {
        "job_id": ours,
        "waiting": False,
        "reason": "",
        "position": None,
        "flavors": [],
        "quota_blocked": False,
        "own_running": [],
    }
