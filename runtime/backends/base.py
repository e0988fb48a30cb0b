"""The one interface every backend implements: provision, observe, tear down, read logs.

Handles are plain JSON-able dicts so the control plane can store them and any process, not only
the one that provisioned, can observe or tear down the job.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from runtime.jobspec import CheckpointSpec, CommSpec, WorkloadSpec


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
    # Layered checkpoints and where they go (a directory or s3://...): one store per job, across its
    # attempts, so that each attempt starts from the newest checkpoint any earlier one left.
    checkpoint: CheckpointSpec | None = None
    checkpoint_url: str | None = None
    # python and torchrun workloads: the job's code bundle (a tar.gz the control plane stored and
    # checked), unpacked for each attempt.
    bundle_path: str | None = None
    # The same bundle over HTTP, for ranks that do not share the control plane's disk (Kubernetes): the
    # ingest route that serves it to the job's token (``runtime.codefetch``).
    bundle_url: str | None = None
    # The job's name across its attempts (``job_id`` names one attempt): what stays the same when a
    # job restarts, such as the user its ranks run as.
    job_key: str = ""
    # The tenant's slug: on Kubernetes, the namespace its runs live in.
    tenant: str = ""


def vendor_groups(placements: tuple[RankPlacement, ...]) -> tuple[int, ...]:
    """Each rank's vendor group, numbered in rank order of first appearance (a rank without a
    vendor counts by its flavor)."""
    numbers: dict[str, int] = {}
    groups = []
    for placement in sorted(placements, key=lambda p: p.rank):
        key = placement.vendor or f"flavor:{placement.flavor}"
        groups.append(numbers.setdefault(key, len(numbers)))
    return tuple(groups)


class BackendUnavailable(Exception):
    """The backend could not be reached, or answered that it is overloaded: nothing was started (what was,
    has been removed), and the same call may succeed later."""


class Phase(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # every rank saved a checkpoint and stopped on request (``Backend.request_stop``)
    GONE = "gone"  # the backend knows nothing of this handle any more


@dataclass(frozen=True)
class RankState:
    rank: int
    pid: int | None
    exit_code: int | None


# Causes the Kubernetes backend reports besides the others (``Failure.cause``), which jobs.recovery acts on.
NODE_LOST = "node"
DISRUPTION = "disruption"


@dataclass(frozen=True)
class Failure:
    """The first rank to fail on its own, as the backend detected it."""

    rank: int
    # "exit" (ended with an error), "signal" (killed: the device or its host went away), "heartbeat"
    # (its heartbeats stopped; the backend killed it), "gone" (the backend lost the whole run or the
    # rank's pod), and on Kubernetes "node" (the cluster deleted the pod because its node failed) and
    # "disruption" (the cluster took the pod away: preemption, eviction, a drain; nobody's fault).
    cause: str
    detected_at: float  # unix time of the detection
    exit_code: int | None = None

    @property
    def device_suspect(self) -> bool:
        """Whether the device, not the program, is the likely cause: a crash or silence, not an exception.

        A rank ended by SIGTERM was stopped on purpose (a teardown, an operator, the platform): that is
        never evidence against its device. A second sweep could otherwise observe the SIGTERM of a
        teardown that recovery started a moment before, and blame a healthy device for it.
        """
        if self.cause == "signal" and self.exit_code == -signal.SIGTERM:
            return False
        return self.cause in ("signal", "heartbeat", NODE_LOST)


@dataclass(frozen=True)
class Observation:
    phase: Phase
    ranks: tuple[RankState, ...] = ()
    reason: str = ""
    # Set as soon as a rank failed, even while the others are still being stopped (phase RUNNING).
    failure: Failure | None = None
    # Every rank that failed on its own (``failure`` is the first): two devices lost at once are both here.
    failures: tuple[Failure, ...] = ()


@dataclass(frozen=True)
class LogLine:
    """One line of a rank's output, as the backend captured it."""

    rank: int
    number: int  # its place in the rank's output of this attempt, from 0 (lines the cap dropped keep theirs)
    time: float  # unix time the backend read it
    stream: str  # "out" or "err"
    text: str


@dataclass(frozen=True)
class LogPage:
    """A read of an attempt's logs (``Backend.logs``): lines in time order, where to go on from, and
    what the size cap took before them."""

    lines: tuple[LogLine, ...]
    # Pass back as ``since`` to continue exactly after the last line of this page (per rank, not by time).
    cursor: str
    # rank -> lines that the cap dropped before the first line this read could start with (only ranks
    # that lost some): older output is gone, or a follower fell behind by more than the cap.
    dropped: dict[int, int] = field(default_factory=dict)
    # The read stopped at its limit: more lines are there already.
    more: bool = False


class Backend(Protocol):
    name: str

    def provision(self, request: LaunchRequest) -> dict[str, Any]:
        """Start the job; calling it again for the same job_id returns the same handle."""
        ...

    def observe(self, handle: dict[str, Any]) -> Observation: ...

    def teardown(self, handle: dict[str, Any]) -> None:
        """Stop everything the handle names; safe to call twice or on a finished job."""
        ...

    def request_stop(self, handle: dict[str, Any], reason: str) -> None:
        """Ask the job's ranks to save a full checkpoint and stop (phase ``STOPPED``); idempotent."""
        ...

    def logs(
        self,
        handle: dict[str, Any],
        *,
        rank: int | None = None,
        since: str | float | None = None,
        limit: int = 1000,
        tail: int | None = None,
    ) -> LogPage:
        """The run's captured output: one rank's or every rank's interleaved by time; ``since`` a
        cursor from an earlier page or a unix time; ``tail`` the last lines only. Bounded by a size cap
        per rank, oldest dropped (``LogPage.dropped`` says how many). ``ValueError`` for a bad cursor."""
        ...
