"""What tests read of a job's runs: the current attempt's row (its handle, teardown, stop request)."""

from __future__ import annotations

from jobs.models import JobAttempt, TrainingJob


def run_of(job_id: int) -> JobAttempt:
    """The job's current attempt."""
    number = TrainingJob.objects.values_list("attempt", flat=True).get(pk=job_id)
    return JobAttempt.objects.get(job_id=job_id, number=number)


def handle_of(job_id: int) -> dict | None:
    """The backend handle of the job's current attempt (None before it launched)."""
    found = JobAttempt.objects.filter(job_id=job_id, number=TrainingJob.objects.get(pk=job_id).attempt)
    return found.values_list("backend_handle", flat=True).first()
