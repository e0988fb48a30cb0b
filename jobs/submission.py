"""Storing a submission: the queued job, its first attempt and its "submitted" event, behind the
tenant's queue cap.

Through the ORM that is eight round trips (the tenant's cap, the count of waiting jobs, BEGIN, three
INSERTs, COMMIT) and about 4 ms of a server process's CPU, most of it building SQL. When 64
submissions arrive at once on a 2-core host, that CPU is what the last of them waits behind, and what
the admission cycle deciding them competes with. On PostgreSQL the cap, the count and the three
inserts are one statement: data-modifying CTEs run in one snapshot and commit together, so the
statement needs no transaction of its own, and the rows are written exactly as the ORM would write
them (the same instances, their columns and values prepared by their fields). Other databases (the
embedded SQLite) take the ORM's path.
"""

from __future__ import annotations

from typing import Any

from django.db import connections, models, router, transaction

from jobs import transitions
from jobs.models import JobAttempt, JobEvent, JobState, TrainingJob
from runtime.jobspec import JobSpec
from tenants import services as tenants


def queued_job(*, tenant_id: int, user_id: int | None, spec: JobSpec) -> tuple[TrainingJob, JobAttempt, JobEvent]:
    """A submission's rows, not yet stored: the job queued, its first attempt, its "submitted" event."""
    job = TrainingJob(
        tenant_id=tenant_id,
        submitted_by_id=user_id,
        name=spec.name,
        spec=spec.to_dict(),
        state=JobState.QUEUED,
        total_steps=spec.workload.steps,
        priority=spec.priority,
        job_class=spec.workload.job_class,
    )
    event = transitions.new_event(job, kind=JobEvent.Kind.TRANSITION, to_state=JobState.QUEUED, message="submitted")
    return job, JobAttempt(job=job, number=0), event


def store_queued_job(job: TrainingJob, attempt: JobAttempt, event: JobEvent) -> int | None:
    """Store the three unsaved instances (``attempt`` and ``event`` belong to ``job``) if the tenant has
    fewer jobs queued than its cap (``tenants.services.queued_jobs_cap``). Returns None when stored
    (``job.pk`` is then set), else how many are waiting. A soft cap: two submissions at the same instant
    may both see room for one."""
    alias = router.db_for_write(TrainingJob)
    if connections[alias].vendor != "postgresql":
        return _store_through_orm(job, attempt, event, cap=tenants.queued_jobs_cap(job.tenant_id), alias=alias)
    connection = connections[alias]
    job_columns, job_values = _insert_values(job, connection)
    attempt_columns, attempt_values = _insert_values(attempt, connection, parent="job_id")
    event_columns, event_values = _insert_values(event, connection, parent="job_id")
    quote = connection.ops.quote_name
    table = quote(TrainingJob._meta.db_table)

    def insert(model: type[models.Model], columns: list[str], source: str) -> str:
        return f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(map(quote, columns))}) SELECT {source}"

    def placeholders(values: list[Any]) -> str:
        # A NULL is written into the statement rather than sent: a submission leaves about half of the
        # columns empty, and with 50 parameters or fewer psycopg converts the statement once per
        # process, not at every submission (its cache's limit).
        return ", ".join("NULL" if value is None else "%s" for value in values)

    def sent(values: list[Any]) -> list[Any]:
        return [value for value in values if value is not None]

    tenant, state = quote("tenant_id"), quote("state")
    cap_sql, cap_params = tenants.queued_jobs_cap_sql(job.tenant_id)
    # S608: the identifiers are the models' own, quoted; every value travels as a parameter.
    sql = (
        f"WITH waiting AS (SELECT COUNT(*) AS n FROM {table} WHERE {tenant} = %s AND {state} = %s), "  # noqa: S608
        f"job AS ({insert(TrainingJob, job_columns, placeholders(job_values))} FROM waiting "
        f"WHERE waiting.n < {cap_sql} RETURNING {quote('id')}), "
        f"attempt AS ({insert(JobAttempt, attempt_columns, 'job.id, ' + placeholders(attempt_values))} FROM job), "
        f"event AS ({insert(JobEvent, event_columns, 'job.id, ' + placeholders(event_values))} FROM job) "
        "SELECT waiting.n, job.id FROM waiting LEFT JOIN job ON true"
    )
    params = [job.tenant_id, JobState.QUEUED, *sent(job_values), *cap_params, *sent(attempt_values)]
    params += sent(event_values)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        waiting, job_id = cursor.fetchone()
    if job_id is None:
        return int(waiting)
    job.pk, job._state.adding, job._state.db = job_id, False, alias
    attempt.job_id = event.job_id = job_id
    # The attempt's and the event's own ids are not read back (nothing that submits uses them, and
    # returning them through the outer SELECT would cost a join per submission): without a pk they
    # still look unsaved, so a save() of either would insert a second row; nobody keeps them.
    return None


def _insert_values(
    instance: models.Model, connection: Any, *, parent: str | None = None
) -> tuple[list[str], list[Any]]:
    """The columns an INSERT of ``instance`` writes and their values, as ``save()`` prepares them
    (defaults, ``auto_now_add``, JSON adapted): every concrete field but the serial key; ``parent``, a
    foreign key column the statement fills from the row it inserts first, comes first and unvalued."""
    columns: list[str] = [parent] if parent else []
    values: list[Any] = []
    for field in instance._meta.local_concrete_fields:
        column = field.column
        if field.primary_key or column is None or column == parent:
            continue
        columns.append(column)
        values.append(field.get_db_prep_save(field.pre_save(instance, add=True), connection=connection))
    return columns, values


def _store_through_orm(job: TrainingJob, attempt: JobAttempt, event: JobEvent, *, cap: int, alias: str) -> int | None:
    waiting = TrainingJob.objects.using(alias).filter(tenant_id=job.tenant_id, state=JobState.QUEUED).count()
    if waiting >= cap:
        return waiting
    with transaction.atomic(using=alias):
        job.save(using=alias)
        attempt.job = job
        attempt.save(using=alias)
        event.job = job
        event.save(using=alias)
    return None
