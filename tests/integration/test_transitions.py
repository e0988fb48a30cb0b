"""Every state change goes through the one claim, which follows the transition table: a walk over
every (from, to) pair, the bulk form, attempts, and the event each move appends."""

from __future__ import annotations

import itertools

import pytest
from django.db import connection, transaction
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from jobs import transitions
from jobs.models import TRANSITIONS, JobAttempt, JobEvent, JobState, TrainingJob

SPEC = {"name": "walk", "devices": 1, "flavors": ["a100-sxm"]}


def _job(tenant_id: int, state: str) -> TrainingJob:
    job = TrainingJob.objects.create(tenant_id=tenant_id, name="walk", spec=SPEC, state=state)
    JobAttempt.objects.create(job=job, number=0)
    return job


@pytest.mark.parametrize(("source", "target"), list(itertools.product(JobState.values, JobState.values)))
def test_the_claim_moves_exactly_what_the_table_lists(tenants, source, target):
    job = _job(tenants[0].id, source)
    with transaction.atomic():
        moved = transitions.claim(job.pk, target, message="walk")
    listed = target in TRANSITIONS[source]
    assert (moved is not None) == listed
    job.refresh_from_db()
    assert job.state == (target if listed else source)
    events = list(JobEvent.objects.filter(job=job).values_list("from_state", "to_state", "message"))
    assert events == ([(source, target, "walk")] if listed else [])


def test_asking_for_a_move_the_table_does_not_list_is_a_programming_error(tenants):
    job = _job(tenants[0].id, JobState.SUCCEEDED)
    with pytest.raises(ValueError, match="succeeded -> running"), transaction.atomic():
        transitions.claim(job.pk, JobState.RUNNING, from_states=[JobState.SUCCEEDED], message="never")
    with pytest.raises(ValueError, match="queued -> running"):
        transitions.claim_many([], JobState.QUEUED, JobState.RUNNING, now=job.created_at)


def test_a_claim_for_a_past_attempt_changes_nothing(tenants):
    job = _job(tenants[0].id, JobState.ADMITTED)
    with transaction.atomic():
        requeued = transitions.claim(job.pk, JobState.QUEUED, attempt=0, next_attempt=True, message="preempted")
    assert requeued is not None and requeued.attempt == 1
    with transaction.atomic():
        assert transitions.claim(job.pk, JobState.ADMITTED, attempt=0, message="stale") is None
    ended, started = JobAttempt.objects.filter(job=job).order_by("number")
    assert (ended.ended_as, ended.end_reason, ended.ended_at is not None) == (JobState.QUEUED, "preempted", True)
    assert (started.number, started.ended_at) == (1, None)


def test_the_bulk_claim_moves_those_still_in_the_source_state_and_reports_the_rest(tenants):
    waiting = [_job(tenants[0].id, JobState.QUEUED) for _ in range(3)]
    TrainingJob.objects.filter(pk=waiting[1].pk).update(state=JobState.CANCELLED)  # a cancel won the race
    moves = [
        transitions.BulkMove(job.pk, {"pending_reason": ""}, f"admitted {job.pk}", {"n": job.pk}) for job in waiting
    ]
    with transaction.atomic():
        won, lost = transitions.claim_many(moves, JobState.QUEUED, JobState.ADMITTED, now=waiting[0].created_at)
    assert [job.pk for job in won] == [waiting[0].pk, waiting[2].pk]
    assert lost == [waiting[1].pk]
    events = JobEvent.objects.filter(job__in=waiting).order_by("pk")
    assert [(e.job_id, e.to_state, e.data) for e in events] == [
        (waiting[0].pk, JobState.ADMITTED, {"n": waiting[0].pk}),
        (waiting[2].pk, JobState.ADMITTED, {"n": waiting[2].pk}),
    ]


def test_the_bulk_claim_writes_each_jobs_own_values_and_what_the_database_computes(tenants):
    waiting = [_job(tenants[0].id, JobState.ADMITTED) for _ in range(2)]
    moves = [
        transitions.BulkMove(
            job.pk,
            {"demand": {"nau": 1000 * (n + 1)}, "borrowing": n == 1, "preemptions": F("preemptions") + 1},
            "preempted",
            {},
        )
        for n, job in enumerate(waiting)
    ]
    now = waiting[0].created_at
    with transaction.atomic():
        won, lost = transitions.claim_many(moves, JobState.ADMITTED, JobState.QUEUED, now=now, next_attempt=True)
    assert (len(won), lost) == (2, [])
    rows = TrainingJob.objects.filter(pk__in=[job.pk for job in waiting]).order_by("pk")
    assert [(r.state, r.state_changed_at, r.demand, r.borrowing, r.preemptions, r.attempt) for r in rows] == [
        (JobState.QUEUED, now, {"nau": 1000}, False, 1, 1),
        (JobState.QUEUED, now, {"nau": 2000}, True, 1, 1),
    ]


def test_a_bulk_claim_that_would_compute_a_field_differently_per_job_is_refused_before_it_writes(tenants):
    waiting = [_job(tenants[0].id, JobState.ADMITTED) for _ in range(2)]
    moves = [
        transitions.BulkMove(job.pk, {"preemptions": F("preemptions") + n}, "x", {}) for n, job in enumerate(waiting)
    ]
    with (
        CaptureQueriesContext(connection) as queries,
        pytest.raises(ValueError, match="computes preemptions the same way"),
        transaction.atomic(),
    ):
        transitions.claim_many(moves, JobState.ADMITTED, JobState.QUEUED, now=waiting[0].created_at)
    written = [q["sql"] for q in queries.captured_queries if q["sql"].lstrip().upper().startswith(("UPDATE", "INSERT"))]
    assert written == []
