"""Celery tasks: thin, they take ids and call services; each is safe to run twice."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from celery import shared_task

from jobs import recovery, services

log = logging.getLogger(__name__)


@shared_task(ignore_result=True)
def admit_queued_jobs() -> list[int]:
    return services.admit_queued_jobs()


@shared_task(ignore_result=True)
def provision_job(job_id: int) -> bool:
    return services.provision_job(job_id)


@shared_task(ignore_result=True)
def teardown_job(job_id: int) -> None:
    services.teardown_job(job_id)


def _each(job_ids: Iterable[int], action: Callable[[int], object], what: str) -> None:
    # One job that fails to be observed must not stop the sweep for every other job.
    for job_id in job_ids:
        try:
            action(job_id)
        except Exception:
            log.exception("sweep: %s of job %s failed; retrying next round", what, job_id)


@shared_task(ignore_result=True)
def observe_running_jobs() -> None:
    """The sweep: observe what runs (and recover what failed), give jobs that wait for devices after a
    failure their next attempt, grow shrunk jobs back, relaunch what an admission left behind,
    finish teardowns."""
    _each(services.running_job_ids(), services.observe_job, "observing")
    _each(recovery.recovering_job_ids(), recovery.retry_recovering, "reallocating")
    _each(recovery.shrunk_job_ids(), recovery.grow_back, "growing back")
    try:
        recovery.score_devices()
    except Exception:
        log.exception("sweep: scoring device health failed; retrying next round")
    _each(services.stale_admitted_job_ids(), provision_job.delay, "re-provisioning")
    _each(services.untorn_job_ids(), teardown_job.delay, "tearing down")


@shared_task(ignore_result=True)
def check_budgets() -> int:
    """Raise each budget alert once per period, open allocations included; returns tenants checked."""
    return len(services.check_budgets())
