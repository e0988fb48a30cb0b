"""The errors the jobs app raises to its callers; ``controlplane.errors`` answers each over HTTP once
(``controlplane.domain`` gives each kind its status), so views never catch them by hand."""

from __future__ import annotations

from controlplane import domain


class JobNotFound(domain.NotFound, LookupError):
    """No such job for this tenant (another tenant's job is answered exactly like a missing one)."""

    def __init__(self, job_id: int) -> None:
        super().__init__(f"no job {job_id}")
        self.job_id = job_id


class InvalidTransition(domain.Conflict, ValueError):
    """The job is not in a state from which the asked-for move is allowed."""

    code = "invalid_transition"
    field = "state"


class TelemetryRejected(domain.Forbidden, PermissionError):
    """Telemetry for an unknown job, or signed with the wrong ingest token."""


class UnknownDevices(domain.NotFound, LookupError):
    """A device or node that the pool does not have."""


class QueueFull(domain.Conflict):
    """The tenant already has as many jobs waiting as it may (``tenants.services.queued_jobs_cap``)."""

    code = "queue_full"
