"""The telemetry ingest endpoint: only the job's own workers may write, and bad input changes nothing."""

from __future__ import annotations

import time

import pytest
from django.test import Client
from django.utils import timezone

from jobs import services
from jobs.models import Allocation, Device, JobAttempt, JobEvent, JobState, TrainingJob
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
        "micro_batch": 32,
        "samples_per_s": 640.0,
        "step_time_s": 0.05,
    }
    assert JobEvent.objects.filter(job=job, kind="progress").count() == 1  # at most one a second
    # The attempt's training stretch starts at its first step and follows its latest.
    first, last = JobAttempt.objects.filter(job=job, number=job.attempt).values_list("first_step_at", "last_step_at")[0]
    assert first is not None and first == last
    assert post(job.pk, token, {"events": [step(0, 3, 1.8)]}).status_code == 200
    moved = JobAttempt.objects.filter(job=job, number=job.attempt).values_list("first_step_at", "last_step_at")[0]
    assert moved[0] == first and moved[1] > last

    # A replayed, older batch does not move progress backwards.
    assert post(job.pk, token, {"events": [step(0, 1, 2.3)]}).status_code == 200
    job.refresh_from_db()
    assert job.steps_done == 3 and job.last_loss == 1.8


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
        ([{**step(0, 1, 2.0), "split": [[1, 2], [3]]}], "events[0].split"),
        ([{**step(0, 1, 2.0), "predicted": ["fast"]}], "events[0].predicted"),
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


def balanced_job(tenant_id: int) -> TrainingJob:
    spec = {
        "name": "balanced",
        "devices": 3,
        "flavors": ["tpu-v4", "ascend-910b"],
        "workload": {"steps": 50},
        "balancing": {"mode": "dynamic"},
    }
    view = services.submit_job(tenant_id=tenant_id, user_id=None, spec=parse_job_spec(spec))
    TrainingJob.objects.filter(pk=view.id).update(state=JobState.RUNNING)
    for rank, device_id in enumerate(["tpu-v4-0/0", "tpu-v4-0/1", "npu-910b-0/0"]):
        Allocation.objects.create(
            job_id=view.id, device=Device.objects.get(device_id=device_id), rank=rank, started_at=timezone.now()
        )
    return TrainingJob.objects.get(pk=view.id)


def balanced_step(rank: int, number: int, samples: int, rate: float, flavor: str, **more: object) -> dict:
    return {**step(rank, number, 2.0), "samples": samples, "samples_per_s": rate, "flavor": flavor, **more}


def test_the_split_per_rank_speeds_and_stragglers_reach_the_api(tenants, pool):
    job = balanced_job(tenants[0].id)
    token = services.ingest_token(job)
    split = [[30, 28, 38]]
    events = [
        balanced_step(
            0, 7, 30, 120.0, "tpu-v4", split=split, predicted=[118.0, 121.5, 210.0], efficiency=0.93,
            global_samples_per_s=400.0,
        ),
        balanced_step(1, 7, 28, 121.0, "tpu-v4"),
        balanced_step(2, 7, 38, 210.0, "ascend-910b"),
        {
            "kind": "rebalanced", "rank": 0, "ts": time.time(), "step": 7, "old_split": [[32, 32, 32]],
            "new_split": split, "reason": "re-split at step 7", "steps_since_drift": 3, "cost_s": 0.0004,
        },
        {
            "kind": "straggler", "rank": 0, "ts": time.time(), "step": 7, "straggler_rank": 1,
            "measured_samples_per_s": 40.0, "expected_samples_per_s": 120.0,
        },
    ]  # fmt: skip
    assert post(job.pk, token, {"events": events}).json() == {"applied": 5}
    assert post(job.pk, token, {"events": events[3:]}).status_code == 200  # a retried batch counts once

    job.refresh_from_db()
    assert job.rank_stats["2"]["micro_batch"] == 38 and job.rank_stats["2"]["samples_per_s"] == 210.0
    assert job.samples_per_s == 400.0  # the gang's, not the sum of the ranks' own speeds
    stragglers = JobEvent.objects.filter(job=job, data__has_key="straggler")
    assert stragglers.count() == 1
    assert "rank 1 (tpu-v4)" in stragglers.get().message

    response = Client().get(f"/api/v1/jobs/{job.pk}", headers={"Authorization": f"Bearer {tenants[0].token}"})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["ranks"][2] == {"rank": 2, "flavor": "ascend-910b", "micro_batch": 38, "samples_per_s": 210.0}
    balance = body["balance"]
    assert (balance["mode"], balance["efficiency"], balance["split"]) == ("dynamic", 0.93, split)
    assert (balance["rebalances"], balance["stragglers"], balance["micro_batches"]) == (1, [1], [30, 28, 38])
    assert balance["last_rebalance"]["steps_since_drift"] == 3
    assert body["spec"]["balancing"] == {"mode": "dynamic"}


def test_a_bad_balancing_mode_is_refused_naming_the_field(tenants, pool):
    body = {**SPEC, "balancing": {"mode": "fastest"}}
    response = Client().post(
        "/api/v1/jobs", body, content_type="application/json", headers={"Authorization": f"Bearer {tenants[0].token}"}
    )
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "balancing.mode"
    assert not TrainingJob.objects.filter(name=SPEC["name"], tenant_id=tenants[0].id).exists()
