"""Celery tasks: thin, they take ids and call services; each is safe to run twice."""

from __future__ import annotations

from celery import shared_task

from jobs import services


@shared_task(ignore_result=True)
def admit_queued_jobs() -> list[int]:
    return services.admit_queued_jobs()


@shared_task(ignore_result=True)
def provision_job(job_id: int) -> bool:
    return services.provision_job(job_id)


@shared_task(ignore_result=True)
def observe_running_jobs() -> None:
    for job_id in services.running_job_ids():
        services.observe_job(job_id)
    for job_id in services.stale_admitted_job_ids():
        provision_job.delay(job_id)


@shared_task(ignore_result=True)
def teardown_job(job_id: int) -> None:
    services.teardown_job(job_id)
