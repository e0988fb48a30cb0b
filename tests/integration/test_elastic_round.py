"""The elastic round in production: running elastic jobs shrink for queued work the devices serve better,
grow into free devices within their tenant's quota, and the move that follows runs on the count asked.

Against PostgreSQL, calling ``jobs.resizing`` as beat's task does; no ranks run (the backend that would be
asked to stop a run is a recorder)."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.utils import timezone

from jobs import admission, dispatch, recovery, resizing
from jobs.models import Allocation, Device, JobAttempt, JobEvent, JobState, TrainingJob
from tenants.models import NAU_RESOURCE, Quota
from tests.integration.test_admission import quota, submit

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

NPU = "ascend-910b"  # the test pool has four, on one node


def _only_device_quota(tenant, nominal: int) -> None:
    Quota.objects.filter(tenant_id=tenant.id, resource=NAU_RESOURCE).delete()
    quota(tenant, NPU, nominal, 0)


def _running(
    tenant,
    *,
    devices: int,
    min_devices: int,
    held: int,
    elastic: bool = True,
    steps: int = 100_000,
    flavors: tuple[str, ...] = (NPU,),
):
    """A running job holding ``held`` devices of its first flavor."""
    spec = {
        "name": "elastic",
        "devices": devices,
        "min_devices": min_devices,
        "elastic": elastic,
        "flavors": list(flavors),
    }
    job = TrainingJob.objects.create(
        tenant_id=tenant.id, name="elastic", spec=spec, state=JobState.RUNNING, total_steps=steps
    )
    JobAttempt.objects.create(job=job, number=0, backend_handle={"run": job.pk})
    now = timezone.now()
    for rank, device in enumerate(Device.objects.filter(flavor__name=flavors[0]).order_by("device_id")[:held]):
        Allocation.objects.create(job=job, device=device, rank=rank, started_at=now)
    TrainingJob.objects.filter(pk=job.pk).update(demand={flavors[0]: held}, admitted_at=now)
    return job


def _stopped_for_a_resize(tenant, *, min_devices: int, resize_to: int) -> TrainingJob:
    """An elastic job of 4 whose attempt 0 was asked to move to ``resize_to`` devices and stopped: it is
    recovering as attempt 1, holding nothing."""
    job = _running(tenant, devices=4, min_devices=min_devices, held=0)
    JobAttempt.objects.filter(job=job, number=0).update(resize_to=resize_to, stop_requested="elastic round")
    TrainingJob.objects.filter(pk=job.pk).update(state=JobState.RECOVERING, attempt=1)
    JobAttempt.objects.create(job=job, number=1)
    return job


def _short_job(tenant, devices: int) -> int:
    job_id = submit(tenant, devices)
    TrainingJob.objects.filter(pk=job_id).update(state=JobState.QUEUED, total_steps=200)
    return job_id


def test_a_running_elastic_job_shrinks_for_a_short_queued_job_and_the_move_runs_on_the_count_asked(
    pool, tenants, stops, sent, monkeypatch
):
    acme, globex = tenants[0], tenants[1]
    _only_device_quota(acme, 4)
    _only_device_quota(globex, 2)
    job = _running(acme, devices=4, min_devices=1, held=4)  # every NPU, and a long way to go
    queued = _short_job(globex, 2)

    [resize] = resizing.elastic_round()

    assert (resize.job_id, resize.current, resize.target) == (job.pk, 4, 2)
    assert stops == [({"run": job.pk}, resize.reason)]
    assert resize.reason.startswith(
        f"elastic round: shrinking from 4 to 2 devices; the 2 it frees serve queued job {queued}"
    )
    run = JobAttempt.objects.get(job=job, number=0)
    assert (run.stop_requested, run.resize_to) == (resize.reason, 2)
    assert JobEvent.objects.get(job=job, kind=JobEvent.Kind.RECOVERY).data["resize_to"] == 2
    assert resizing.elastic_round() == []  # a job already asked to move is not asked again

    # The ranks checkpointed and stopped: the next attempt gets two of the four (its own), not all four.
    monkeypatch.setattr(recovery, "_teardown", lambda run: True)
    assert recovery.handle_stop(job.pk, 0) == JobState.ADMITTED
    job.refresh_from_db()
    assert (job.attempt, job.demand[NPU]) == (1, 2)
    assert job.allocations.filter(ended_at__isnull=True).count() == 2
    assert (dispatch.PROVISION, job.pk) in sent

    # The next admission cycle starts the queued job on the two NPUs the shrink freed.
    assert admission.run_admission_cycle().admitted == (queued,)


def test_no_shrink_for_a_queued_job_whose_quota_has_no_room_to_start_it(pool, tenants, stops):
    acme, globex = tenants[0], tenants[1]
    _only_device_quota(acme, 4)
    _only_device_quota(globex, 1)
    _running(acme, devices=4, min_devices=1, held=4)
    submit(globex, 2, wait=True)  # two NPUs, but globex may hold one

    assert resizing.elastic_round() == []
    assert stops == []


def test_an_elastic_job_grows_into_free_devices_only_as_far_as_its_quota(pool, tenants, stops):
    acme = tenants[0]
    _only_device_quota(acme, 3)
    job = _running(acme, devices=4, min_devices=1, held=1)  # three NPUs free, room for two more

    [resize] = resizing.elastic_round()

    assert (resize.job_id, resize.current, resize.target) == (job.pk, 1, 3)
    assert stops == [({"run": job.pk}, resize.reason)]
    assert resize.reason.startswith("elastic round: growing from 1 to 3 devices, free and within quota")


def test_a_job_that_is_not_elastic_keeps_its_devices(pool, tenants, stops):
    acme, globex = tenants[0], tenants[1]
    _only_device_quota(acme, 4)
    _only_device_quota(globex, 2)
    _running(acme, devices=4, min_devices=1, held=4, elastic=False)  # a floor for recovery, not elastic
    _short_job(globex, 2)

    assert resizing.elastic_round() == []
    assert stops == []


def test_a_nearly_done_job_is_not_moved_for_a_gain_that_does_not_repay_the_move(pool, tenants, stops):
    # One step left at 2 devices: a bigger gang finishes nothing more within the round, and the move costs.
    acme = tenants[0]
    _only_device_quota(acme, 4)
    job = _running(acme, devices=4, min_devices=1, held=2, steps=1)
    assert job.pk and resizing.elastic_round() == []
    assert stops == []


def test_a_resize_that_waits_for_devices_keeps_its_count_when_retried(pool, tenants, sent):
    acme = tenants[0]
    _only_device_quota(acme, 4)
    job = _stopped_for_a_resize(acme, min_devices=1, resize_to=2)

    assert recovery.retry_recovering(job.pk) is True

    job.refresh_from_db()
    assert job.allocations.filter(ended_at__isnull=True).count() == 2  # four are free; the resize asked two


def test_the_reallocation_keeps_a_resize_within_the_jobs_range(pool, tenants, sent):
    acme = tenants[0]
    _only_device_quota(acme, 4)
    job = _stopped_for_a_resize(acme, min_devices=2, resize_to=1)
    with transaction.atomic():
        plan = recovery._reallocate(TrainingJob.objects.get(pk=job.pk), (), frozenset())
    assert plan is not None and len(plan.devices) == 2  # its minimum, not the 1 asked


def test_the_sweep_leaves_a_shrunk_elastic_job_to_the_round_and_grows_back_only_others(pool, tenants, settings):
    # Growing back every sweep would undo the round's shrink before the queued job it served could start.
    acme = tenants[0]
    _only_device_quota(acme, 4)
    elastic = _running(acme, devices=4, min_devices=1, held=1)
    assert recovery.shrunk_job_ids() == []
    settings.POLYCHIP_ELASTIC_ROUND_S = 0  # no round: growing back is the sweep's again
    assert recovery.shrunk_job_ids() == [elastic.pk]


A100, H100 = "a100-sxm", "h100-sxm"  # two of each in the test pool; an H100 about three times as fast


def _on_a100s_that_may_move_to_h100s(tenant):
    Quota.objects.filter(tenant_id=tenant.id, resource=NAU_RESOURCE).delete()
    quota(tenant, A100, 2, 0)
    quota(tenant, H100, 2, 0)
    return _running(tenant, devices=2, min_devices=1, held=2, flavors=(A100, H100))


def _held_flavors(job) -> list[str]:
    rows = job.allocations.filter(ended_at__isnull=True).values_list("device__flavor__name", flat=True)
    return sorted(rows)


def test_an_elastic_job_moves_to_faster_free_chips_of_its_spec_and_the_move_lands_on_them(
    pool, tenants, stops, sent, monkeypatch
):
    acme = tenants[0]
    job = _on_a100s_that_may_move_to_h100s(acme)

    [resize] = resizing.elastic_round()

    assert (resize.job_id, resize.current, resize.target, resize.flavors) == (job.pk, 2, 2, (H100,))
    assert resize.reason.startswith(f"elastic round: moving from 2 {A100} to 2 {H100}, free and within quota")
    assert stops == [({"run": job.pk}, resize.reason)]
    run = JobAttempt.objects.get(job=job, number=0)
    assert (run.resize_to, run.resize_flavors) == (2, [H100])
    assert JobEvent.objects.get(job=job, kind=JobEvent.Kind.RECOVERY).data["resize_flavors"] == [H100]

    monkeypatch.setattr(recovery, "_teardown", lambda run: True)
    assert recovery.handle_stop(job.pk, 0) == JobState.ADMITTED
    job.refresh_from_db()
    assert (job.attempt, _held_flavors(job)) == (1, [H100, H100])


def test_a_move_whose_chips_were_taken_meanwhile_lands_on_the_jobs_other_flavors(pool, tenants, stops, monkeypatch):
    acme, globex = tenants[0], tenants[1]
    job = _on_a100s_that_may_move_to_h100s(acme)
    [resize] = resizing.elastic_round()
    assert resize.flavors == (H100,)
    # Before the ranks stopped, another job took both H100s.
    other = _running(globex, devices=2, min_devices=2, held=2, elastic=False, flavors=(H100,))
    assert _held_flavors(other) == [H100, H100]

    monkeypatch.setattr(recovery, "_teardown", lambda run: True)
    assert recovery.handle_stop(job.pk, 0) == JobState.ADMITTED
    job.refresh_from_db()
    assert (job.attempt, _held_flavors(job)) == (1, [A100, A100])  # its own, free again


def test_no_move_to_chips_its_tenant_has_no_quota_for(pool, tenants, stops):
    acme = tenants[0]
    _on_a100s_that_may_move_to_h100s(acme)
    quota(acme, H100, 1, 0)  # room for one H100: the move to two is not made

    assert all(resize.flavors != (H100,) for resize in resizing.elastic_round())
    assert all(reason.find(f"to 2 {H100}") < 0 for _, reason in stops)
