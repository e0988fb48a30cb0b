"""The scheduler's inputs and outputs: frozen dataclasses, no I/O.

Quantities are integers so that quota arithmetic is exact: a flavor resource counts devices, and
the ``nau`` resource counts milli-NAU (normalized accelerator units; one NAU is the throughput
that one device of the reference flavor gives the job's class).

The shapes follow Kueue: a ``TenantQuota`` is a ClusterQueue (per-resource nominal, borrowing and
lending limits, inside an optional cohort), a ``PendingJob`` is a Workload, and ``schedule`` is one
scheduling cycle over a ``Snapshot`` of capacity and usage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from runtime.scheduling.placement import FreeDevice, NodeDistance

NAU = "nau"
MILLI = 1000


@dataclass(frozen=True)
class Limit:
    """A tenant's quota for one resource (a flavor's devices, or milli-NAU).

    ``borrowing_limit``: how much above nominal the tenant may take from its cohort; None means no
    limit but what the cohort can lend. ``lending_limit``: how much of its unused nominal the cohort
    may borrow; None means all of it.
    """

    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None


@dataclass(frozen=True)
class TenantQuota:
    tenant_id: int
    cohort: str | None
    limits: Mapping[str, Limit]
    weight: float = 1.0


@dataclass(frozen=True)
class PendingJob:
    job_id: int
    tenant_id: int
    priority: int
    submitted_at: float  # seconds; only the order matters
    devices: int
    flavors: tuple[str, ...]  # allowed flavors, in the job's order of preference
    job_class: str
    # When it last entered the queue (seconds; None: at submission). A preempted job keeps its place by
    # ``submitted_at`` but waits anew from here: the admission wait that operators watch counts this wait.
    queued_at: float | None = None
    # An elastic job may start on any count from this up to ``devices`` (None: exactly ``devices``).
    min_devices: int | None = None


@dataclass(frozen=True)
class AdmittedJob:
    """A job that holds devices now (admitted or running)."""

    job_id: int
    tenant_id: int
    priority: int
    admitted_at: float
    devices: tuple[FreeDevice, ...]
    demand: Mapping[str, int]  # resource -> amount charged at admission
    borrowing: bool  # it went above its tenant's nominal for some resource when admitted
    # An elastic job may run on as few as this (None: exactly what it holds): preemption shrinks it
    # toward this count before it evicts it.
    min_devices: int | None = None

    def shrunk(self, keep: int) -> AdmittedJob:
        """The job on its first ``keep`` devices, charged as much per device (one flavor: what the
        restart planner keeps when it moves onto fewer)."""
        held = len(self.devices)
        part = {resource: amount // held * keep for resource, amount in self.demand.items()}
        return replace(self, devices=self.devices[:keep], demand=part)


@dataclass(frozen=True)
class Snapshot:
    now: float
    tenants: Mapping[int, TenantQuota]
    pending: Sequence[PendingJob]
    admitted: Sequence[AdmittedJob]
    free: Sequence[FreeDevice]
    # milli-NAU per device, by (job class, flavor); a missing pair is estimated by the caller.
    nau_rates: Mapping[tuple[str, str], int]
    # Decayed historical usage per tenant and resource, already normalized to "average amount in
    # use" (see fairshare), for fair sharing.
    history: Mapping[int, Mapping[str, float]] = field(default_factory=dict)
    # Hops between two nodes by name (a runtime.inventory.Fabric, which also answers a row at once):
    # devices are then chosen by topology (placement.choose_devices); None keeps the fewest-nodes packing.
    distance: NodeDistance | None = None
    # Devices that no job holds but that a run being torn down (a preempted or ended attempt the
    # backend has not confirmed gone) still occupies: free soon. A job owed its nominal share that
    # waits only for them keeps its quota for itself in the meantime (scheduler: reservation).
    releasing: Sequence[FreeDevice] = ()


@dataclass(frozen=True)
class Admission:
    job_id: int
    devices: tuple[FreeDevice, ...]  # rank order
    demand: Mapping[str, int]
    borrowing: bool
    preempts: tuple[int, ...] = ()  # job ids that must give their devices back first


@dataclass(frozen=True)
class Preemption:
    job_id: int
    by_job_id: int
    reason: str  # e.g. "reclaimed by tenant 3 (within its nominal quota)"
    # An elastic victim that gives back only part of its devices: it moves (checkpoints, stops, and
    # restarts) on this many of those it holds, and keeps running. None: it stops and is re-queued.
    keep: int | None = None


@dataclass(frozen=True)
class Waiting:
    job_id: int
    reason: str  # readable: "waiting: 6 of 8 ascend-910b in use by your tenant; cohort has 0 to lend"
    position: int  # 1-based place in its tenant's queue after this cycle


@dataclass(frozen=True)
class CycleResult:
    admissions: tuple[Admission, ...]
    preemptions: tuple[Preemption, ...]
    waiting: tuple[Waiting, ...]
