"""What leaves the jobs app: frozen views that the API, the portal and pushes serialize."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class DeviceView:
    rank: int
    device_id: str
    flavor: str
    node: str
    started_at: datetime
    ended_at: datetime | None


@dataclass(frozen=True)
class JobView:
    id: int
    tenant_id: int
    name: str
    state: str
    spec: dict[str, Any]
    pending_reason: str
    failure_reason: str
    created_at: datetime
    admitted_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    steps_done: int
    total_steps: int
    first_loss: float | None
    last_loss: float | None
    recent_losses: tuple[float, ...]
    samples_per_s: float | None
    rank_stats: dict[str, Any]
    artifact_path: str
    devices: tuple[DeviceView, ...]

    @property
    def progress(self) -> float:
        return self.steps_done / self.total_steps if self.total_steps else 0.0


@dataclass(frozen=True)
class EventView:
    id: int
    job_id: int
    tenant_id: int
    kind: str
    from_state: str
    to_state: str
    message: str
    data: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class FlavorPoolView:
    flavor: str
    vendor: str
    kind: str
    model: str
    peak_bf16_tflops: float
    memory_gib: float
    interconnect: str
    devices: int
    healthy: int
    allocated: int
