"""Budgets, on PostgreSQL: a soft budget alerts once; a hard one stops the tenant's new admissions
with the reason on the pending job, counting devices held now as well as the ledger.

The admission cycle is called directly, as the Celery task would call it; no worker runs. The standard
price book charges 1.65 an hour for an ascend-910b.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing import services as billing
from billing.contracts import UsageInterval
from billing.models import BudgetAlert
from jobs import services
from jobs.models import Allocation, JobState, TrainingJob
from runtime.jobspec import parse_job_spec

pytestmark = pytest.mark.integration


def submit(tenant, devices=1, name="job"):
    spec = {"name": name, "devices": devices, "flavors": ["ascend-910b"]}
    return services.submit_job(tenant_id=tenant.id, user_id=None, spec=parse_job_spec(spec)).id


def spent(tenant, hours, key="past"):
    """Usage this month already in the ledger: ``hours`` of one ascend-910b, ended a minute ago."""
    ended = timezone.now() - timedelta(minutes=1)
    started = max(ended - timedelta(hours=hours), ended.replace(day=1, hour=0, minute=0, second=0, microsecond=0))
    billing.ingest_usage(
        [
            UsageInterval(
                key=key,
                tenant_id=tenant.id,
                job_id=0,
                device_id="npu-910b-0/0",
                flavor="ascend-910b",
                started_at=started,
                ended_at=ended,
            )
        ]
    )
    billing.relay_usage()
    return Decimal("1.65") * Decimal((ended - started).total_seconds()) / 3600


def test_a_hard_budget_stops_new_admissions_and_says_why(db, pool, tenants):
    acme, globex, _ = tenants
    cost = spent(acme, hours=0.5)
    billing.set_budgets(acme.id, soft=None, hard=(cost - Decimal("0.10")).quantize(Decimal("0.01")))
    blocked = submit(acme, name="blocked")
    other = submit(globex, name="other")

    assert services.admit_queued_jobs() == [other]
    waiting = TrainingJob.objects.get(pk=blocked)
    assert waiting.state == JobState.QUEUED
    assert waiting.pending_reason.startswith("hard budget reached: USD ")
    assert "raise the budget" in waiting.pending_reason
    assert list(BudgetAlert.objects.filter(tenant_id=acme.id).values_list("level", flat=True)) == ["hard"]

    # Raised above what was spent: the next cycle admits it, and the reason is gone.
    billing.set_budgets(acme.id, soft=None, hard=(cost + Decimal("10")).quantize(Decimal("0.01")))
    assert services.admit_queued_jobs() == [blocked]
    assert TrainingJob.objects.get(pk=blocked).pending_reason == ""


def test_devices_held_now_count_against_the_budget(db, pool, tenants):
    acme = tenants[0]
    running = submit(acme, devices=2, name="running")
    assert services.admit_queued_jobs() == [running]
    # It has held two ascend-910b for an hour (within this month, however early in it we are).
    hour_ago = max(timezone.now() - timedelta(hours=1), timezone.now().replace(day=1, hour=0, minute=0))
    Allocation.objects.filter(job_id=running).update(started_at=hour_ago)
    held_s = (timezone.now() - hour_ago).total_seconds()
    expected = Decimal("1.65") * 2 * Decimal(held_s) / 3600

    status = billing.budget_status(acme.id, services.open_usage([acme.id]))
    assert abs(status.spend - expected) < Decimal("0.02")
    assert billing.budget_status(acme.id).spend == Decimal("0.00")  # without the open allocations

    billing.set_budgets(acme.id, soft=None, hard=(expected / 2).quantize(Decimal("0.01")))
    queued = submit(acme, name="queued")
    assert services.admit_queued_jobs() == []
    assert TrainingJob.objects.get(pk=queued).pending_reason.startswith("hard budget reached")
    # The running job keeps running: a hard budget stops admissions, not work.
    assert TrainingJob.objects.get(pk=running).state == JobState.ADMITTED


def test_a_soft_budget_alerts_once_per_period_and_admits(db, pool, tenants):
    acme = tenants[0]
    cost = spent(acme, hours=0.25)
    billing.set_budgets(acme.id, soft=(cost / 2).quantize(Decimal("0.01")), hard=None)
    for _ in range(3):
        statuses = billing.check_budgets_now()
    assert statuses[acme.id].soft_reached and not statuses[acme.id].hard_reached
    alerts = list(BudgetAlert.objects.filter(tenant_id=acme.id).values_list("level", "budget"))
    assert alerts == [("soft", (cost / 2).quantize(Decimal("0.01")))]
    job_id = submit(acme)
    assert services.admit_queued_jobs() == [job_id]
    # The other tenants have no budget and no alert.
    assert not BudgetAlert.objects.exclude(tenant_id=acme.id).exists()


def test_bad_budgets_are_refused_naming_the_field(db, tenants):
    acme = tenants[0]
    for soft, hard, field in (
        (Decimal("-1"), None, "soft_budget"),
        (None, Decimal("1.001"), "hard_budget"),
        (None, Decimal("NaN"), "hard_budget"),
    ):
        with pytest.raises(billing.BillingError) as refused:
            billing.set_budgets(acme.id, soft=soft, hard=hard)
        assert refused.value.field == field
    assert billing.budget_status(acme.id).hard_budget is None
