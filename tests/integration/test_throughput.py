"""The throughput table in the control plane: learned from step telemetry, read by the API and admission."""

from __future__ import annotations

import time

import pytest
from django.test import Client
from django.utils import timezone

from jobs import services, throughput
from jobs.models import ThroughputEntry, ThroughputObservation, TrainingJob
from runtime.throughput import LEARNING_WEIGHT, Source
from runtime.throughput import ThroughputEntry as Entry
from tests.attempts import device_ids, running_on

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def step(rank: int, number: int, flavor: str, samples_per_s: float) -> dict:
    return {
        "kind": "step",
        "rank": rank,
        "ts": time.time() + number * 1e-3,
        "step": number,
        "total_steps": 50,
        "loss": 1.0,
        "samples": 48,
        "samples_per_s": samples_per_s,
        "step_time_s": 48 / samples_per_s,
        "flavor": flavor,
    }


def post(job: TrainingJob, events: list[dict]) -> None:
    response = Client().post(
        f"/api/v1/ingest/jobs/{job.pk}/telemetry",
        {"events": events},
        content_type="application/json",
        headers={"Authorization": f"Bearer {services.ingest_token(job)}"},
    )
    assert response.status_code == 200, response.content


def test_a_single_flavor_job_teaches_the_table(tenants, pool):
    job = running_on(tenants[0].id, device_ids("tpu-v4", 2))
    throughput.store_benchmarks([Entry("synthetic-mlp", "tpu-v4", 2, 500.0, Source.BENCHMARK, 40)])

    # Warm-up steps teach nothing; the first batch past them replaces the benchmark figure.
    post(job, [step(0, 2, "tpu-v4", 300.0), step(1, 2, "tpu-v4", 300.0)])
    assert ThroughputEntry.objects.get(job_class="synthetic-mlp", flavor="tpu-v4", devices=2).source == "benchmark"
    post(job, [step(1, 4, "tpu-v4", 320.0), step(0, 4, "tpu-v4", 330.0)])
    row = ThroughputEntry.objects.get(job_class="synthetic-mlp", flavor="tpu-v4", devices=2)
    assert (row.source, row.samples, row.samples_per_s) == ("measured", 1, pytest.approx(650.0))

    # A batch of rank 1 alone does not count as an observation; rank 0's next one does.
    post(job, [step(1, 5, "tpu-v4", 350.0)])
    assert ThroughputEntry.objects.get(pk=row.pk).samples == 1
    post(job, [step(0, 5, "tpu-v4", 350.0), step(0, 6, "tpu-v4", 350.0)])
    row.refresh_from_db()
    assert (row.samples, row.samples_per_s) == (2, pytest.approx((650.0 + 700.0) / 2))

    # The job's own figure follows the pure rule: the moving average once there are enough observations.
    ThroughputObservation.objects.filter(job=job).update(samples=50, samples_per_s=600.0)
    post(job, [step(1, 7, "tpu-v4", 400.0), step(0, 7, "tpu-v4", 400.0)])
    row.refresh_from_db()
    assert row.samples_per_s == pytest.approx((1 - LEARNING_WEIGHT) * 600.0 + LEARNING_WEIGHT * 800.0)


def test_a_mixed_job_teaches_nothing(tenants, pool):
    job = running_on(tenants[0].id, device_ids("tpu-v4", 1) + device_ids("ascend-910b", 1))
    post(job, [step(0, 5, "tpu-v4", 300.0), step(1, 5, "ascend-910b", 300.0)])
    assert not ThroughputEntry.objects.exists()
    job.refresh_from_db()
    assert job.samples_per_s == 600.0  # progress is still recorded


def test_the_api_lists_entries_and_admission_prices_from_them(tenants, pool):
    client = Client(headers={"Authorization": f"Bearer {tenants[1].token}"})
    assert client.get("/api/v1/throughput").json() == {"entries": []}
    before = throughput.throughput_matrix().rate("resnet-small", "h100-sxm")
    assert before.estimated

    throughput.store_benchmarks(
        [
            Entry("resnet-small", "a100-sxm", 1, 100.0, Source.BENCHMARK, 20),
            Entry("resnet-small", "h100-sxm", 1, 250.0, Source.BENCHMARK, 20),
        ]
    )
    job = running_on(tenants[1].id, device_ids("tpu-v4", 1))
    throughput.learn(job.pk, "resnet-small", "h100-sxm", 2, 480.0)
    body = client.get("/api/v1/throughput?job_class=resnet-small").json()
    assert [(e["flavor"], e["devices"], e["source"]) for e in body["entries"]] == [
        ("a100-sxm", 1, "benchmark"),
        ("h100-sxm", 1, "benchmark"),
        ("h100-sxm", 2, "measured"),
    ]
    assert body["entries"][2]["per_device_samples_per_s"] == 240.0
    assert client.get("/api/v1/throughput?flavor=tpu-v4").json() == {"entries": []}

    rate = throughput.throughput_matrix().rate("resnet-small", "h100-sxm")
    assert (rate.milli_nau, rate.estimated) == (2500, False)

    # Seeding again keeps what real steps measured.
    counts = throughput.store_benchmarks([Entry("resnet-small", "h100-sxm", 2, 999.0, Source.BENCHMARK, 5)])
    assert counts == {"stored": 0, "kept": 1}
    assert throughput.table().lookup("resnet-small", "h100-sxm", 2).samples_per_s == 480.0


def test_learning_waits_for_the_ingest_to_commit(tenants, pool):
    from django.db import transaction

    from jobs.telemetry import TelemetryEvent

    job = running_on(tenants[0].id, device_ids("tpu-v4", 2))
    events = [TelemetryEvent(**step(0, 5, "tpu-v4", 300.0)), TelemetryEvent(**step(1, 5, "tpu-v4", 310.0))]
    with transaction.atomic():
        assert services.ingest_telemetry(job_id=job.pk, token=services.ingest_token(job), events=events) == 2
        # Not under the job's row lock: the shared entry is untouched until the ingest commits.
        assert not ThroughputEntry.objects.exists()
        assert TrainingJob.objects.get(pk=job.pk).steps_done == 5
    row = ThroughputEntry.objects.get(job_class="synthetic-mlp", flavor="tpu-v4", devices=2)
    assert (row.source, row.samples, row.samples_per_s) == ("measured", 1, pytest.approx(610.0))


def test_a_failure_to_learn_never_fails_the_ingest(tenants, pool, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("the table is away")

    monkeypatch.setattr(throughput, "learn", broken)
    job = running_on(tenants[0].id, device_ids("tpu-v4", 2))
    post(job, [step(0, 5, "tpu-v4", 300.0), step(1, 5, "tpu-v4", 300.0)])
    job.refresh_from_db()
    assert job.steps_done == 5  # the progress is recorded
    assert not ThroughputEntry.objects.exists()
    assert "could not learn throughput" in caplog.text


def test_learning_moves_updated_at(tenants, pool):
    from datetime import timedelta

    throughput.store_benchmarks([Entry("synthetic-mlp", "tpu-v4", 2, 500.0, Source.BENCHMARK, 40)])
    long_ago = timezone.now() - timedelta(days=3)
    ThroughputEntry.objects.update(updated_at=long_ago)  # update() leaves auto_now alone
    throughput.learn(running_on(tenants[0].id, device_ids("tpu-v4", 1)).pk, "synthetic-mlp", "tpu-v4", 2, 640.0)
    row = ThroughputEntry.objects.get()
    assert row.samples_per_s == 640.0
    assert row.updated_at > long_ago + timedelta(days=2)
