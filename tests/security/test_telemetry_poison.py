"""Issue 17, item 2: one job's worker telemetry cannot poison the cluster.

A worker's figures are checked against what its devices can do (a multiple of the flavor's
benchmark), the shared throughput entry is the median of jobs' own figures (one job, one vote), and
a learned figure, even one stored before these checks, never breaks admission, cancel or metering.
"""

from __future__ import annotations

import time

import pytest
from django.test import Client

from jobs import services, throughput
from jobs.models import JobState, ThroughputEntry, TrainingJob
from runtime.scheduling.model import MILLI
from runtime.throughput import FIGURE_MARGIN, PEAK_MARGIN, Source
from runtime.throughput import ThroughputEntry as Entry
from tests.attempts import device_ids, running_on

pytestmark = pytest.mark.django_db(transaction=True)

BENCH_PER_DEVICE = 250.0  # synthetic-mlp on one tpu-v4, as the benchmark found it


def step(rank: int, number: int, samples_per_s: float, **extra) -> dict:
    return {
        "kind": "step",
        "rank": rank,
        "ts": time.time() + number * 1e-3,
        "step": number,
        "total_steps": 500,
        "loss": 1.0,
        "samples": 48,
        "samples_per_s": samples_per_s,
        "step_time_s": 0.1,
        "flavor": "tpu-v4",
        **extra,
    }


def post(job: TrainingJob, events: list[dict]):
    return Client().post(
        f"/api/v1/ingest/jobs/{job.pk}/telemetry",
        {"events": events},
        content_type="application/json",
        headers={"Authorization": f"Bearer {services.ingest_token(job)}"},
    )


@pytest.fixture
def benchmarked(pool):
    throughput.store_benchmarks([Entry("synthetic-mlp", "tpu-v4", 1, BENCH_PER_DEVICE, Source.BENCHMARK, 40)])


def entry(devices: int = 1) -> ThroughputEntry:
    return ThroughputEntry.objects.get(job_class="synthetic-mlp", flavor="tpu-v4", devices=devices)


def test_a_figure_beyond_what_the_flavor_can_do_is_refused_and_changes_nothing(tenants, benchmarked):
    job = running_on(tenants[0].id, device_ids("tpu-v4", 1), steps=500)
    assert post(job, [step(0, 5, 300.0)]).status_code == 200
    before = TrainingJob.objects.get(pk=job.pk)
    table = list(ThroughputEntry.objects.values_list("samples_per_s", "samples", "source"))

    for poison in (1e300, FIGURE_MARGIN * BENCH_PER_DEVICE * 1.01):
        response = post(job, [step(0, 6, 300.0), step(0, 7, poison)])
        assert response.status_code == 400, response.content
        error = response.json()["error"]
        assert error["field"] == "events[1].samples_per_s"
        assert "at most" in error["message"]
        if poison < 1e15:  # past the absolute bound of any figure, the flavor's own bound
            assert "tpu-v4 can do for synthetic-mlp" in error["message"]
    for field, value in (("global_samples_per_s", 1e12), ("measured_samples_per_s", 1e12), ("predicted", [1e12])):
        response = post(job, [step(0, 8, 300.0, **{field: value})])
        assert response.status_code == 400, (field, response.content)
        assert response.json()["error"]["field"].startswith(f"events[0].{field}")

    after = TrainingJob.objects.get(pk=job.pk)
    assert (after.steps_done, after.rank_stats, after.samples_per_s) == (
        before.steps_done,
        before.rank_stats,
        before.samples_per_s,
    )
    assert list(ThroughputEntry.objects.values_list("samples_per_s", "samples", "source")) == table
    # A figure within the bound is taken.
    assert post(job, [step(0, 9, FIGURE_MARGIN * BENCH_PER_DEVICE * 0.99)]).status_code == 200


def test_the_worker_cannot_claim_a_faster_flavor_than_the_device_it_holds(tenants, pool):
    throughput.store_benchmarks(
        [
            Entry("synthetic-mlp", "tpu-v4", 1, BENCH_PER_DEVICE, Source.BENCHMARK, 40),
            Entry("synthetic-mlp", "h100-sxm", 1, 20 * BENCH_PER_DEVICE, Source.BENCHMARK, 40),
        ]
    )
    job = running_on(tenants[0].id, device_ids("tpu-v4", 1), steps=500)
    response = post(job, [step(0, 5, 10 * BENCH_PER_DEVICE, flavor="h100-sxm")])
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "events[0].samples_per_s"


def test_one_job_is_one_vote_in_the_shared_figure(tenants, benchmarked):
    honest = [running_on(tenants[i % 3].id, device_ids("tpu-v4", 1, skip=i), steps=500) for i in range(3)]
    for number, job in enumerate(honest):
        for s in (4, 5, 6):
            assert post(job, [step(0, s, 300.0 + 10 * number)]).status_code == 200
    assert entry().samples_per_s == pytest.approx(310.0)

    # A fourth job reports the most its device could do, over and over: the median moves by one vote.
    loud = running_on(tenants[0].id, device_ids("tpu-v4", 1, skip=3), steps=500)
    ceiling = FIGURE_MARGIN * BENCH_PER_DEVICE * 0.99
    for s in range(4, 40):
        assert post(loud, [step(0, s, ceiling)]).status_code == 200
    assert entry().samples_per_s == pytest.approx((310.0 + 320.0) / 2)
    assert entry().samples_per_s < 1.1 * 320.0


def test_a_poisoned_entry_from_before_never_breaks_pricing_admission_or_cancel(tenants, pool):
    # A figure stored before these checks existed (or written by hand): 1e300 samples/s.
    ThroughputEntry.objects.create(
        job_class="synthetic-mlp", flavor="tpu-v4", devices=1, samples_per_s=1e300, source="measured", samples=1
    )
    ThroughputEntry.objects.create(
        job_class="synthetic-mlp", flavor="a100-sxm", devices=1, samples_per_s=100.0, source="measured", samples=1
    )
    peaks = throughput.peak_tflops()
    rate = throughput.throughput_matrix().rate("synthetic-mlp", "tpu-v4")
    assert rate.milli_nau <= MILLI * PEAK_MARGIN * peaks["tpu-v4"] / peaks["a100-sxm"] + 1

    api = Client(headers={"Authorization": f"Bearer {tenants[1].token}"})
    spec = {"name": "victim", "devices": 2, "flavors": ["tpu-v4"], "workload": {"steps": 50}}
    created = api.post("/api/v1/jobs", spec, content_type="application/json")
    assert created.status_code == 201, created.content
    job_id = created.json()["id"]
    services.run_admission_cycle()
    assert TrainingJob.objects.get(pk=job_id).state == JobState.ADMITTED

    cancelled = api.post(f"/api/v1/jobs/{job_id}/cancel")
    assert cancelled.status_code in (200, 202), cancelled.content
    usage = api.get(f"/api/v1/jobs/{job_id}/usage")
    assert usage.status_code == 200, usage.content
