"""Celery tasks: thin, they take ids and call the services facade; each is safe to run twice.

Names are explicit (``jobs.dispatch`` sends them by name) and only named transient errors (a
dropped database or broker connection) are retried; anything else is a defect to see, not to retry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from celery import shared_task

from controlplane.celery import RETRY_POLICY, TRANSIENT_ERRORS
from jobs import services

log = logging.getLogger(__name__)

RETRY = {"autoretry_for": TRANSIENT_ERRORS, **RETRY_POLICY}


# Beat asks for a cycle every sweep (and its requests expire): the next one is its retry. A request
# sent by a change (jobs.dispatch.send) carries when it was sent; beat's carry nothing and always run.
@shared_task(name="jobs.tasks.admit_queued_jobs", ignore_result=True)
def admit_queued_jobs(requested_at: float | None = None) -> list[int]:
    return services.admit_queued_jobs(requested_at)


@shared_task(name="jobs.tasks.provision_job", ignore_result=True, **RETRY)
def provision_job(job_id: int) -> bool:
    return services.provision_job(job_id)


@shared_task(name="jobs.tasks.teardown_job", ignore_result=True, **RETRY)
def teardown_job(job_id: int) -> None:
    services.teardown_job(job_id)


# A cycle that admits many jobs sends their provisioning in chunks; this sends each job's task.
@shared_task(name="jobs.tasks.fan_out", ignore_result=True, **RETRY)
def fan_out(task_name: str, args_list: list[list[object]]) -> int:
    return services.fan_out(task_name, args_list)


# Beat starts a round every POLYCHIP_ELASTIC_ROUND_S; a round that failed is superseded by the next.
@shared_task(name="jobs.tasks.elastic_round", ignore_result=True)
def elastic_round() -> int:
    return len(services.elastic_round())


# Beat reads the cluster's nodes every half minute (nothing to do on the local backend).
@shared_task(name="jobs.tasks.sync_cluster_inventory", ignore_result=True)
def sync_cluster_inventory() -> dict[str, int] | None:
    return services.sync_cluster_inventory()


def _each(job_ids: Iterable[int], action: Callable[[int], object], what: str) -> None:
    # One job that fails to be observed must not stop the sweep for every other job.
    for job_id in job_ids:
        try:
            action(job_id)
        except Exception:
            log.exception("sweep: %s of job %s failed; retrying next round", what, job_id)


# The sweep runs every second and is superseded by the next one: it is never retried.
@shared_task(name="jobs.tasks.observe_running_jobs", ignore_result=True)
def observe_running_jobs() -> None:
    """The sweep: observe what runs (and recover what failed), give jobs that wait for devices after a
    failure their next attempt, grow shrunk jobs back, relaunch what an admission left behind,
    finish teardowns."""
    _each(services.running_job_ids(), services.observe_job, "observing")
    _each(services.recovering_job_ids(), services.retry_recovering, "reallocating")
    _each(services.shrunk_job_ids(), services.grow_back, "growing back")
    try:
        services.score_devices()
    except Exception:
        log.exception("sweep: scoring device health failed; retrying next round")
    _each(services.stale_admitted_job_ids(), provision_job.delay, "re-provisioning")
    _each(services.untorn_job_ids(), teardown_job.delay, "tearing down")
