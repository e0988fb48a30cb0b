"""What tests read of a job's runs: the current attempt's row (its handle, teardown, stop request)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from jobs.models import JobAttempt, TrainingJob


def wait_until(predicate: Callable[[], Any], timeout_s: float = 60, what: str = "condition") -> Any:
    """The first truthy value of ``predicate``, polled every 50 ms; AssertionError naming ``what`` after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met in {timeout_s} s")
        time.sleep(0.05)


def run_of(job_id: int) -> JobAttempt:
    """The job's current attempt."""
    number = TrainingJob.objects.values_list("attempt", flat=True).get(pk=job_id)
    return JobAttempt.objects.get(job_id=job_id, number=number)


def handle_of(job_id: int) -> dict | None:
    """The backend handle of the job's current attempt (None before it launched)."""
    found = JobAttempt.objects.filter(job_id=job_id, number=TrainingJob.objects.get(pk=job_id).attempt)
    return found.values_list("backend_handle", flat=True).first()


def device_ids(flavor: str, count: int, *, skip: int = 0) -> list[str]:
    """``count`` of the pool's devices of ``flavor``, in device-id order, after the first ``skip``."""
    from jobs.models import Device

    ids = Device.objects.filter(flavor__name=flavor).order_by("device_id").values_list("device_id", flat=True)
    return list(ids[skip : skip + count])


def running_on(tenant_id: int, devices: list[str], *, steps: int = 50, name: str = "running") -> TrainingJob:
    """A job that the database shows running on ``devices`` (rank = position), with no process behind it:
    for tests that drive ingest, learning or recovery by hand."""
    from django.utils import timezone

    from jobs import services
    from jobs.models import Allocation, Device, JobState
    from runtime.jobspec import parse_job_spec

    held = {d.device_id: d for d in Device.objects.filter(device_id__in=devices).select_related("flavor")}
    flavors = list(dict.fromkeys(held[d].flavor.name for d in devices))
    spec = parse_job_spec({"name": name, "devices": len(devices), "flavors": flavors, "workload": {"steps": steps}})
    view = services.submit_job(tenant_id=tenant_id, user_id=None, spec=spec)
    TrainingJob.objects.filter(pk=view.id).update(state=JobState.RUNNING)
    for rank, device_id in enumerate(devices):
        Allocation.objects.create(job_id=view.id, device=held[device_id], rank=rank, started_at=timezone.now())
    return TrainingJob.objects.get(pk=view.id)
