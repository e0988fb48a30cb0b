"""Storing a submission in one statement (``jobs.submission``): the rows are the ORM's, the cap holds,
and a refusal writes nothing. Against PostgreSQL, where the statement runs; the ORM's path is the
reference it is compared with."""

from __future__ import annotations

import pytest
from django.forms.models import model_to_dict

from jobs import submission
from jobs.models import JobAttempt, JobEvent, JobState, TrainingJob
from runtime.jobspec import parse_job_spec
from tenants.models import Tenant
from tests.conftest import make_tenant

pytestmark = pytest.mark.integration

SPEC = {"name": "statement", "devices": {"min": 1, "max": 4}, "flavors": ["h100-sxm"], "priority": 3}


def _unsaved(tenant_id: int, user_id: int | None) -> tuple[TrainingJob, JobAttempt, JobEvent]:
    return submission.queued_job(tenant_id=tenant_id, user_id=user_id, spec=parse_job_spec(SPEC))


def _stored(job_id: int) -> tuple[dict, dict, dict]:
    """The three rows as the database holds them, without what differs between two inserts."""
    moments = {"id", "job", "created_at", "state_changed_at"}

    def row(instance) -> dict:
        return {k: v for k, v in model_to_dict(instance).items() if k not in moments}

    return (
        row(TrainingJob.objects.get(pk=job_id)),
        row(JobAttempt.objects.get(job_id=job_id)),
        row(JobEvent.objects.get(job_id=job_id)),
    )


def test_the_one_statement_writes_the_rows_the_orm_writes(db, django_user_model):
    assert submission.connections["default"].vendor == "postgresql"
    acme = make_tenant("acme")
    user_id = django_user_model.objects.get(username=acme.username).pk

    by_orm = _unsaved(acme.id, user_id)
    assert submission._store_through_orm(*by_orm, cap=10, alias="default") is None
    by_statement = _unsaved(acme.id, user_id)
    assert submission.store_queued_job(*by_statement) is None

    job, attempt, event = by_statement
    assert job.pk is not None and job.pk != by_orm[0].pk and not job._state.adding
    assert attempt.job_id == event.job_id == job.pk
    assert _stored(job.pk) == _stored(by_orm[0].pk)
    stored = TrainingJob.objects.get(pk=job.pk)
    assert (stored.created_at, stored.state_changed_at) == (job.created_at, job.state_changed_at)
    assert stored.job_spec == parse_job_spec(SPEC)  # the spec's JSON as the ORM would adapt it


def test_past_the_cap_the_statement_writes_nothing_and_says_how_many_wait(db, settings):
    acme, globex = make_tenant("acme"), make_tenant("globex")
    Tenant.objects.filter(pk=acme.id).update(max_queued_jobs=2)
    settings.POLYCHIP_MAX_QUEUED_JOBS = 1  # the cloud's default, for a tenant without its own
    for _ in range(2):
        assert submission.store_queued_job(*_unsaved(acme.id, None)) is None
    refused = _unsaved(acme.id, None)
    assert submission.store_queued_job(*refused) == 2
    assert refused[0].pk is None and refused[0]._state.adding
    assert TrainingJob.objects.filter(tenant_id=acme.id).count() == 2
    assert JobAttempt.objects.filter(job__tenant_id=acme.id).count() == 2
    assert JobEvent.objects.filter(tenant_id=acme.id).count() == 2
    # Only the tenant's own queued jobs count: another tenant's, and its own that left the queue, do not.
    assert submission.store_queued_job(*_unsaved(globex.id, None)) is None
    assert submission.store_queued_job(*_unsaved(globex.id, None)) == 1  # the default cap
    TrainingJob.objects.filter(tenant_id=acme.id).update(state=JobState.RUNNING)
    assert submission.store_queued_job(*_unsaved(acme.id, None)) is None
