"""What leaves the jobs app: frozen views that the API, the portal and pushes serialize."""

from __future__ import annotations

from dataclasses import dataclass, field
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
    priority: int = 0
    queue_position: int | None = None
    demand: dict[str, int] | None = None
    borrowing: bool = False
    attempt: int = 0
    preemptions: int = 0
    # How the global batch is split: {mode, efficiency, split, rebalances, ...}; see services.balance_view.
    balance: dict[str, Any] | None = None
    # How gradients travel: {requested, policy, reason, groups, link, per_step, ...}; see services.comm_view.
    comm: dict[str, Any] | None = None
    restarts: int = 0
    # Checkpoints, restarts, the last failure and restore, the interval advice; see recovery.recovery_view.
    recovery: dict[str, Any] | None = None

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
    # Devices per health state (healthy, degraded, cordoned, failed), every state listed.
    by_health: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class QuotaUsageView:
    """One resource of a tenant's quota and how much of it is in use now.

    Amounts are devices for a flavor and NAU (3 decimals) for ``nau``; None means no limit."""

    resource: str
    unit: str
    nominal: float
    borrowing_limit: float | None
    lending_limit: float | None
    in_use: float
    borrowed: float
    cohort: str | None
    cohort_can_lend: float | None


@dataclass(frozen=True)
class QueuedJobView:
    id: int
    name: str
    priority: int
    position: int | None
    reason: str
    submitted_at: datetime


@dataclass(frozen=True)
class ThroughputEntryView:
    """One entry of the throughput table: a job class on ``devices`` devices of one flavor."""

    job_class: str
    flavor: str
    devices: int
    samples_per_s: float  # the whole gang's
    per_device_samples_per_s: float
    source: str  # benchmark, measured or estimated
    samples: int
    updated_at: datetime
