"""Preemption shrinks a running elastic job rather than stopping it: reclaim and priority take from an
elastic borrower only the devices the preempting job needs, down to its minimum; the borrower moves onto
the rest (checkpoint, stop at a step, restart on fewer) and runs on, and the preempting job starts on what
it gave back.

Against PostgreSQL, through the admission cycle and the recovery that handles the move's stop; no ranks
run (the backend that would be asked to stop a run is a recorder)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import admission, dispatch, moving, recovery, services
from jobs.models import JobAttempt, JobEvent, JobState, TrainingJob
from runtime.jobspec import parse_job_spec
from runtime.scheduling import Preemption
from tenants.models import NAU_RESOURCE, Quota
from tests.integration.test_admission import in_cohort, quota, submit
from tests.integration.test_elastic_round import NPU, _running

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def lab(pool, tenants):
    """acme (1 NPU of its own, may borrow 3) and globex (3 NPUs of its own) share a cohort of the four."""
    acme, globex = tenants[0], tenants[1]
    Quota.objects.filter(tenant_id__in=[acme.id, globex.id], resource=NAU_RESOURCE).delete()
    quota(acme, NPU, 1, 3)
    quota(globex, NPU, 3, 0)
    in_cohort("lab", acme, globex)
    return acme, globex


def _borrower(tenant, *, min_devices: int) -> TrainingJob:
    job = _running(tenant, devices=4, min_devices=min_devices, held=4)  # every NPU, 3 of them borrowed
    TrainingJob.objects.filter(pk=job.pk).update(borrowing=True)
    return job


def test_reclaim_shrinks_an_elastic_borrower_which_runs_on_and_the_owner_starts_on_what_it_gave_back(
    lab, stops, sent, monkeypatch
):
    acme, globex = lab
    job = _borrower(acme, min_devices=1)
    owner = submit(globex, 2)

    report = admission.run_admission_cycle()

    assert (report.admitted, report.preempted, report.shrunk) == ((), (), (job.pk,))
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.preemptions == 0  # not re-queued: it moves onto less
    run = JobAttempt.objects.get(job=job, number=0)
    assert run.resize_to == 2
    assert run.stop_requested == (
        f"reclaimed by tenant {globex.id} within its nominal quota; shrinks from 4 to 2 devices (for job {owner})"
    )
    assert stops == [({"run": job.pk}, run.stop_requested)]
    assert TrainingJob.objects.get(pk=owner).pending_reason == f"making room: shrinking elastic job {job.pk}"

    # Until its ranks have stopped it holds all four: the next cycle decides the same and asks nothing new.
    again = admission.run_admission_cycle()
    assert (again.admitted, again.preempted, again.shrunk) == ((), (), (job.pk,))
    assert stops == [({"run": job.pk}, run.stop_requested)]
    assert JobAttempt.objects.get(job=job, number=0).resize_to == 2

    # The ranks checkpointed and stopped: the next attempt runs on two, and the owner starts on the other two.
    monkeypatch.setattr(recovery, "_teardown", lambda run: True)
    sent.clear()
    assert recovery.handle_stop(job.pk, 0) == JobState.ADMITTED
    job.refresh_from_db()
    assert (job.attempt, job.demand[NPU]) == (1, 2)
    assert (dispatch.PROVISION, job.pk) in sent
    assert (dispatch.ADMIT,) in sent  # it gave devices back: a cycle is asked for at once
    assert admission.run_admission_cycle().admitted == (owner,)
    held = {
        j: set(TrainingJob.objects.get(pk=j).allocations.filter(ended_at__isnull=True).values_list("device", flat=True))
        for j in (job.pk, owner)
    }
    assert len(held[job.pk]) == len(held[owner]) == 2 and not held[job.pk] & held[owner]


def test_a_move_already_asked_goes_on_onto_no_more_than_the_shrink_leaves(lab, stops):
    acme, globex = lab
    job = _borrower(acme, min_devices=1)
    JobAttempt.objects.filter(job=job, number=0).update(stop_requested="node drained", resize_to=None)
    submit(globex, 3)

    report = admission.run_admission_cycle()

    assert report.shrunk == (job.pk,) and stops == []  # its ranks were asked to stop already
    assert JobAttempt.objects.get(job=job, number=0).resize_to == 1
    event = JobEvent.objects.filter(job=job, kind=JobEvent.Kind.RECOVERY).latest("pk")
    assert event.message.startswith("its move goes on, onto no more than 1 devices: reclaimed by tenant")


def test_a_lower_count_already_asked_stays_and_a_rounds_flavors_give_way(lab, stops):
    acme, globex = lab
    job = _borrower(acme, min_devices=1)
    JobAttempt.objects.filter(job=job, number=0).update(
        stop_requested="elastic round", stop_asked_at=timezone.now(), resize_to=1, resize_flavors=["h100-sxm"]
    )
    submit(globex, 2)  # would leave it 2; it is moving onto 1 already

    assert admission.run_admission_cycle().shrunk == (job.pk,)

    run = JobAttempt.objects.get(job=job, number=0)
    assert (run.resize_to, run.resize_flavors) == (1, None)


def test_a_move_not_made_within_the_stop_window_gives_way_to_stopping_whole(lab, stops):
    # Asked long ago and still running: a hung run, or a stop that never reached it. The job that made
    # room does not wait on it any longer.
    acme, globex = lab
    job = _borrower(acme, min_devices=1)
    asked = timezone.now() - timedelta(seconds=moving.STOP_WINDOW_S + 5)
    JobAttempt.objects.filter(job=job, number=0).update(stop_requested="node drained", stop_asked_at=asked)
    submit(globex, 2)

    report = admission.run_admission_cycle()

    assert (report.preempted, report.shrunk) == ((job.pk,), ())
    assert TrainingJob.objects.get(pk=job.pk).state == JobState.QUEUED


def test_a_preview_says_which_job_would_shrink(lab):
    acme, globex = lab
    job = _borrower(acme, min_devices=1)
    spec = parse_job_spec({"name": "owner", "devices": 2, "flavors": [NPU]})

    preview = services.preview_submit(tenant_id=globex.id, spec=spec)

    assert (preview.starts_now, preview.preempts) == (False, (job.pk,))
    assert preview.reason == f"would shrink elastic job {job.pk} to 2 devices first"


def test_one_preemption_per_victim_the_least_it_keeps_holds():
    shrink = [Preemption(7, 1, "a", keep=3), Preemption(7, 2, "b", keep=1), Preemption(8, 2, "c", keep=2)]
    assert {j: p.keep for j, p in admission._merged(shrink).items()} == {7: 1, 8: 2}
    evicted_after = [Preemption(7, 1, "a", keep=3), Preemption(7, 2, "b")]
    assert admission._merged(evicted_after)[7].keep is None


def test_an_elastic_borrower_that_cannot_give_enough_above_its_minimum_is_preempted_whole(lab, stops):
    acme, globex = lab
    job = _borrower(acme, min_devices=3)  # down to 3 it frees one NPU; the owner needs two
    submit(globex, 2)

    report = admission.run_admission_cycle()

    assert (report.preempted, report.shrunk) == ((job.pk,), ())
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.preemptions == 1
    assert stops == []


def test_an_elastic_borrower_not_launched_yet_is_preempted_whole(lab, stops):
    acme, globex = lab
    job = _borrower(acme, min_devices=1)
    TrainingJob.objects.filter(pk=job.pk).update(state=JobState.ADMITTED)
    JobAttempt.objects.filter(job=job, number=0).update(backend_handle=None)
    submit(globex, 2)

    report = admission.run_admission_cycle()

    assert (report.preempted, report.shrunk) == ((job.pk,), ())
    assert TrainingJob.objects.get(pk=job.pk).state == JobState.QUEUED
