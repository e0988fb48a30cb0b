"""Elastic jobs through the API and admission: a spec with a device range starts on the most devices that
fit (down to its minimum), is charged for what it got, and runs with the batch and rate its scaling rule
gives that count. Against PostgreSQL; no ranks run (the launch request is built, not sent)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from jobs import lifecycle, services
from jobs.models import JobState, TrainingJob
from tests.conftest import make_tenant
from tests.integration.test_admission import quota, submit

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

NPU = "ascend-910b"  # the test pool has four


@pytest.fixture
def acme(pool):
    tenant = make_tenant("acme", nau_quota=None)
    quota(tenant, NPU, 4)
    return tenant


def _post(tenant, spec: dict):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {tenant.token}")
    return client.post("/api/v1/jobs", spec, format="json")


ELASTIC = {
    "name": "elastic",
    "devices": {"min": 1, "max": 4},
    "flavors": [NPU],
    "batch_scaling": "linear",
    "workload": {"global_batch": 64, "lr": 0.08},
}


def test_an_elastic_job_starts_on_what_is_free_and_scales_its_batch_and_rate(acme):
    holder = submit(acme, 2, name="holder")
    assert services.admit_queued_jobs() == [holder]  # two of the four NPUs are taken

    response = _post(acme, ELASTIC)
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]
    stored = TrainingJob.objects.get(pk=job_id).job_spec
    assert (stored.devices, stored.min_devices, stored.elastic, stored.batch_scaling) == (4, 1, True, "linear")

    assert services.admit_queued_jobs() == [job_id]
    job = TrainingJob.objects.get(pk=job_id)
    assert job.state == JobState.ADMITTED
    assert job.allocations.filter(ended_at__isnull=True).count() == 2
    assert job.demand[NPU] == 2  # charged for the two it got, not the four it may grow to
    workload = lifecycle._launch_request(job).workload
    assert (workload.global_batch, workload.lr) == (32, pytest.approx(0.04))


def test_a_job_that_is_not_elastic_waits_for_its_whole_count(acme):
    holder = submit(acme, 2, name="holder")
    assert services.admit_queued_jobs() == [holder]
    rigid = _post(acme, {**ELASTIC, "devices": 4, "min_devices": 1, "batch_scaling": "fixed"}).json()["id"]

    assert services.admit_queued_jobs() == []  # min_devices alone is for restarts after a failure
    assert TrainingJob.objects.get(pk=rigid).state == JobState.QUEUED


def test_a_bad_range_is_refused_naming_the_field(acme):
    response = _post(acme, {**ELASTIC, "devices": {"min": 6, "max": 4}})
    assert response.status_code == 400
    assert "devices.min" in response.content.decode()
    assert not TrainingJob.objects.exists()


def test_an_elastic_job_larger_than_the_pool_is_taken_if_its_minimum_fits(acme):
    # The pool has four NPUs: a range up to eight may start on four; one whose minimum is six never could.
    response = _post(acme, {**ELASTIC, "devices": {"min": 2, "max": 8}})
    assert response.status_code == 201, response.content
    assert services.admit_queued_jobs() == [response.json()["id"]]
    assert TrainingJob.objects.get(pk=response.json()["id"]).allocations.count() == 4

    refused = _post(acme, {**ELASTIC, "devices": {"min": 6, "max": 8}})
    assert refused.status_code == 400
    assert "the pool has 4 ascend-910b and this job needs 6" in refused.content.decode()
