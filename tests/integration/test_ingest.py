"""The telemetry ingest endpoint: only the job's own workers may write, and bad input changes nothing."""

from __future__ import annotations

import time

import pytest
from django.test import Client

from jobs import services
from jobs.models import JobEvent, JobState, TrainingJob
from runtime.jobspec import parse_job_spec

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SPEC = {"name": "ingest", "devices": 1, "flavors": ["tpu-v4"], "workload": {"steps": 50}}


def running_job(tenant_id: int) -> TrainingJob:
    view = services.submit_job(tenant_id=tenant_id, user_id=None, spec=parse_job_spec(SPEC))
    TrainingJob.objects.filter(pk=view.id).update(state=JobState.RUNNING)
    return TrainingJob.objects.get(pk=view.id)


def step(rank: int, number: int, loss: float) -> dict:
    return {
        "kind": "step",
        "rank": rank,
        "ts": time.time(),
        "step": number,
        "total_steps": 50,
        "loss": loss,
        "samples": 32,
        "samples_per_s": 640.0,
        "step_time_s": 0.05,
        "flavor": "tpu-v4",
        "device_id": "tpu-v4-0/0",
    }


def post(job_id: int, token: str, body: object):
    return Client().post(
        f"/api/v1/ingest/jobs/{job_id}/telemetry",
        body,
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )


def test_a_workers_steps_become_the_jobs_progress(tenants, pool):
    job = running_job(tenants[0].id)
    token = services.ingest_token(job)
    events = [step(0, 1, 2.3), step(1, 1, 2.3), step(0, 2, 1.9), {"kind": "heartbeat", "rank": 1, "ts": time.time()}]
    assert post(job.pk, token, {"events": events}).json() == {"applied": 4}

    job.refresh_from_db()
    assert (job.steps_done, job.first_loss, job.last_loss, job.recent_losses) == (2, 2.3, 1.9, [2.3, 1.9])
    assert job.rank_stats["1"] == {
        "flavor": "tpu-v4",
        "device_id": "tpu-v4-0/0",
        "step": 1,
        "samples": 32,
        "samples_per_s": 640.0,
        "step_time_s": 0.05,
    }
    assert JobEvent.objects.filter(job=job, kind="progress").count() == 1  # at most one a second

    # A replayed, older batch does not move progress backwards.
    assert post(job.pk, token, {"events": [step(0, 1, 2.3)]}).status_code == 200
    job.refresh_from_db()
    assert job.steps_done == 2 and job.last_loss == 1.9


def test_only_the_jobs_own_token_is_accepted(tenants, pool):
    mine, theirs = running_job(tenants[0].id), running_job(tenants[1].id)
    for token in ("", "nope", "ünïcode", services.ingest_token(theirs)):
        response = post(mine.pk, token, {"events": [step(0, 1, 2.0)]})
        assert response.status_code == 403, token
    assert post(999_999, services.ingest_token(mine), {"events": []}).status_code == 403
    mine.refresh_from_db()
    assert mine.steps_done == 0 and mine.last_heartbeat_at is None


@pytest.mark.parametrize(
    ("events", "field"),
    [
        ("lots", "events"),
        ([1], "events[0]"),
        ([{"kind": "step", "rank": 0, "ts": 1.0}], "events[0].step"),
        ([{"kind": "step", "rank": "zero", "ts": 1.0, "step": 1}], "events[0].rank"),
        ([{"kind": "heartbeat", "rank": 0}], "events[0].ts"),
        ([{**step(0, 1, 2.0), "loss": "NaN"}], "events[0].loss"),
        ([step(0, 1, 2.0), {**step(0, 2, 1.0), "total_steps": -5}], "events[1].total_steps"),
    ],
)
def test_malformed_telemetry_is_refused_naming_the_field_and_changes_nothing(tenants, pool, events, field):
    job = running_job(tenants[0].id)
    response = post(job.pk, services.ingest_token(job), {"events": events})
    assert response.status_code == 400
    assert response.json()["error"]["field"] == field
    job.refresh_from_db()
    assert job.steps_done == 0 and job.last_heartbeat_at is None


def test_telemetry_after_the_job_ended_changes_nothing(tenants, pool):
    job = running_job(tenants[0].id)
    services.finish_job(job.pk, JobState.SUCCEEDED)
    assert post(job.pk, services.ingest_token(job), {"events": [step(0, 1, 2.0)]}).json() == {"applied": 0}
    job.refresh_from_db()
    assert job.steps_done == 0
