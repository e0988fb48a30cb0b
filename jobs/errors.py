"""The errors the jobs app raises to its callers; ``controlplane.errors`` answers each over HTTP."""

from __future__ import annotations


class JobNotFound(LookupError):
    """No such job for this tenant (another tenant's job is answered exactly like a missing one)."""


class InvalidTransition(ValueError):
    """The job is not in a state from which the asked-for move is allowed."""


class TelemetryRejected(PermissionError):
    """Telemetry for an unknown job, or signed with the wrong ingest token."""


class UnknownDevices(LookupError):
    """A device or node that the pool does not have."""
