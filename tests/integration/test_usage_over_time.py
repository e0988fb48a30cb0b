"""Usage over time, on PostgreSQL: a month's spend day by day (what the billing page charts), and the
device time jobs held without training (its idle allocated hours). The standard price book charges
1.65 an hour for an ascend-910b."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest

from billing import services as billing
from billing.contracts import OpenUsage, UsageInterval
from jobs import services
from jobs.models import Allocation, JobAttempt
from runtime.jobspec import parse_job_spec

pytestmark = pytest.mark.integration

NOW = datetime(2026, 11, 15, 12, 0, tzinfo=UTC)


def used(tenant, key: str, started_at: datetime, ended_at: datetime) -> None:
    interval = UsageInterval(
        key=key,
        tenant_id=tenant.id,
        job_id=0,
        device_id="npu-910b-0/0",
        flavor="ascend-910b",
        started_at=started_at,
        ended_at=ended_at,
    )
    billing.ingest_usage([interval], now=NOW)  # the fixed dates are as late as they are on NOW, not today
    billing.relay_usage()


def test_spend_by_day_puts_each_hour_on_the_day_it_ran(db, tenants):
    acme, globex, _ = tenants
    # Two hours across a midnight, half an hour on the 12th, and another tenant's usage that is not acme's.
    used(acme, "midnight", datetime(2026, 11, 10, 23, 0, tzinfo=UTC), datetime(2026, 11, 11, 1, 0, tzinfo=UTC))
    used(acme, "short", datetime(2026, 11, 12, 9, 0, tzinfo=UTC), datetime(2026, 11, 12, 9, 30, tzinfo=UTC))
    used(globex, "theirs", datetime(2026, 11, 12, 9, 0, tzinfo=UTC), datetime(2026, 11, 12, 19, 0, tzinfo=UTC))
    # Last month's usage is last month's.
    used(acme, "october", datetime(2026, 10, 31, 22, 0, tzinfo=UTC), datetime(2026, 10, 31, 23, 0, tzinfo=UTC))
    held = [OpenUsage(tenant_id=acme.id, job_id=1, flavor="ascend-910b", started_at=NOW - timedelta(hours=2))]

    days = billing.spend_by_day(acme.id, held, now=NOW)
    assert [day for day, _ in days] == [date(2026, 11, d) for d in range(1, 16)]  # the 1st to today
    spend = dict(days)
    assert spend[date(2026, 11, 10)] == spend[date(2026, 11, 11)] == Decimal("1.65")
    assert spend[date(2026, 11, 12)] == Decimal("0.83")  # 0.825, rounded once for the day
    assert spend[date(2026, 11, 15)] == Decimal("3.30")  # the devices held now
    assert sum(amount for day, amount in days if day.day not in (10, 11, 12, 15)) == 0
    assert billing.budget_status(acme.id, held, now=NOW).spend == Decimal("7.43")  # the month, rounded once


def test_idle_usage_is_held_time_outside_each_runs_reported_steps(db, pool, tenants):
    acme, globex, _ = tenants
    spec = {"name": "idle", "devices": 1, "flavors": ["ascend-910b"]}
    trained = services.submit_job(tenant_id=acme.id, user_id=None, spec=parse_job_spec(spec)).id
    never = services.submit_job(tenant_id=acme.id, user_id=None, spec=parse_job_spec(spec)).id
    other = services.submit_job(tenant_id=globex.id, user_id=None, spec=parse_job_spec(spec)).id
    assert sorted(services.admit_queued_jobs()) == sorted([trained, never, other])
    start = NOW - timedelta(hours=3)
    # Held for an hour; its steps were reported from 10 to 50 minutes in: 20 minutes idle.
    Allocation.objects.filter(job_id=trained).update(started_at=start, ended_at=start + timedelta(hours=1))
    JobAttempt.objects.filter(job_id=trained, number=0).update(
        first_step_at=start + timedelta(minutes=10), last_step_at=start + timedelta(minutes=50)
    )
    # Held from half an hour ago until now without a single step: all idle.
    Allocation.objects.filter(job_id=never).update(started_at=NOW - timedelta(minutes=30))
    Allocation.objects.filter(job_id=other).update(started_at=start)

    rows = services.idle_usage(acme.id, since=NOW - timedelta(days=1), now=NOW)
    assert [(r.flavor, r.held_s, r.idle_s) for r in rows] == [("ascend-910b", 5400.0, 1200.0 + 1800.0)]
    # From a later start, only what lies after it counts.
    later = services.idle_usage(acme.id, since=start + timedelta(minutes=40), now=NOW)
    assert [(r.held_s, r.idle_s) for r in later] == [(1200.0 + 1800.0, 600.0 + 1800.0)]


def test_quota_and_utilization_history_average_each_bucket(db, pool, tenants):
    from django.conf import settings

    from jobs.throughput import nau_rates
    from runtime.inventory import load_pool
    from tenants.models import Quota

    acme = tenants[0]
    spec = {"name": "charted", "devices": 1, "flavors": ["ascend-910b"]}
    job_id = services.submit_job(tenant_id=acme.id, user_id=None, spec=parse_job_spec(spec)).id
    assert services.admit_queued_jobs() == [job_id]
    Quota.objects.create(tenant_id=acme.id, resource="ascend-910b", nominal=0)
    # Four hours in 96 buckets of 150 s: held from 1 h in to 3 h in, trained from 1.5 h in to 2.5 h in.
    since = NOW - timedelta(hours=4)
    Allocation.objects.filter(job_id=job_id).update(
        started_at=since + timedelta(hours=1), ended_at=since + timedelta(hours=3)
    )
    JobAttempt.objects.filter(job_id=job_id, number=0).update(
        first_step_at=since + timedelta(hours=1.5), last_step_at=since + timedelta(hours=2.5)
    )
    held = [1.0 if 24 <= i < 72 else 0.0 for i in range(96)]
    nau = nau_rates(["synthetic-mlp"])[("synthetic-mlp", "ascend-910b")] / 1000

    quota = services.quota_history(tenant_id=acme.id, hours=4, now=NOW)
    pool_file = load_pool(settings.POLYCHIP_POOL_FILE)
    assert quota.span.bucket_s == 150.0
    assert list(quota.in_use["ascend-910b"]) == held
    assert list(quota.in_use["nau"]) == [round(nau * h, 3) for h in held]
    assert quota.nominal == {"ascend-910b": 0.0, "nau": 1000.0}

    utilization = services.utilization_history(hours=4, now=NOW)
    row = next(f for f in utilization.flavors if f.flavor == "ascend-910b")
    assert row.devices == sum(1 for d in pool_file.devices() if d.flavor == "ascend-910b")
    assert list(row.allocated) == held
    assert list(row.training) == [1.0 if 36 <= i < 60 else 0.0 for i in range(96)]
    assert all(sum(f.allocated) == 0 for f in utilization.flavors if f.flavor != "ascend-910b")


def test_the_history_apis_name_a_bad_hours_and_answer_for_the_tenant_only(db, pool, tenants):
    from rest_framework.test import APIClient

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {tenants[0].token}")
    for bad in ("0", "745", "two"):
        answer = api.get(f"/api/v1/quotas/history?hours={bad}")
        assert answer.status_code == 400 and answer.json()["error"]["field"] == "hours", answer.content
    body = api.get("/api/v1/quotas/history?hours=2").json()
    assert len(body["buckets"]) == 96 and body["bucket_s"] == 75.0
    assert [r["resource"] for r in body["resources"]] == ["nau"]
    assert body["resources"][0]["in_use"] == [0.0] * 96 == body["resources"][0]["borrowed"]
    assert api.get("/api/v1/operator/utilization").status_code == 403  # a tenant's token is no operator
