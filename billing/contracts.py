"""What the billing app takes in and gives out."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class UsageInterval:
    """One device held by one job from ``started_at`` to ``ended_at`` (UTC)."""

    key: str
    tenant_id: int
    job_id: int
    device_id: str
    flavor: str
    started_at: datetime
    ended_at: datetime


@dataclass(frozen=True)
class FlavorUsage:
    flavor: str
    devices: int
    duration_ms: int

    @property
    def device_seconds(self) -> float:
        return self.duration_ms / 1000
