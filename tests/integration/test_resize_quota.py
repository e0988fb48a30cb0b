"""Quotas hold when a job changes size outside admission: a restart after a failure takes only what its
tenant's quota has room for, and a shrunk job grows back only into that room, after the queue.

Against PostgreSQL, calling the recovery module as the observe sweep and beat do; no ranks run (the
backend that would be asked to stop a run is a recorder)."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.utils import timezone

from jobs import dispatch, recovery
from jobs.models import Allocation, Device, JobAttempt, JobEvent, JobState, TrainingJob
from tenants.models import NAU_RESOURCE, Quota
from tests.integration.test_admission import in_cohort, quota, submit

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

NPU = "ascend-910b"  # the test pool has four, on one node


def _only_device_quota(tenant, nominal: int, borrowing: int | None = 0) -> None:
    Quota.objects.filter(tenant_id=tenant.id, resource=NAU_RESOURCE).delete()
    quota(tenant, NPU, nominal, borrowing)


def _job(tenant, state: str, devices: int, min_devices: int, held: int = 0) -> TrainingJob:
    spec = {"name": "elastic", "devices": devices, "min_devices": min_devices, "flavors": [NPU]}
    job = TrainingJob.objects.create(tenant_id=tenant.id, name="elastic", spec=spec, state=state, total_steps=100)
    JobAttempt.objects.create(job=job, number=0, backend_handle={"run": "fake"})
    now = timezone.now()
    for rank, device in enumerate(Device.objects.filter(flavor__name=NPU).order_by("device_id")[:held]):
        Allocation.objects.create(job=job, device=device, rank=rank, started_at=now)
    if held:
        demand = {NPU: held}
        TrainingJob.objects.filter(pk=job.pk).update(demand=demand, admitted_at=now)
    return job


def _reallocate(job: TrainingJob):
    with transaction.atomic():
        return recovery._reallocate(TrainingJob.objects.get(pk=job.pk), (), frozenset())


def test_a_restart_takes_only_what_the_quota_has_room_for(pool, tenants, sent):
    _only_device_quota(tenants[0], nominal=2)
    job = _job(tenants[0], JobState.RECOVERING, devices=4, min_devices=1)

    plan = _reallocate(job)  # four NPUs are free, the quota has room for two

    assert plan is not None and len(plan.devices) == 2
    job.refresh_from_db()
    assert job.state == JobState.ADMITTED
    assert (job.demand[NPU], job.borrowing) == (2, False)
    assert job.allocations.filter(ended_at__isnull=True).count() == 2
    assert sent == [(dispatch.PROVISION, job.pk)]


def test_a_restart_that_borrows_is_marked_borrowing_so_that_reclaim_can_find_it(pool, tenants, sent):
    lender = tenants[1]
    _only_device_quota(tenants[0], nominal=1, borrowing=2)
    _only_device_quota(lender, nominal=3)
    in_cohort("lab", tenants[0], lender)
    job = _job(tenants[0], JobState.RECOVERING, devices=4, min_devices=1)

    plan = _reallocate(job)

    assert plan is not None and len(plan.devices) == 3  # its one, and two borrowed from the lender
    job.refresh_from_db()
    assert (job.demand[NPU], job.borrowing) == (3, True)


def test_a_restart_with_no_room_in_the_quota_waits_and_says_so(pool, tenants, sent):
    _only_device_quota(tenants[0], nominal=2)
    _job(tenants[0], JobState.RUNNING, devices=2, min_devices=2, held=2)  # the quota is used up
    job = _job(tenants[0], JobState.RECOVERING, devices=2, min_devices=1)

    assert _reallocate(job) is None

    job.refresh_from_db()
    assert job.state == JobState.RECOVERING and sent == []
    assert job.pending_reason == (
        f"waiting for devices: needs at least 1 of {NPU}; 2 free, 0 of them within the tenant's quota"
    )
    assert JobEvent.objects.filter(job=job, kind=JobEvent.Kind.RECOVERY, message=job.pending_reason).exists()


def test_a_shrunk_job_grows_back_only_into_its_quota(pool, tenants, stops):
    _only_device_quota(tenants[0], nominal=3)
    job = _job(tenants[0], JobState.RUNNING, devices=4, min_devices=1, held=1)  # three NPUs free

    assert recovery.shrunk_job_ids() == [job.pk]
    assert recovery.grow_back(job.pk) is True

    # To three (the quota), not to the four it asked for, though four NPUs would be there after the move.
    assert stops == [({"run": "fake"}, "growing back from 1 to 3 devices (3 free again, within quota)")]


def test_a_shrunk_job_with_no_room_in_its_quota_stays(pool, tenants, stops):
    _only_device_quota(tenants[0], nominal=1)
    job = _job(tenants[0], JobState.RUNNING, devices=4, min_devices=1, held=1)

    assert recovery.grow_back(job.pk) is False
    assert stops == []


def test_a_shrunk_job_does_not_grow_past_a_queued_job_that_could_start(pool, tenants, stops):
    _only_device_quota(tenants[0], nominal=4)
    job = _job(tenants[0], JobState.RUNNING, devices=4, min_devices=1, held=1)
    queued = submit(tenants[1], 2)  # globex's job fits the three free NPUs: it goes first

    assert recovery.grow_back(job.pk) is False
    assert stops == []

    # A queued job that could not start on what is free does not hold the growth back.
    TrainingJob.objects.filter(pk=queued).update(state=JobState.CANCELLED)
    submit(tenants[1], 4, wait=True)
    assert recovery.grow_back(job.pk) is True
    assert stops == [({"run": "fake"}, "growing back from 1 to 4 devices (3 free again, within quota)")]


def test_a_shrunk_job_does_not_grow_into_devices_a_queued_job_waits_to_be_released(pool, tenants, stops):
    # One NPU free and two still occupied by a preempted run whose teardown is not confirmed yet: the
    # queued job of three starts on them within seconds, so the shrunk job does not grow into the free one.
    _only_device_quota(tenants[0], nominal=4)
    job = _job(tenants[0], JobState.RUNNING, devices=4, min_devices=1, held=1)
    waiting = TrainingJob.objects.get(pk=submit(tenants[1], 3))
    TrainingJob.objects.filter(pk=waiting.pk).update(attempt=1)
    JobAttempt.objects.filter(job=waiting, number=0).update(backend_handle={"run": "old"})
    JobAttempt.objects.create(job=waiting, number=1)
    now = timezone.now()
    for rank, device in enumerate(Device.objects.filter(flavor__name=NPU).order_by("device_id")[1:3]):
        Allocation.objects.create(job=waiting, device=device, rank=rank, started_at=now, ended_at=now)

    assert recovery.grow_back(job.pk) is False
    assert stops == []

    JobAttempt.objects.filter(job=waiting, number=0).update(torn_down_at=timezone.now())  # gone: three free
    TrainingJob.objects.filter(pk=waiting.pk).update(state=JobState.CANCELLED)
    assert recovery.grow_back(job.pk) is True


def test_a_shrunk_job_grows_only_when_its_faster_steps_repay_the_move(pool, tenants, stops):
    # Measured: 100 samples/s on one NPU, the default global batch of 96 (0.96 s a step). On three, the
    # table (this class never measured: per-device rates by peak figures) gives 3x: 0.32 s. Each step
    # saves 0.64 s; the move costs POLYCHIP_MOVE_COST_S (30 s) until restarts of the class measure it.
    _only_device_quota(tenants[0], nominal=3)
    job = _job(tenants[0], JobState.RUNNING, devices=4, min_devices=1, held=1)
    TrainingJob.objects.filter(pk=job.pk).update(samples_per_s=100.0, total_steps=100, steps_done=60)

    assert recovery.grow_back(job.pk) is False  # 40 steps left save 25.6 s: less than the 30 s move
    assert stops == []

    TrainingJob.objects.filter(pk=job.pk).update(steps_done=0)
    assert recovery.grow_back(job.pk) is True  # 100 steps left save 64 s
    JobAttempt.objects.filter(job=job).update(stop_requested="")
    stops.clear()

    # Restarts of the class measured 5 s from frozen to training (the median of what they measured).
    for seconds in (4.0, 5.0, 90.0):
        TrainingJob.objects.create(
            tenant_id=tenants[1].id,
            name="measured",
            spec={"name": "measured", "devices": 1, "flavors": [NPU]},
            state=JobState.SUCCEEDED,
            recovery={"resumed": {"since_frozen_s": seconds}},
        )
    assert recovery.move_cost_s("synthetic-mlp") == 5.0
    TrainingJob.objects.filter(pk=job.pk).update(steps_done=60)
    assert recovery.grow_back(job.pk) is True  # 25.6 s saved for a 5 s move
