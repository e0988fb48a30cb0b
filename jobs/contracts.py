"""What leaves the jobs app: frozen views, and the JSON that the API, the portal and pushes send of them.

The JSON is plain dicts built from the views (the API is read-through, never a ModelSerializer).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, BinaryIO

from runtime.scheduling.model import MILLI, NAU


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
class AdmissionPreview:
    """What admission would do with a spec now, without storing it (the portal's submit form).

    ``never`` says why it could never start (submit refuses it unless it may wait for capacity);
    otherwise ``starts_now`` says whether the next cycle would start it, on ``devices`` (count per
    flavor), or ``reason`` why it would wait. ``nau_milli_per_device`` prices each flavor's device
    for this job's class (thousandths of a NAU), for the cost per hour."""

    never: str | None
    starts_now: bool
    reason: str
    devices: dict[str, int]
    nau: float
    borrowing: bool
    preempts: tuple[int, ...]
    nau_milli_per_device: dict[str, int]


# --- the advisor at submit (jobs.advice) ------------------------------------------------------------
# Each part answers one question about a spec not yet submitted, with ``reasoning``: plain sentences
# that say what it found and from which figures, the first of them the part's headline. A part that
# lacks a figure it needs says which, and its numbers are None, rather than guessed.


@dataclass(frozen=True)
class AdmissionAdvice:
    """Whether the next admission cycle would start it (``verdict`` ``now``), queue it (``waits``,
    ``reason`` in the scheduler's words) or never could (``never``); ``devices``: where it starts now
    (count per flavor), else empty; ``preempts``: how many jobs on borrowed capacity it would evict first
    (counted, not named: they may be other tenants')."""

    verdict: str
    reason: str
    devices: dict[str, int]
    borrowing: bool
    preempts: int
    reasoning: tuple[str, ...]


@dataclass(frozen=True)
class StartAdvice:
    """When it would start, from the queue played forward (``runtime.simulate.forecast``): None when it
    never would or no estimate can be made. ``jobs_ending``: jobs expected to end before it starts;
    ``jobs_first``: other jobs admitted before it, or in the same cycle."""

    expected_at: datetime | None
    wait_s: float | None
    jobs_ending: int
    jobs_first: int
    reasoning: tuple[str, ...]


@dataclass(frozen=True)
class FlavorBatchAdvice:
    """One flavor the spec allows: the most samples one device takes per micro-step within about 70%
    of its memory (None: unknown, or not even one), and, in the placement, its devices and the largest
    micro-batch one of them gets."""

    flavor: str
    memory_gib: float
    max_micro_batch: int | None
    devices: int
    micro_batch: int | None


@dataclass(frozen=True)
class BatchAdvice:
    """The global batch on the placement: the memory model's figures (None for code Polychip cannot
    size), each flavor's cap and share, and the accumulation micro-steps a step takes."""

    global_batch: int
    placement: str  # which devices the split is for: "now", "estimated start", "idle pool" or "none"
    param_count: int | None
    activation_bytes_per_sample: float | None
    accumulation: int | None
    flavors: tuple[FlavorBatchAdvice, ...]
    reasoning: tuple[str, ...]


@dataclass(frozen=True)
class CheckpointAdvice:
    """Young's and Daly's intervals (``runtime.recovery.advisor``) from the save cost that jobs of the
    class measured, the pool's failure rate and the step time on the placement; the spec's own
    intervals beside them. None where a figure is missing."""

    weights_every: int | None
    optimizer_every: int | None
    young_s: float | None
    daly_s: float | None
    mtbf_s: float | None
    save_cost_s: float | None
    step_time_s: float | None
    spec_weights_every: int
    spec_optimizer_every: int
    reasoning: tuple[str, ...]


@dataclass(frozen=True)
class CommAdvice:
    """What ``compression: auto`` would choose on the placement's cross-group link
    (``runtime.comm.auto.choose_policy``), beside what the spec asks (``requested``)."""

    requested: str
    compression: str | None
    density: float | None
    rank: int | None
    vendor_groups: int
    link_gbit: float | None
    link_source: str
    reasoning: tuple[str, ...]


@dataclass(frozen=True)
class CostAdvice:
    """The NAU the placement charges against the tenant's NAU quota, each allowed flavor's NAU per
    device for this job's class, and an hour of the placement at the tenant's prices."""

    nau: float | None
    nau_per_device: dict[str, float]
    cost_per_hour: Decimal | None
    currency: str
    reasoning: tuple[str, ...]


@dataclass(frozen=True)
class JobAdvice:
    admission: AdmissionAdvice
    start: StartAdvice
    batch: BatchAdvice
    checkpoint: CheckpointAdvice
    comm: CommAdvice
    cost: CostAdvice

    @property
    def summary(self) -> tuple[str, ...]:
        """Each part's headline, in the order a tenant asks: when, where, how, what it costs."""
        parts = (self.admission, self.start, self.batch, self.checkpoint, self.comm, self.cost)
        return tuple(part.reasoning[0] for part in parts if part.reasoning)


@dataclass(frozen=True)
class DeviceCellView:
    """One device on the operator's cluster map: its health, the predictor's score, and what holds it."""

    device_id: str
    index: int
    flavor: str
    health: str
    failure_score: float | None
    job_id: int | None
    tenant_id: int | None
    rank: int | None
    job_state: str | None


@dataclass(frozen=True)
class NodeView:
    name: str
    flavor: str
    rack: str
    coords: tuple[int, ...]
    devices: tuple[DeviceCellView, ...]


@dataclass(frozen=True)
class WaitingJobView:
    """A waiting job in the queue across tenants (operators): its place in its tenant's queue, why it
    waits, and what it asks for."""

    id: int
    tenant_id: int
    name: str
    priority: int
    position: int
    reason: str
    devices: int
    flavors: tuple[str, ...]
    submitted_at: datetime


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


@dataclass(frozen=True)
class MetricPointView:
    """One point of a series: a reported step, or a bucket of steps (``jobs.metrics`` says how)."""

    step: int
    value: float  # the bucket's mean; the value itself when raw
    min: float
    max: float
    last: float  # the value at the bucket's last reported step


@dataclass(frozen=True)
class HolderOutlook:
    """A job that holds devices a waiting job wants: its id when it is the same tenant's, how many it
    holds, and when it should end (None: no estimate yet)."""

    job_id: int | None
    devices: int
    expected_end: datetime | None


@dataclass(frozen=True)
class StartFlavorOutlook:
    flavor: str
    in_service: int  # healthy or degraded
    free: int
    lacking: int
    never: bool  # it asks for more than the flavor has in service
    expected_at: datetime | None  # when enough should be free (now when nothing lacks; None: unknown)
    holders: tuple[HolderOutlook, ...]


@dataclass(frozen=True)
class StartOutlookView:
    """What would let a waiting job start (``jobs.outlook``)."""

    job_id: int
    waiting: bool
    reason: str
    position: int | None
    flavors: tuple[StartFlavorOutlook, ...] = ()
    quota_blocked: bool = False
    own_running: tuple[HolderOutlook, ...] = ()


def _holder_json(h: HolderOutlook) -> dict[str, Any]:
    return {"job_id": h.job_id, "devices": h.devices, "expected_end": _time(h.expected_end)}


def start_outlook_json(o: StartOutlookView) -> dict[str, Any]:
    return {
        "job_id": o.job_id,
        "waiting": o.waiting,
        "reason": o.reason,
        "position": o.position,
        "flavors": [
            {
                "flavor": f.flavor,
                "in_service": f.in_service,
                "free": f.free,
                "lacking": f.lacking,
                "never": f.never,
                "expected_at": _time(f.expected_at),
                "holders": [_holder_json(h) for h in f.holders],
            }
            for f in o.flavors
        ],
        "quota_blocked": o.quota_blocked,
        "own_running": [_holder_json(h) for h in o.own_running],
    }


@dataclass(frozen=True)
class DeviceEventView:
    """One change of a device's health, or one alert of the failure predictor about it."""

    id: int
    device_id: str
    node: str
    flavor: str
    kind: str
    from_health: str
    to_health: str
    by: str
    score: float | None
    created_at: datetime


def device_event_json(event: DeviceEventView) -> dict[str, Any]:
    return {
        "id": event.id,
        "device_id": event.device_id,
        "node": event.node,
        "flavor": event.flavor,
        "kind": event.kind,
        "from_health": event.from_health or None,
        "to_health": event.to_health or None,
        "by": event.by,
        "score": event.score,
        "created_at": event.created_at.isoformat(),
    }


@dataclass(frozen=True)
class UsageBuckets:
    """A stretch of time cut into equal buckets (``jobs.history.BUCKETS`` of them)."""

    since: datetime
    until: datetime
    bucket_s: float


@dataclass(frozen=True)
class QuotaHistoryView:
    """A tenant's average use of each quota resource per bucket (NAU for ``nau``, else devices)."""

    span: UsageBuckets
    nominal: dict[str, float]
    in_use: dict[str, tuple[float, ...]]


@dataclass(frozen=True)
class FlavorUtilizationView:
    """A flavor's devices, and the average number held and training per bucket."""

    flavor: str
    devices: int
    allocated: tuple[float, ...]
    training: tuple[float, ...]


@dataclass(frozen=True)
class UtilizationHistoryView:
    span: UsageBuckets
    flavors: tuple[FlavorUtilizationView, ...]


@dataclass(frozen=True)
class IdleUsage:
    """One flavor's device time over a stretch: held by jobs, and held while training nothing."""

    flavor: str
    held_s: float
    idle_s: float


@dataclass(frozen=True)
class NewMetricPoint:
    """A point as stored, for the push relay: its row id (what the relay tails) and whose it is."""

    id: int
    tenant_id: int
    job_id: int
    name: str
    step: int
    value: float


@dataclass(frozen=True)
class MetricSeriesView:
    name: str
    points: tuple[MetricPointView, ...]
    downsampled: bool
    total_points: int  # reported points in the asked range, before downsampling


@dataclass(frozen=True)
class CheckpointFileView:
    name: str
    size_bytes: int
    sha256: str  # as the checkpoint's manifest records it, checked by every restore


@dataclass(frozen=True)
class CheckpointView:
    """One committed checkpoint in a job's store."""

    step: int
    kind: str  # weights, or full (weights and optimizer state)
    layers: tuple[str, ...]  # what it holds: "weights", "optimizer"
    files: tuple[CheckpointFileView, ...]
    created_at: datetime

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)


@dataclass(frozen=True)
class FinalModelView:
    """The trained model's state_dict (``model.pt``) that the job's rank 0 wrote when it finished."""

    size_bytes: int
    sha256: str


@dataclass(frozen=True)
class JobCheckpointsView:
    checkpoints: tuple[CheckpointView, ...]  # newest first
    final_model: FinalModelView | None


@dataclass(frozen=True)
class Download:
    """A file to send: ``body`` is an open file (FileResponse) or an iterator of chunks that closes
    what it opened when it ends or is closed (StreamingHttpResponse); never read whole into memory."""

    filename: str
    content_type: str
    size_bytes: int | None  # None: not known before it is sent
    body: BinaryIO | Iterator[bytes]


@dataclass(frozen=True)
class BundleView:
    """A tenant's code bundle: a tar.gz stored content-addressed (``ref`` is what a job spec names)."""

    tenant_id: int
    sha256: str
    size_bytes: int  # the tar.gz
    files: int  # regular files inside
    unpacked_bytes: int
    name: str
    created_at: datetime
    # The regular files' names, sorted; None where they were not read (a listing reads only the rows).
    entries: tuple[str, ...] | None = None
    # Whether the call that returned this view stored it (False: the tenant already had these bytes).
    created: bool = False

    @property
    def ref(self) -> str:
        return f"sha256:{self.sha256}"


# --- JSON ---------------------------------------------------------------------------------------


def _time(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def _quota_charge(job: JobView) -> dict[str, Any] | None:
    """What the job holds against its tenant's quota: devices per flavor and NAU."""
    if not job.demand:
        return None
    devices = {resource: amount for resource, amount in job.demand.items() if resource != NAU}
    return {"devices": devices, "nau": round(job.demand.get(NAU, 0) / MILLI, 3), "borrowing": job.borrowing}


def admission_preview_json(preview: AdmissionPreview) -> dict[str, Any]:
    return {
        "never": preview.never,
        "starts_now": preview.starts_now,
        "reason": preview.reason,
        "devices": preview.devices,
        "nau": round(preview.nau, 3),
        "borrowing": preview.borrowing,
        "preempts": list(preview.preempts),
    }


def node_json(node: NodeView) -> dict[str, Any]:
    return {
        "name": node.name,
        "flavor": node.flavor,
        "rack": node.rack,
        "coords": list(node.coords),
        "devices": [
            {
                "device_id": d.device_id,
                "index": d.index,
                "flavor": d.flavor,
                "health": d.health,
                "failure_score": d.failure_score,
                "job": None
                if d.job_id is None
                else {"id": d.job_id, "tenant_id": d.tenant_id, "rank": d.rank, "state": d.job_state},
            }
            for d in node.devices
        ],
    }


def waiting_job_json(job: WaitingJobView) -> dict[str, Any]:
    return {
        "id": job.id,
        "tenant_id": job.tenant_id,
        "name": job.name,
        "priority": job.priority,
        "position": job.position,
        "reason": job.reason,
        "devices": job.devices,
        "flavors": list(job.flavors),
        "submitted_at": _time(job.submitted_at),
    }


def job_json(job: JobView) -> dict[str, Any]:
    return {
        "id": job.id,
        "name": job.name,
        "state": job.state,
        "priority": job.priority,
        "pending_reason": job.pending_reason,
        "queue_position": job.queue_position,
        "quota": _quota_charge(job),
        "attempt": job.attempt,
        "preemptions": job.preemptions,
        "failure_reason": job.failure_reason,
        "spec": job.spec,
        "created_at": _time(job.created_at),
        "admitted_at": _time(job.admitted_at),
        "started_at": _time(job.started_at),
        "finished_at": _time(job.finished_at),
        "progress": {
            "steps_done": job.steps_done,
            "total_steps": job.total_steps,
            "fraction": round(job.progress, 4),
            "samples_per_s": job.samples_per_s,
        },
        "loss": {"first": job.first_loss, "last": job.last_loss, "recent": list(job.recent_losses)},
        "devices": [
            {
                "rank": d.rank,
                "device_id": d.device_id,
                "flavor": d.flavor,
                "node": d.node,
                "started_at": _time(d.started_at),
                "ended_at": _time(d.ended_at),
                "telemetry": job.rank_stats.get(str(d.rank), {}),
            }
            for d in job.devices
        ],
        "ranks": _ranks(job),
        "balance": job.balance,
        "comm": job.comm,
        "restarts": job.restarts,
        "recovery": job.recovery,
        "artifact": job.artifact_path or None,
    }


def _ranks(job: JobView) -> list[dict[str, Any]]:
    """Per rank of the devices it holds now: its flavor, its samples per step and its own samples/s."""
    out = []
    for d in job.devices:
        if d.ended_at is not None:
            continue
        stats = job.rank_stats.get(str(d.rank)) or {}
        out.append(
            {
                "rank": d.rank,
                "flavor": d.flavor,
                "micro_batch": stats.get("micro_batch", stats.get("samples")),
                "samples_per_s": stats.get("samples_per_s"),
            }
        )
    return out


def event_json(event: EventView) -> dict[str, Any]:
    return {
        "id": event.id,
        "job": event.job_id,
        "kind": event.kind,
        "from_state": event.from_state,
        "to_state": event.to_state,
        "message": event.message,
        "data": event.data,
        "created_at": _time(event.created_at),
    }


def flavor_pool_json(row: FlavorPoolView) -> dict[str, Any]:
    return {
        "flavor": row.flavor,
        "vendor": row.vendor,
        "kind": row.kind,
        "model": row.model,
        "peak_bf16_tflops": row.peak_bf16_tflops,
        "memory_gib": row.memory_gib,
        "interconnect": row.interconnect,
        "devices": {"total": row.devices, "healthy": row.healthy, "allocated": row.allocated},
        "health": dict(row.by_health),
    }


def quota_json(row: QuotaUsageView) -> dict[str, Any]:
    return {
        "resource": row.resource,
        "unit": row.unit,
        "nominal": row.nominal,
        "borrowing_limit": row.borrowing_limit,
        "lending_limit": row.lending_limit,
        "in_use": row.in_use,
        "borrowed": row.borrowed,
        "cohort": row.cohort,
        "cohort_can_lend": row.cohort_can_lend,
    }


def queued_job_json(row: QueuedJobView) -> dict[str, Any]:
    return {
        "job": row.id,
        "name": row.name,
        "priority": row.priority,
        "position": row.position,
        "reason": row.reason,
        "submitted_at": _time(row.submitted_at),
    }


def throughput_entry_json(row: ThroughputEntryView) -> dict[str, Any]:
    return {
        "job_class": row.job_class,
        "flavor": row.flavor,
        "devices": row.devices,
        "samples_per_s": round(row.samples_per_s, 3),
        "per_device_samples_per_s": round(row.per_device_samples_per_s, 3),
        "source": row.source,
        "samples": row.samples,
        "updated_at": _time(row.updated_at),
    }


def metric_series_json(job_id: int, series: list[MetricSeriesView]) -> dict[str, Any]:
    return {
        "job": job_id,
        "series": [
            {
                "name": s.name,
                "points": [
                    {"step": p.step, "value": p.value, "min": p.min, "max": p.max, "last": p.last} for p in s.points
                ],
                "downsampled": s.downsampled,
                "total_points": s.total_points,
            }
            for s in series
        ],
    }


def checkpoint_json(checkpoint: CheckpointView, download: str) -> dict[str, Any]:
    return {
        "step": checkpoint.step,
        "kind": checkpoint.kind,
        "layers": list(checkpoint.layers),
        "size_bytes": checkpoint.size_bytes,
        # The store keeps a sha256 per file (its manifest), not one of the whole checkpoint.
        "files": [{"name": f.name, "size_bytes": f.size_bytes, "sha256": f.sha256} for f in checkpoint.files],
        "created_at": _time(checkpoint.created_at),
        "download": download,
    }


def final_model_json(model: FinalModelView | None, download: str) -> dict[str, Any] | None:
    if model is None:
        return None
    return {"size_bytes": model.size_bytes, "sha256": model.sha256, "download": download}


# A bundle's answer lists this many of its files; the rest are counted in "files".
BUNDLE_ENTRIES_SHOWN = 100


def bundle_json(bundle: BundleView) -> dict[str, Any]:
    out: dict[str, Any] = {
        "bundle": bundle.ref,
        "sha256": bundle.sha256,
        "size_bytes": bundle.size_bytes,
        "files": bundle.files,
        "unpacked_bytes": bundle.unpacked_bytes,
        "name": bundle.name,
        "created_at": _time(bundle.created_at),
    }
    if bundle.entries is not None:
        out["entries"] = list(bundle.entries[:BUNDLE_ENTRIES_SHOWN])
    return out


def _span_json(span: UsageBuckets) -> dict[str, Any]:
    """The stretch, and each bucket's start (ISO 8601)."""
    count = round((span.until - span.since).total_seconds() / span.bucket_s)
    return {
        "since": span.since.isoformat(),
        "until": span.until.isoformat(),
        "bucket_s": span.bucket_s,
        "buckets": [(span.since + timedelta(seconds=i * span.bucket_s)).isoformat() for i in range(count)],
    }


def quota_history_json(history: QuotaHistoryView) -> dict[str, Any]:
    span = history.span
    resources = []
    for resource, use in history.in_use.items():
        nominal = history.nominal[resource]
        resources.append(
            {
                "resource": resource,
                "unit": "NAU" if resource == "nau" else "devices",
                "nominal": nominal,
                "in_use": list(use),
                "borrowed": [round(max(0.0, value - nominal), 3) for value in use],
            }
        )
    return {**_span_json(span), "resources": resources}


def utilization_json(history: UtilizationHistoryView) -> dict[str, Any]:
    flavors = [
        {"flavor": r.flavor, "devices": r.devices, "allocated": list(r.allocated), "training": list(r.training)}
        for r in history.flavors
    ]
    return {**_span_json(history.span), "flavors": flavors}


def job_advice_json(advice: JobAdvice) -> dict[str, Any]:
    admission, start, batch = advice.admission, advice.start, advice.batch
    checkpoint, comm, cost = advice.checkpoint, advice.comm, advice.cost
    return {
        "summary": list(advice.summary),
        "admission": {
            "verdict": admission.verdict,
            "reason": admission.reason,
            "devices": admission.devices,
            "borrowing": admission.borrowing,
            "preempts": admission.preempts,
            "reasoning": list(admission.reasoning),
        },
        "start": {
            "expected_at": _time(start.expected_at),
            "wait_s": None if start.wait_s is None else round(start.wait_s, 1),
            "jobs_ending": start.jobs_ending,
            "jobs_first": start.jobs_first,
            "reasoning": list(start.reasoning),
        },
        "batch": {
            "global_batch": batch.global_batch,
            "placement": batch.placement,
            "param_count": batch.param_count,
            "activation_bytes_per_sample": batch.activation_bytes_per_sample,
            "accumulation": batch.accumulation,
            "flavors": [
                {
                    "flavor": f.flavor,
                    "memory_gib": f.memory_gib,
                    "max_micro_batch": f.max_micro_batch,
                    "devices": f.devices,
                    "micro_batch": f.micro_batch,
                }
                for f in batch.flavors
            ],
            "reasoning": list(batch.reasoning),
        },
        "checkpoint": {
            "weights_every": checkpoint.weights_every,
            "optimizer_every": checkpoint.optimizer_every,
            "young_s": _finite(checkpoint.young_s),
            "daly_s": _finite(checkpoint.daly_s),
            "mtbf_s": _finite(checkpoint.mtbf_s),
            "save_cost_s": checkpoint.save_cost_s,
            "step_time_s": checkpoint.step_time_s,
            "spec_weights_every": checkpoint.spec_weights_every,
            "spec_optimizer_every": checkpoint.spec_optimizer_every,
            "reasoning": list(checkpoint.reasoning),
        },
        "comm": {
            "requested": comm.requested,
            "auto_would_choose": comm.compression,
            "density": comm.density,
            "rank": comm.rank,
            "vendor_groups": comm.vendor_groups,
            "link_gbit": comm.link_gbit,
            "link_source": comm.link_source,
            "reasoning": list(comm.reasoning),
        },
        "cost": {
            "nau": cost.nau,
            "nau_per_device": cost.nau_per_device,
            "cost_per_hour": None if cost.cost_per_hour is None else str(cost.cost_per_hour),
            "currency": cost.currency,
            "reasoning": list(cost.reasoning),
        },
    }


def _finite(value: float | None) -> float | None:
    """JSON has no infinity: an interval or MTBF without failures on record is null."""
    return None if value is None or math.isinf(value) else value
