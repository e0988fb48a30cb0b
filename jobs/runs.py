"""Names and secrets of a job's runs: its key across attempts, each attempt's run key, where its
checkpoints live, and the token its workers sign telemetry with."""

from __future__ import annotations

import hashlib
import hmac

from django.conf import settings

from jobs.models import TrainingJob


def job_key(job: TrainingJob) -> str:
    """The job's name across its attempts: unique beyond the primary key, so that a reset database
    never meets an old job's files, artifacts or still-running workers."""
    return f"job-{job.pk}-{job.created_at:%Y%m%d%H%M%S%f}"


def run_key(job: TrainingJob) -> str:
    """The name of the job's current attempt: a preempted attempt's workers cannot report into the
    next one."""
    key = job_key(job)
    return f"{key}-a{job.attempt}" if job.attempt else key


def checkpoint_url(job: TrainingJob) -> str:
    """Where the job's checkpoints live: one store per job, shared by all its attempts."""
    base = settings.POLYCHIP_CHECKPOINT_URL.rstrip("/")
    if base.startswith("s3://"):
        bucket_and_prefix, _, query = base.partition("?")
        return f"{bucket_and_prefix}/{job_key(job)}" + (f"?{query}" if query else "")
    return f"{base}/{job_key(job)}"


def ingest_token(job: TrainingJob) -> str:
    """The job's telemetry secret: derived, so a re-provisioned attempt gets the same one."""
    message = f"ingest:{run_key(job)}".encode()
    return hmac.new(settings.SECRET_KEY.encode(), message, hashlib.sha256).hexdigest()
