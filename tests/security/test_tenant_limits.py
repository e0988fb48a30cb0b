"""Issue 17, item 4: what one tenant can queue and send is limited, and the admission cycle's cost does
not grow with one tenant's queue.

Before: 3,388 submissions in 120 s from a tenant with no quota were all accepted, and the admission
cycle, which serves every tenant, went from 78 ms to 1,171 ms.
"""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.throttling import SimpleRateThrottle

from jobs import services
from jobs.models import JobState, TrainingJob
from jobs.snapshot import pending_jobs
from tenants.models import Tenant

pytestmark = pytest.mark.django_db

SPEC = {"name": "flood", "devices": 1, "flavors": ["tpu-v4"], "workload": {"steps": 10}}


def api(token: str, address: str = "127.0.0.1") -> Client:
    return Client(headers={"Authorization": f"Bearer {token}"}, REMOTE_ADDR=address)


@pytest.fixture
def rates(monkeypatch):
    """Low rates for the test (DRF binds the configured rates to the throttle classes at import)."""

    def set_rates(**rates: str) -> None:
        monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"token": None, "address": None, **rates})

    return set_rates


def test_a_token_past_its_rate_gets_429_with_retry_after_and_others_go_on(tenants, rates):
    rates(token="5/min", address="1000/min")
    acme, globex = api(tenants[0].token), api(tenants[1].token)
    assert [acme.get("/api/v1/jobs").status_code for _ in range(5)] == [200] * 5
    throttled = acme.get("/api/v1/jobs")
    assert throttled.status_code == 429
    assert 0 < int(throttled.headers["Retry-After"]) <= 60
    assert throttled.json()["error"]["code"] == "throttled"
    assert globex.get("/api/v1/jobs").status_code == 200  # another tenant's token has its own budget


def test_many_tokens_from_one_address_share_its_budget(tenants, rates):
    rates(token="1000/min", address="6/min")
    statuses = [api(tenants[i % 3].token, "203.0.113.5").get("/api/v1/jobs").status_code for i in range(7)]
    assert statuses == [200] * 6 + [429]
    assert api(tenants[0].token, "198.51.100.7").get("/api/v1/jobs").status_code == 200


def test_the_ingest_route_is_throttled_per_job(tenants, pool, rates):
    rates(ingest="3/min")
    created = [services.submit_job(tenant_id=tenants[0].id, user_id=None, spec=_spec()) for _ in range(2)]
    jobs = [TrainingJob.objects.get(pk=view.id) for view in created]
    for job in jobs:
        worker = api(services.ingest_token(job))
        url = f"/api/v1/ingest/jobs/{job.pk}/telemetry"
        codes = [worker.post(url, {"events": []}, content_type="application/json").status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429], (job.pk, codes)


def _spec():
    from runtime.jobspec import parse_job_spec

    return parse_job_spec(SPEC)


def test_a_tenant_cannot_queue_past_its_cap(tenants, pool, settings):
    settings.POLYCHIP_MAX_QUEUED_JOBS = 4
    acme = api(tenants[0].token)
    codes = [acme.post("/api/v1/jobs", SPEC, content_type="application/json").status_code for _ in range(5)]
    assert codes == [201] * 4 + [409]
    refused = acme.post("/api/v1/jobs", SPEC, content_type="application/json").json()["error"]
    assert refused["code"] == "queue_full" and "4 jobs waiting" in refused["message"]
    assert TrainingJob.objects.filter(tenant_id=tenants[0].id).count() == 4
    # Other tenants queue as before.
    assert api(tenants[1].token).post("/api/v1/jobs", SPEC, content_type="application/json").status_code == 201


def test_an_operator_sets_a_tenants_own_cap(tenants, pool, django_user_model):
    operator = django_user_model.objects.create_user("op", password="op-password-1", is_staff=True)
    console = Client()
    console.force_login(operator)
    url = f"/api/v1/operator/tenants/{tenants[0].id}"
    assert console.patch(url, {"max_queued_jobs": 2}, content_type="application/json").json()["max_queued_jobs"] == 2
    bad = console.patch(url, {"max_queued_jobs": -1}, content_type="application/json")
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "max_queued_jobs"
    acme = api(tenants[0].token)
    codes = [acme.post("/api/v1/jobs", SPEC, content_type="application/json").status_code for _ in range(3)]
    assert codes == [201, 201, 409]
    assert Tenant.objects.get(pk=tenants[0].id).max_queued_jobs == 2


def test_a_cycle_weighs_a_window_of_each_tenants_queue(tenants, pool, settings):
    settings.POLYCHIP_ADMISSION_WINDOW_PER_TENANT = 16
    spec = _spec().to_dict()
    now = timezone.now()
    TrainingJob.objects.bulk_create(
        TrainingJob(
            tenant_id=tenants[0].id,
            name=f"flood-{i}",
            spec=spec,
            state=JobState.QUEUED,
            total_steps=10,
            priority=i % 3,
            job_class="synthetic-mlp",
            created_at=now,
        )
        for i in range(500)
    )
    late = services.submit_job(tenant_id=tenants[1].id, user_id=None, spec=_spec())
    pending = pending_jobs()
    by_tenant = {t.id: [p for p in pending if p.tenant_id == t.id] for t in tenants[:2]}
    assert len(by_tenant[tenants[0].id]) == 16
    assert {p.priority for p in by_tenant[tenants[0].id]} == {2}  # the highest priority first
    assert [p.job_id for p in by_tenant[tenants[1].id]] == [late.id]
    # The other tenant's job is admitted in the next cycle, whatever the flood.
    services.run_admission_cycle()
    assert TrainingJob.objects.get(pk=late.id).state == JobState.ADMITTED
