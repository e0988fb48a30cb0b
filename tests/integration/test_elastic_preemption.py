"""Preemption shrinks a running elastic job rather than stopping it: reclaim and priority take from an
elastic borrower only the devices the preempting job needs, down to its minimum; the borrower moves onto
the rest (checkpoint, stop at a step, restart on fewer) and runs on, and the preempting job starts on what
it gave back.

Against PostgreSQL, through the admission cycle and the recovery that handles the move's stop; no ranks
run (the backend that would be asked to stop a run is a recorder)."""

from __future__ import annotations

import pytest

from jobs import admission, dispatch, recovery
from jobs.models import JobAttempt, JobEvent, JobState, TrainingJob
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
    sent.clear()  # the submit's own request for a cycle

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
    # No cycle asked for meanwhile: until the move gives the devices back, each would decide the same.
    assert (dispatch.ADMIT,) not in sent

    # Until its ranks have stopped it holds all four: the next cycle decides the same and asks nothing new.
    again = admission.run_admission_cycle()
    assert (again.admitted, again.preempted, again.shrunk) == ((), (), (job.pk,))
    assert stops == [({"run": job.pk}, run.stop_requested)]
    assert JobAttempt.objects.get(job=job, number=0).resize_to == 2

    # The ranks checkpointed and stopped: the next attempt runs on two, and the owner starts on the other two.
    monkeypatch.setattr(recovery, "_teardown", lambda run: True)
    assert recovery.handle_stop(job.pk, 0) == JobState.ADMITTED
    job.refresh_from_db()
    assert (job.attempt, job.demand[NPU]) == (1, 2)
    assert (dispatch.PROVISION, job.pk) in sent
    assert (dispatch.ADMIT,) in sent  # the devices it gave back: a cycle starts the owner at once
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
