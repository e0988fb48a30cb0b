"""/metrics stays bounded: 1,000 jobs submitted through the API by 50 tenants add series per tenant and
per running job, never per job; an unknown label value goes to ``_other`` and is counted."""

from __future__ import annotations

import random
import re

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from jobs import services
from jobs.models import DeviceHealth, JobState, TrainingJob
from tests.conftest import make_tenant

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

TENANTS = 50
JOBS = 1000
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ")


def series(text: str) -> list[tuple[str, str]]:
    """(name, labels) of every sample line."""
    return [(m.group(1), m.group(2) or "") for line in text.splitlines() if (m := SAMPLE.match(line))]


def scrape() -> str:
    operator = get_user_model().objects.create_user("ops", password="ops-password-1", is_staff=True)
    client = APIClient()
    client.force_login(operator)
    response = client.get("/metrics")
    assert response.status_code == 200, response.content[:300]
    operator.delete()
    return response.content.decode()


def bound(devices: int, tenants: int, running: int) -> int:
    """The stated bound: per device 8 series (five readings, memory, errors twice, health, score: at
    most 8 of them at once), per tenant 150 (job states, pending reasons, quota rows, wait histogram
    per priority band, evictions and recoveries per cause, spend, budgets, throughput), per running
    job 6 (info and five figures), and 700 for everything else (Celery tasks with their runtime
    buckets, health changes, per-class exchange, the process's own)."""
    return 8 * devices + 150 * tenants + 6 * running + 700


def test_a_thousand_jobs_of_fifty_tenants_keep_the_series_bounded(pool):
    from jobs.models import Device

    empty = series(scrape())
    devices = Device.objects.count()
    rng = random.Random(5)
    fixtures = [make_tenant(f"t{n:02d}") for n in range(TENANTS)]
    clients = []
    for fixture in fixtures:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {fixture.token}")
        clients.append(client)
    for n in range(JOBS):
        spec = {
            "name": f"job-{n}",
            "devices": rng.choice((1, 2)),
            "flavors": rng.sample(["h100-sxm", "a100-sxm", "ascend-910b", "tpu-v4"], rng.randint(1, 2)),
            "priority": rng.choice((-5, 0, 0, 10)),
            "workload": {"steps": 50, "global_batch": 32},
        }
        response = clients[n % TENANTS].post("/api/v1/jobs", spec, format="json")
        assert response.status_code == 201, response.content
    services.run_admission_cycle()
    # Those admitted run (their figures as telemetry would leave them); a tenth of the rest ended.
    admitted = list(TrainingJob.objects.filter(state=JobState.ADMITTED).values_list("pk", flat=True))
    TrainingJob.objects.filter(pk__in=admitted).update(state=JobState.RUNNING, samples_per_s=100.0, last_loss=1.5)
    queued = list(TrainingJob.objects.filter(state=JobState.QUEUED).values_list("pk", flat=True))
    TrainingJob.objects.filter(pk__in=queued[::10]).update(state=JobState.CANCELLED)
    services.set_device_health([Device.objects.first().device_id], DeviceHealth.CORDONED, by="ops")

    text = scrape()
    full = series(text)
    running = len(admitted)
    assert running > 0
    assert len(full) <= bound(devices, TENANTS, running), (len(full), bound(devices, TENANTS, running))
    # Job ids label only the running jobs' series, each job once per family.
    job_ids = {m for _, labels in full for m in re.findall(r'job_id="(\d+)"', labels)}
    assert job_ids == {str(pk) for pk in admitted}
    # 1,000 jobs cost at most the per-tenant and per-running-job series over an empty control plane.
    assert len(full) - len(empty) <= 150 * TENANTS + 6 * running
    # Every tenant label is a tenant's slug; nothing overflowed.
    tenants = {m for _, labels in full for m in re.findall(r'tenant="([^"]*)"', labels)}
    assert tenants <= {f.slug for f in fixtures}
    assert 'polychip_metrics_label_overflow{label="tenant"} 0.0' in text


def test_a_value_outside_its_label_set_is_counted_under_other(pool, tenants):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {tenants[0].token}")
    spec = {"name": "odd", "devices": 1, "flavors": ["a100-sxm"], "workload": {"steps": 50, "global_batch": 32}}
    job_id = client.post("/api/v1/jobs", spec, format="json").json()["id"]
    # A class no label value stands for (a row written by something newer than this code).
    TrainingJob.objects.filter(pk=job_id).update(state=JobState.RUNNING, job_class="quantum:abc:main.py")

    text = scrape()
    (info,) = [
        line for line in text.splitlines() if line.startswith("polychip_job_info{") and f'job_id="{job_id}"' in line
    ]
    assert 'job_class="_other"' in info
    overflow = re.search(r'polychip_metrics_label_overflow\{label="job_class"\} (\S+)', text)
    assert overflow is not None and float(overflow.group(1)) >= 1
