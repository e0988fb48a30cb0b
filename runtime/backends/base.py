"""The one interface every backend implements: provision, observe, tear down.

Handles are plain JSON-able dicts so the control plane can store them and any process, not only
the one that provisioned, can observe or tear down the job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from runtime.jobspec import CommSpec, WorkloadSpec


@dataclass(frozen=True)
class RankPlacement:
    rank: int
    device_id: str
    flavor: str
    node: str
    # For balancing: the flavor's benchmark score (per-device samples/s of the job's class when known,
    # else its peak bf16 TFLOP/s; one unit for the whole job) and its memory. None: unknown.
    score: float | None = None
    memory_gib: float | None = None
    # Ranks of one vendor share a fast link; traffic between vendors crosses the slow one (runtime.comm).
    vendor: str = ""


@dataclass(frozen=True)
class LaunchRequest:
    job_id: str
    placements: tuple[RankPlacement, ...]
    workload: WorkloadSpec
    telemetry_url: str | None
    telemetry_token: str
    artifacts_dir: str
    # How the global batch is split across the ranks: dynamic | static | equal (``runtime.balancing``).
    balancing: str = "dynamic"
    # How gradients travel: compression policy, buckets, hierarchy (``runtime.comm``).
    comm: CommSpec = field(default_factory=CommSpec)


def vendor_groups(placements: tuple[RankPlacement, ...]) -> tuple[int, ...]:
    """Each rank's vendor group, numbered in rank order of first appearance (a rank without a
    vendor counts by its flavor)."""
    numbers: dict[str, int] = {}
    groups = []
    for placement in sorted(placements, key=lambda p: p.rank):
        key = placement.vendor or f"flavor:{placement.flavor}"
        groups.append(numbers.setdefault(key, len(numbers)))
    return tuple(groups)


class Phase(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    GONE = "gone"  # the backend knows nothing of this handle any more


@dataclass(frozen=True)
class RankState:
    rank: int
    pid: int | None
    exit_code: int | None


@dataclass(frozen=True)
class Observation:
    phase: Phase
    ranks: tuple[RankState, ...] = ()
    reason: str = ""


class Backend(Protocol):
    name: str

    def provision(self, request: LaunchRequest) -> dict[str, Any]:
        """Start the job; calling it again for the same job_id returns the same handle."""
        ...

    def observe(self, handle: dict[str, Any]) -> Observation: ...

    def teardown(self, handle: dict[str, Any]) -> None:
        """Stop everything the handle names; safe to call twice or on a finished job."""
        ...
