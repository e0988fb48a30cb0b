"""Use cases of the jobs app: submit, admit, provision, observe, ingest, finish, cancel.

Every state change is a claim: the row is locked, its state checked, and a conditional UPDATE
moves it; the row count says who won. Each change appends a JobEvent in the same transaction,
and usage for every allocation it ends is written there too. Tasks call these functions with
ids, so running a task twice changes nothing the second time.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from billing import services as billing
from billing.contracts import BudgetStatus, OpenUsage, UsageInterval
from jobs import recovery, throughput
from jobs.backends import get_backend
from jobs.contracts import DeviceView, EventView, FlavorPoolView, JobView, QueuedJobView, QuotaUsageView
from jobs.models import (
    TERMINAL_STATES,
    Allocation,
    Device,
    DeviceHealth,
    Flavor,
    JobEvent,
    JobState,
    Node,
    PoolTopology,
    TrainingJob,
)
from jobs.telemetry import TelemetryEvent
from runtime.backends.base import Backend, LaunchRequest, Phase, RankPlacement
from runtime.inventory import Fabric, Pool, make_topology, rack_fat_tree
from runtime.jobspec import JobSpec, SpecError, parse_balancing, parse_checkpoint, parse_comm, parse_workload
from runtime.scheduling import QuotaLedger
from runtime.scheduling.model import MILLI, NAU

log = logging.getLogger(__name__)

RECENT_LOSSES = 50
PROGRESS_EVENT_EVERY = timedelta(seconds=1)
PROVISION_CLAIM_TIMEOUT = timedelta(seconds=120)


class JobNotFound(LookupError):
    pass


class InvalidTransition(ValueError):
    pass


# --- reading ----------------------------------------------------------------------------------


ALLOCATION_DEVICES = ("allocations__device__node", "allocations__device__flavor")


def _device_views(job: TrainingJob) -> tuple[DeviceView, ...]:
    # Sorted here, not in SQL, so that a list of jobs fetched with ALLOCATION_DEVICES prefetched
    # costs no query per job.
    allocations = sorted(job.allocations.all(), key=lambda a: (a.rank, a.started_at))
    return tuple(
        DeviceView(
            rank=a.rank,
            device_id=a.device.device_id,
            flavor=a.device.flavor.name,
            node=a.device.node.name,
            started_at=a.started_at,
            ended_at=a.ended_at,
        )
        for a in allocations
    )


QUEUE_ORDER = ("-priority", "created_at", "pk")  # as the scheduler orders a tenant's queue


def queue_positions(tenant_id: int) -> dict[int, int]:
    """Each waiting job's place in its tenant's queue (1 = next), in the order admission considers
    them; computed when read, so a cycle never rewrites thousands of rows to shift them by one."""
    queued = TrainingJob.scoped.for_tenant(tenant_id).filter(state=JobState.QUEUED).order_by(*QUEUE_ORDER)
    return {job_id: place for place, job_id in enumerate(queued.values_list("pk", flat=True), start=1)}


def queue_position(job: TrainingJob) -> int:
    """One waiting job's place, by counting who is ahead of it (the push relay asks this per event,
    so it must not read the whole queue)."""
    same = Q(priority=job.priority)
    ahead = (
        Q(priority__gt=job.priority)
        | (same & Q(created_at__lt=job.created_at))
        | (same & Q(created_at=job.created_at, pk__lt=job.pk))
    )
    queued = TrainingJob.scoped.for_tenant(job.tenant_id).filter(state=JobState.QUEUED)
    return queued.filter(ahead).count() + 1


def to_view(job: TrainingJob, *, position: int | None = None) -> JobView:
    return JobView(
        id=job.pk,
        tenant_id=job.tenant_id,
        name=job.name,
        state=job.state,
        spec=job.spec,
        pending_reason=job.pending_reason,
        failure_reason=job.failure_reason,
        created_at=job.created_at,
        admitted_at=job.admitted_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        steps_done=job.steps_done,
        total_steps=job.total_steps,
        first_loss=job.first_loss,
        last_loss=job.last_loss,
        recent_losses=tuple(job.recent_losses),
        samples_per_s=job.samples_per_s,
        rank_stats=job.rank_stats,
        artifact_path=job.artifact_path,
        devices=_device_views(job),
        priority=job.priority,
        queue_position=position if job.state == JobState.QUEUED else None,
        demand=dict(job.demand),
        borrowing=job.borrowing,
        attempt=job.attempt,
        preemptions=job.preemptions,
        balance=balance_view(job),
        comm=comm_view(job),
        restarts=job.restarts,
        recovery=recovery.recovery_view(job),
    )


def balance_view(job: TrainingJob) -> dict[str, Any]:
    """The job's balancing as the API and portal show it: the spec's mode and, once rank 0 reported,
    the current split (chunks of per-rank samples), its balance efficiency on the predicted speeds,
    the predicted per-rank samples/s, and how many times the split changed."""
    stored = job.rank_stats.get(BALANCE_KEY) or {}
    spec = job.spec.get("balancing") if isinstance(job.spec, dict) else None
    mode = spec.get("mode", "dynamic") if isinstance(spec, dict) else "dynamic"
    split = stored.get("split")
    return {
        "mode": mode,
        "efficiency": stored.get("efficiency"),
        "split": split,
        "micro_batches": [sum(chunk[r] for chunk in split) for r in range(len(split[0]))] if split else None,
        "accumulation": len(split) if split else None,
        "predicted_samples_per_s": stored.get("predicted"),
        "rebalances": stored.get("rebalances", 0),
        "last_rebalance": stored.get("last_rebalance"),
        "stragglers": sorted({rank for rank, _ in stored.get("stragglers", [])}),
    }


def comm_view(job: TrainingJob) -> dict[str, Any]:
    """The job's communication as the API and portal show it: the spec's requested policy and, once
    rank 0 reported, the policy that ran with its reason (why auto chose it), the vendor groups, the
    link emulation, and per-step figures: the latest step's while the job runs, the run's averages
    (``comm_summary``) once it has ended."""
    stored = job.rank_stats.get(COMM_KEY) or {}
    raw = job.spec.get("comm") if isinstance(job.spec, dict) else None
    requested: dict[str, Any] | None
    try:
        requested = parse_comm(raw).to_json()
    except SpecError:  # a spec stored before comm was checked the way it is now
        requested = raw if isinstance(raw, dict) else None
    ran = stored.get("ran") or {}
    last, summary = stored.get("last_step"), stored.get("summary")
    per_step: dict[str, Any] | None = None
    if summary:  # the run's averages, once the job has ended
        per_step = {"source": "run", "steps": summary.get("steps")}
        per_step |= {name: summary.get(key) for name, (key, _) in _PER_STEP_FIELDS.items()}
    elif last:  # rank 0's latest step while it runs
        per_step = {"source": "step", "step": last.get("step")}
        per_step |= {name: last.get(key) for name, (_, key) in _PER_STEP_FIELDS.items()}
    return {
        "requested": requested,
        **{key: ran.get(key) or None for key in ("policy", "compression", "reason")},
        **{key: ran.get(key) for key in ("hierarchical", "groups", "buckets", "overlap", "link", "link_gbit_measured")},
        "per_step": per_step,
    }


# The per-step figures the API shows: (key in the worker's comm_summary, key in its step events).
_PER_STEP_FIELDS = {
    "bytes_cross": ("bytes_cross_per_step", "comm_bytes_cross"),
    "bytes_intra": ("bytes_intra_per_step", "comm_bytes_intra"),
    "collective_s": ("collective_s_per_step", "collective_s"),
    "exposed_s": ("exposed_s_per_step", "exposed_s"),
    "hidden_share": ("hidden_share", "hidden_share"),
}


def get_job(*, tenant_id: int, job_id: int) -> JobView:
    job = TrainingJob.scoped.for_tenant(tenant_id).filter(pk=job_id).prefetch_related(*ALLOCATION_DEVICES).first()
    if job is None:
        raise JobNotFound(job_id)
    return to_view(job, position=queue_position(job) if job.state == JobState.QUEUED else None)


def list_jobs(*, tenant_id: int, limit: int = 100) -> list[JobView]:
    jobs = (
        TrainingJob.scoped.for_tenant(tenant_id)
        .prefetch_related(*ALLOCATION_DEVICES)
        .order_by("-created_at", "-pk")[:limit]
    )
    positions = queue_positions(tenant_id)
    return [to_view(job, position=positions.get(job.pk)) for job in jobs]


def event_view(event: JobEvent) -> EventView:
    return EventView(
        id=event.pk,
        job_id=event.job_id,
        tenant_id=event.tenant_id,
        kind=event.kind,
        from_state=event.from_state,
        to_state=event.to_state,
        message=event.message,
        data=event.data,
        created_at=event.created_at,
    )


def list_events(*, tenant_id: int, job_id: int) -> list[EventView]:
    if not TrainingJob.scoped.for_tenant(tenant_id).filter(pk=job_id).exists():
        raise JobNotFound(job_id)
    return [event_view(e) for e in JobEvent.scoped.for_tenant(tenant_id).filter(job_id=job_id).order_by("pk")]


def recent_events(*, after_id: int, window_s: float, limit: int = 500) -> list[EventView]:
    """Events after ``after_id``, and those written in the last ``window_s`` seconds whatever their
    id (a slow transaction commits late), oldest first: what the push relay considers next."""
    since = timezone.now() - timedelta(seconds=window_s)
    events = JobEvent.objects.filter(Q(pk__gt=after_id) | Q(created_at__gte=since)).order_by("pk")[:limit]
    return [event_view(e) for e in events]


def latest_event_id() -> int:
    last = JobEvent.objects.order_by("-pk").values_list("pk", flat=True).first()
    return last or 0


def pool_summary() -> list[FlavorPoolView]:
    health_counts = {
        state.value: Count("devices", filter=Q(devices__health=state), distinct=True) for state in DeviceHealth
    }
    flavors = Flavor.objects.annotate(
        total=Count("devices", distinct=True),
        allocated=Count(
            "devices",
            filter=Q(devices__allocations__ended_at__isnull=True, devices__allocations__isnull=False),
            distinct=True,
        ),
        **{f"health_{state}": count for state, count in health_counts.items()},
    ).order_by("-peak_bf16_tflops")
    return [
        FlavorPoolView(
            flavor=f.name,
            vendor=f.vendor,
            kind=f.kind,
            model=f.model,
            peak_bf16_tflops=f.peak_bf16_tflops,
            memory_gib=f.memory_gib,
            interconnect=f.interconnect,
            devices=f.total,
            healthy=getattr(f, f"health_{DeviceHealth.HEALTHY}"),
            allocated=f.allocated,
            by_health={state: getattr(f, f"health_{state}") for state in health_counts},
        )
        for f in flavors
    ]


def quota_usage(*, tenant_id: int) -> list[QuotaUsageView]:
    """The tenant's quotas with what its running work holds against them, and what its cohort
    could lend it now, computed by the same ledger that admission uses."""
    from jobs import admission

    quotas = admission.tenant_quotas()
    own = quotas.get(tenant_id)
    if own is None:
        return []
    rates = admission.throughput_matrix().rates(["synthetic-mlp"])
    ledger = QuotaLedger(quotas, admission.holding_jobs(rates))
    usage = ledger.usage(tenant_id)

    def show(resource: str, amount: int | None) -> float | None:
        if amount is None:
            return None
        return round(amount / MILLI, 3) if resource == NAU else float(amount)

    rows = []
    for resource, limit in sorted(own.limits.items(), key=lambda item: (item[0] == NAU, item[0])):
        in_use = usage.get(resource, 0)
        rows.append(
            QuotaUsageView(
                resource=resource,
                unit="NAU" if resource == NAU else "devices",
                nominal=show(resource, limit.nominal) or 0.0,
                borrowing_limit=show(resource, limit.borrowing_limit),
                lending_limit=show(resource, limit.lending_limit),
                in_use=show(resource, in_use) or 0.0,
                borrowed=show(resource, max(0, in_use - limit.nominal)) or 0.0,
                cohort=own.cohort,
                cohort_can_lend=show(resource, ledger.lendable_free(own.cohort, resource)) if own.cohort else None,
            )
        )
    return rows


def queue(*, tenant_id: int, limit: int = 500) -> list[QueuedJobView]:
    """The tenant's waiting jobs in the order admission considers them, with place and reason."""
    jobs = TrainingJob.scoped.for_tenant(tenant_id).filter(state=JobState.QUEUED).order_by(*QUEUE_ORDER)[:limit]
    return [
        QueuedJobView(
            id=job.pk,
            name=job.name,
            priority=job.priority,
            position=place,
            reason=job.pending_reason or "waiting for the next admission cycle",
            submitted_at=job.created_at,
        )
        for place, job in enumerate(jobs, start=1)
    ]


def known_flavors() -> set[str]:
    return set(Flavor.objects.values_list("name", flat=True))


# --- the pool ---------------------------------------------------------------------------------


@transaction.atomic
def sync_pool(pool: Pool) -> int:
    """Upsert flavors, nodes (rack, coordinates), devices (memory) and the topology from a parsed
    pool file; returns the device count. Running it twice changes nothing the second time, and it
    never touches a device's health: that is the operators' (``set_device_health``)."""
    for flavor in pool.flavors.values():
        Flavor.objects.update_or_create(
            name=flavor.name,
            defaults={
                "vendor": flavor.vendor,
                "kind": flavor.kind.value,
                "model": flavor.model,
                "peak_bf16_tflops": flavor.peak_bf16_tflops,
                "memory_gib": flavor.memory_gib,
                "interconnect": flavor.interconnect,
                "interconnect_gbps": flavor.interconnect_gbps,
                "torch_device_type": flavor.torch_device_type,
                "collective_backend": flavor.collective_backend,
            },
        )
    flavors = {f.name: f for f in Flavor.objects.all()}
    for spec in pool.nodes:
        Node.objects.update_or_create(
            name=spec.name, defaults={"flavor": flavors[spec.flavor], "rack": spec.rack, "coords": list(spec.coords)}
        )
    nodes = {n.name: n for n in Node.objects.all()}
    devices = pool.devices()
    for device in devices:
        Device.objects.update_or_create(
            device_id=device.device_id,
            defaults={
                "node": nodes[device.node],
                "flavor": flavors[device.flavor],
                "index": device.index,
                "memory_gib": device.memory_gib,
            },
        )
    if pool.topology is None:
        PoolTopology.objects.filter(pk=1).delete()  # derived from the racks, as the file says
    else:
        PoolTopology.objects.update_or_create(
            pk=1, defaults={"kind": pool.topology.kind, "parameters": pool.topology.parameters()}
        )
    return len(devices)


def pool_fabric() -> Fabric:
    """The pool's topology with every node's coordinates: ``pool_fabric().hops(a, b)`` by node name.

    Built from the stored topology and the nodes' coordinates (two queries, so that a reloaded pool
    counts at once in every process); a pool without a stored topology, or with a node that has no
    usable coordinates in it, gets the fat tree that the nodes' racks describe.
    """
    rows = list(Node.objects.order_by("pk").values_list("name", "rack", "coords"))
    stored = PoolTopology.objects.filter(pk=1).first()
    if stored is not None:
        try:
            topology = make_topology(stored.kind, stored.parameters)
        except ValueError as exc:
            log.warning("stored pool topology is not usable (%s); using the racks", exc)
        else:
            if all(isinstance(c, list) and topology.check(c) is None for _, _, c in rows):
                return Fabric(topology=topology, coords={name: tuple(c) for name, _, c in rows})
            log.warning("some nodes have no usable %s coordinates; using the racks", topology.kind)
    return rack_fat_tree([(name, rack) for name, rack, _ in rows])


class UnknownDevices(LookupError):
    pass


@transaction.atomic
def set_device_health(device_ids: Iterable[str], health: DeviceHealth | str, *, by: str = "") -> int:
    """Set the health of devices (cordon, uncordon, mark failed); returns how many changed.

    A cordoned or failed device is never admitted again until it is healthy (or degraded); jobs
    already running on it keep running (failure handling comes with recovery). Unknown ids change
    nothing and raise ``UnknownDevices``.
    """
    try:
        state = DeviceHealth(health)
    except ValueError:
        raise ValueError(f"health: {health!r} is not one of {', '.join(DeviceHealth.values)}") from None
    ids = sorted(set(device_ids))
    # Take the admission lock first. A cycle holds it from loading its snapshot of free devices to
    # committing its allocations; without it a cordon could commit mid-cycle and the cycle would
    # still hand out the devices it had read as healthy. Waiting here means a running cycle ends
    # first and the next one reads the new health. (On SQLite select_for_update is a no-op: its
    # write transactions serialize anyway.) get_or_create: a flushed test database lost the row.
    from jobs.models import AdmissionLock

    AdmissionLock.objects.select_for_update().get_or_create(pk=1)
    known = set(Device.objects.filter(device_id__in=ids).values_list("device_id", flat=True))
    missing = [i for i in ids if i not in known]
    if missing:
        raise UnknownDevices(f"device_ids: no such device {missing[0]!r}")
    # A device that changes health starts its failure prediction afresh: an operator who returns it
    # has dealt with what the old readings showed.
    changed = (
        Device.objects.filter(device_id__in=ids)
        .exclude(health=state)
        .update(health=state, alert_streak=0, health_readings=[], unscored_rows=0, failure_score=None)
    )
    if changed:
        log.info("%d device(s) set %s%s", changed, state, f" by {by}" if by else "")
    return changed


# --- transitions ------------------------------------------------------------------------------


def _record(
    job: TrainingJob,
    *,
    kind: str,
    from_state: str = "",
    to_state: str = "",
    message: str = "",
    data: dict[str, Any] | None = None,
) -> JobEvent:
    return JobEvent.objects.create(
        job=job,
        tenant_id=job.tenant_id,
        kind=kind,
        from_state=from_state,
        to_state=to_state,
        message=message,
        data=data or {},
    )


def claim_transition(
    job_id: int,
    from_states: Iterable[str],
    to_state: str,
    *,
    message: str,
    data: dict[str, Any] | None = None,
    attempt: int | None = None,
    next_attempt: bool = False,
    **fields: Any,
) -> TrainingJob | None:
    """Move a job from one of ``from_states`` to ``to_state``; None when another worker got there first.

    With ``attempt``, the claim holds only for that attempt (a preempted and re-admitted job is a
    new attempt, and a launcher of the old one must not move it); ``next_attempt`` makes the move
    start the job's next one. Must run inside a transaction; the event is appended in it.
    """
    allowed = list(from_states)
    job = TrainingJob.objects.select_for_update().filter(pk=job_id).first()
    if job is None or job.state not in allowed or (attempt is not None and job.attempt != attempt):
        return None
    now = timezone.now()
    if next_attempt:
        fields["attempt"] = F("attempt") + 1
    won = TrainingJob.objects.filter(pk=job_id, state=job.state, attempt=job.attempt).update(
        state=to_state, state_changed_at=now, **fields
    )
    if won != 1:
        return None
    previous = job.state
    job.refresh_from_db()
    _record(job, kind=JobEvent.Kind.TRANSITION, from_state=previous, to_state=to_state, message=message, data=data)
    return job


def nau_rates(job_classes: Iterable[str]) -> dict[tuple[str, str], int]:
    """Milli-NAU per device for each (job class, flavor): what a price per NAU-hour charges for."""
    from jobs.admission import throughput_matrix

    return throughput_matrix().rates(set(job_classes))


def end_allocations(job: TrainingJob, ended_at: datetime) -> int:
    """Close the job's open allocations and write their usage in the current transaction (billing's
    outbox goes with it, so the ledger learns of every interval exactly once)."""
    open_allocations = list(job.allocations.filter(ended_at__isnull=True).select_related("device__flavor"))
    if not open_allocations:
        return 0
    for allocation in open_allocations:
        allocation.ended_at = ended_at
    Allocation.objects.bulk_update(open_allocations, ["ended_at"])
    rates = nau_rates([job.job_class])
    billing.record_usage(
        UsageInterval(
            key=f"allocation:{a.pk}",
            tenant_id=job.tenant_id,
            job_id=job.pk,
            device_id=a.device.device_id,
            flavor=a.device.flavor.name,
            started_at=a.started_at,
            ended_at=ended_at,
            nau_milli=rates.get((job.job_class, a.device.flavor.name), 1000),
        )
        for a in open_allocations
    )
    return len(open_allocations)


def open_usage(tenant_ids: Iterable[int] | None = None) -> list[OpenUsage]:
    """The devices jobs hold now, for budgets: they cost money before any usage record exists."""
    allocations = Allocation.objects.filter(ended_at__isnull=True)
    if tenant_ids is not None:
        allocations = allocations.filter(job__tenant_id__in=list(tenant_ids))
    rows = list(
        allocations.values_list("job__tenant_id", "job_id", "job__job_class", "device__flavor__name", "started_at")
    )
    rates = nau_rates({job_class for _, _, job_class, _, _ in rows}) if rows else {}
    return [
        OpenUsage(
            tenant_id=tenant_id,
            job_id=job_id,
            flavor=flavor,
            started_at=started_at,
            nau_milli=rates.get((job_class, flavor), 1000),
        )
        for tenant_id, job_id, job_class, flavor, started_at in rows
    ]


def check_budgets() -> dict[int, BudgetStatus]:
    """Every budgeted tenant's spend this month, open allocations included (alerts as they cross)."""
    budgeted = billing.tenants_with_budgets()
    return billing.check_budgets(budgeted, open_usage(budgeted)) if budgeted else {}


def submit_job(*, tenant_id: int, user_id: int | None, spec: JobSpec) -> JobView:
    from jobs import tasks

    with transaction.atomic():
        job = TrainingJob.objects.create(
            tenant_id=tenant_id,
            submitted_by_id=user_id,
            name=spec.name,
            spec=spec.to_dict(),
            state=JobState.QUEUED,
            total_steps=spec.workload.steps,
            priority=spec.priority,
            job_class=spec.workload.kind,
        )
        _record(job, kind=JobEvent.Kind.TRANSITION, to_state=JobState.QUEUED, message="submitted")
        # robust: a broker hiccup must not turn a stored job into a 500 (and a retried duplicate);
        # beat's sweep admits it anyway.
        transaction.on_commit(tasks.admit_queued_jobs.delay, robust=True)
    return to_view(job)


def admit_queued_jobs() -> list[int]:
    """Admission cycles until no request is left (see ``jobs.admission.admit``); returns the ids
    this caller admitted."""
    from jobs.admission import admit

    return admit()


def run_key(job: TrainingJob) -> str:
    """A name for the job's run (this attempt of it) that is unique beyond the primary key, so that
    a reset database never meets an old run's files, artifacts or still-running workers, and a
    preempted attempt's workers cannot report into the next one."""
    key = recovery.job_key(job)
    return f"{key}-a{job.attempt}" if job.attempt else key


def ingest_token(job: TrainingJob) -> str:
    """The job's telemetry secret: derived, so a re-provisioned job gets the same one."""
    message = f"ingest:{run_key(job)}".encode()
    return hmac.new(settings.SECRET_KEY.encode(), message, hashlib.sha256).hexdigest()


def _launch_request(job: TrainingJob) -> LaunchRequest:
    allocations = job.allocations.filter(ended_at__isnull=True).select_related("device__node", "device__flavor")
    ordered = list(allocations.order_by("rank"))
    scores = _balancing_scores(job.job_class, {a.device.flavor for a in ordered})
    placements = tuple(
        RankPlacement(
            rank=a.rank,
            device_id=a.device.device_id,
            flavor=a.device.flavor.name,
            node=a.device.node.name,
            score=scores[a.device.flavor.name],
            memory_gib=a.device.flavor.memory_gib,
            vendor=a.device.flavor.vendor,
        )
        for a in ordered
    )
    return LaunchRequest(
        job_id=run_key(job),
        placements=placements,
        workload=parse_workload(job.spec.get("workload")),
        telemetry_url=f"{settings.POLYCHIP_PUBLIC_URL.rstrip('/')}/api/v1/ingest/jobs/{job.pk}/telemetry",
        telemetry_token=ingest_token(job),
        artifacts_dir=str(settings.POLYCHIP_ARTIFACTS_DIR / run_key(job)),
        balancing=parse_balancing(job.spec.get("balancing")).mode,
        comm=parse_comm(job.spec.get("comm")),
        checkpoint=parse_checkpoint(job.spec.get("checkpoint")),
        checkpoint_url=recovery.checkpoint_url(job),
    )


def _balancing_scores(job_class: str, flavors: Iterable[Flavor]) -> dict[str, float]:
    """Each flavor's benchmark score for the balancer's first split, in one unit for the whole job: the
    throughput table's per-device samples/s for the job's class when it has a benchmarked or measured
    figure for every flavor of the job, else the flavors' peak bf16 TFLOP/s."""
    chosen = list(flavors)
    measured = throughput.measured_per_device()
    rates = {f.name: measured.get((job_class, f.name)) for f in chosen}
    if all(rate is not None and rate > 0 for rate in rates.values()):
        return {name: float(rate) for name, rate in rates.items() if rate is not None}
    return {f.name: float(f.peak_bf16_tflops) for f in chosen}


def provision_job(job_id: int) -> bool:
    """Launch an admitted job on the backend; True when this call moved it to running."""
    now = timezone.now()
    stale = now - PROVISION_CLAIM_TIMEOUT
    # The claim: only one worker launches. A claim older than the timeout is taken over, which
    # is safe because the backend's provision is idempotent per run.
    won = (
        TrainingJob.objects.filter(pk=job_id, state=JobState.ADMITTED)
        .filter(Q(provision_claimed_at__isnull=True) | Q(provision_claimed_at__lt=stale))
        .update(provision_claimed_at=now)
    )
    if won != 1:
        return False
    job = TrainingJob.objects.get(pk=job_id)
    if job.pending_teardowns:
        # An earlier attempt still runs (it is saving its checkpoint before it stops): the sweep
        # launches this one once it is gone, so two attempts never write the same checkpoints.
        TrainingJob.objects.filter(pk=job_id, provision_claimed_at=now).update(provision_claimed_at=None)
        return False
    if recovery.place_again_if_unschedulable(job_id):
        return False  # a device was cordoned (or failed) since admission: it launches on others
    backend = get_backend()
    try:
        handle = backend.provision(_launch_request(job))
    except Exception as exc:
        log.exception("provisioning job %s failed", job_id)
        finish_job(
            job_id,
            JobState.FAILED,
            reason=f"provisioning failed: {exc}",
            from_states=[JobState.ADMITTED],
            attempt=job.attempt,
        )
        return False
    with transaction.atomic():
        running = claim_transition(
            job_id,
            [JobState.ADMITTED],
            JobState.RUNNING,
            attempt=job.attempt,
            message=f"launched on the {backend.name} backend",
            started_at=timezone.now(),
            backend_handle=handle,
            last_heartbeat_at=timezone.now(),
        )
        if running is None:
            current = TrainingJob.objects.select_for_update().get(pk=job_id)
            if current.backend_handle == handle:
                # A provisioner that took over our stale claim already moved it to running: the
                # backend returned that same launch to both of us, so there is nothing to undo.
                return False
            # Cancelled or preempted while we launched: what we started must not keep running.
            if handle not in current.pending_teardowns:
                current.pending_teardowns = [*current.pending_teardowns, handle]
                current.save(update_fields=["pending_teardowns"])
    if running is None:
        teardown_job(job_id)
    return running is not None


def finish_job(
    job_id: int,
    state: str,
    *,
    reason: str = "",
    message: str = "",
    from_states: Iterable[str] = (JobState.QUEUED, JobState.ADMITTED, JobState.RUNNING, JobState.RECOVERING),
    attempt: int | None = None,
) -> bool:
    """End a job in a terminal state, closing its allocations and metering their usage.

    Whoever speaks for one attempt (an observer, a launcher) passes it, so that news of a preempted
    attempt never ends the job's next one.
    """
    from jobs import tasks

    if state not in TERMINAL_STATES:
        raise InvalidTransition(f"{state} is not a terminal state")
    with transaction.atomic():
        # Lock first, then read the clock: an admission that committed just before must not have
        # started an allocation after the moment this one ends it.
        TrainingJob.objects.select_for_update().filter(pk=job_id).first()
        now = timezone.now()
        job = claim_transition(
            job_id,
            from_states,
            state,
            attempt=attempt,
            message=message or reason or state,
            data={"reason": reason} if reason else None,
            finished_at=now,
            failure_reason=reason,
        )
        if job is None:
            return False
        end_allocations(job, now)
        if job.backend_handle:
            transaction.on_commit(lambda: tasks.teardown_job.delay(job_id), robust=True)
        transaction.on_commit(tasks.admit_queued_jobs.delay, robust=True)
    return True


def cancel_job(*, tenant_id: int, job_id: int) -> JobView:
    job = TrainingJob.scoped.for_tenant(tenant_id).filter(pk=job_id).first()
    if job is None:
        raise JobNotFound(job_id)
    if job.state in TERMINAL_STATES:
        raise InvalidTransition(f"job {job_id} already ended as {job.state}; nothing to cancel")
    if not finish_job(job_id, JobState.CANCELLED, message="cancelled by the tenant"):
        state = TrainingJob.objects.values_list("state", flat=True).get(pk=job_id)
        raise InvalidTransition(f"job {job_id} ended as {state} before the cancel arrived; nothing to cancel")
    return get_job(tenant_id=tenant_id, job_id=job_id)


def teardown_job(job_id: int) -> None:
    """Make sure nothing runs of an ended job, or of a preempted attempt; each handle is crossed
    off only once the backend confirms it is gone."""
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is None:
        return
    from jobs import tasks

    backend = get_backend()
    freed = False
    for handle in job.pending_teardowns:
        if _still_stopping(job, backend, handle):
            continue  # the sweep comes back once it has saved and stopped, or its time is up
        backend.teardown(handle)
        with transaction.atomic():
            current = TrainingJob.objects.select_for_update().get(pk=job_id)
            current.pending_teardowns = [h for h in current.pending_teardowns if h != handle]
            stopping = {
                k: v for k, v in (current.recovery or {}).get("stopping", {}).items() if k != _handle_key(handle)
            }
            current.recovery = {**current.recovery, "stopping": stopping}
            current.save(update_fields=["pending_teardowns", "recovery"])
        freed = True
    if job.state in TERMINAL_STATES and job.torn_down_at is None and job.backend_handle:
        backend.teardown(job.backend_handle)
        freed |= bool(
            TrainingJob.objects.filter(pk=job_id, torn_down_at__isnull=True).update(torn_down_at=timezone.now())
        )
    if freed:
        # Admission holds back the devices of runs not yet confirmed gone; they are free now.
        tasks.admit_queued_jobs.delay()


# How long a preempted attempt gets to save its checkpoint and stop before it is torn down anyway.
STOP_BEFORE_TEARDOWN_S = 20.0


def _handle_key(handle: dict[str, Any]) -> str:
    return json.dumps(handle, sort_keys=True)


def _still_stopping(job: TrainingJob, backend: Backend, handle: dict[str, Any]) -> bool:
    """Whether an attempt that is being replaced (a preemption) should be left to finish its stop:
    the first call asks it to checkpoint and stop, and it gets ``STOP_BEFORE_TEARDOWN_S`` to do so,
    so that its next attempt resumes from that step rather than an older one. Never blocks."""
    if backend.observe(handle).phase not in (Phase.RUNNING, Phase.PENDING):
        return False
    key = _handle_key(handle)
    with transaction.atomic():
        current = TrainingJob.objects.select_for_update().get(pk=job.pk)
        stopping = dict((current.recovery or {}).get("stopping") or {})
        asked_at = stopping.get(key)
        if asked_at is None:
            stopping[key] = time.time()
            current.recovery = {**current.recovery, "stopping": stopping}
            current.save(update_fields=["recovery"])
    if asked_at is None:
        backend.request_stop(handle, "preempted")
        return True
    return time.time() - float(asked_at) < STOP_BEFORE_TEARDOWN_S


def untorn_job_ids() -> list[int]:
    """Jobs with something the backend has not confirmed gone: an ended job whose teardown message
    was lost (or whose worker died), or an earlier attempt of a preempted job."""
    ended = Q(state__in=TERMINAL_STATES, backend_handle__isnull=False, torn_down_at__isnull=True)
    return list(TrainingJob.objects.filter(ended | ~Q(pending_teardowns=[])).values_list("pk", flat=True))


def observe_job(job_id: int) -> str:
    """Ask the backend how a running job fares and act on it; returns the job's state after."""
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is None:
        raise JobNotFound(job_id)
    if job.state != JobState.RUNNING or not job.backend_handle:
        return job.state
    observation = get_backend().observe(job.backend_handle)
    # What was observed is this attempt's news only: if the job was preempted or recovered meanwhile,
    # the claim fails and its next attempt is untouched.
    if observation.phase == Phase.SUCCEEDED:
        finish_job(
            job_id,
            JobState.SUCCEEDED,
            message="all ranks finished",
            from_states=[JobState.RUNNING],
            attempt=job.attempt,
        )
    elif observation.phase == Phase.STOPPED:
        recovery.handle_stop(job_id, job.attempt)
    elif observation.phase == Phase.GONE:
        recovery.handle_failure(job_id, job.attempt, observation, reason="the backend no longer knows this run")
    elif observation.phase == Phase.FAILED or observation.failure is not None:
        # A failed rank is news as soon as the backend sees it, before the rest of the run is down.
        recovery.handle_failure(job_id, job.attempt, observation)
    elif job.last_heartbeat_at and timezone.now() - job.last_heartbeat_at > timedelta(
        seconds=settings.POLYCHIP_HEARTBEAT_TIMEOUT_S
    ):
        timeout = settings.POLYCHIP_HEARTBEAT_TIMEOUT_S
        recovery.handle_failure(job_id, job.attempt, None, reason=f"no telemetry from the job for {timeout:.0f} s")
    return TrainingJob.objects.values_list("state", flat=True).get(pk=job_id)


def running_job_ids() -> list[int]:
    return list(TrainingJob.objects.filter(state=JobState.RUNNING).values_list("pk", flat=True))


def stale_admitted_job_ids() -> list[int]:
    """Admitted jobs whose launch never happened or whose launcher died mid-way."""
    stale = timezone.now() - PROVISION_CLAIM_TIMEOUT
    return list(
        TrainingJob.objects.filter(state=JobState.ADMITTED)
        .filter(Q(provision_claimed_at__isnull=True) | Q(provision_claimed_at__lt=stale))
        .values_list("pk", flat=True)
    )


# --- telemetry --------------------------------------------------------------------------------


class TelemetryRejected(PermissionError):
    pass


def ingest_telemetry(*, job_id: int, token: str, events: Sequence[TelemetryEvent]) -> int:
    """Fold a batch of worker events into the job's progress; returns how many were applied."""
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().filter(pk=job_id).first()
        if job is None or not hmac.compare_digest(token.encode(), ingest_token(job).encode()):
            raise TelemetryRejected("unknown job or wrong ingest token")
        if job.state not in (JobState.ADMITTED, JobState.RUNNING):
            return 0  # late telemetry of an ended job changes nothing
        fields: set[str] = {"last_heartbeat_at"}
        job.last_heartbeat_at = timezone.now()
        losses = list(job.recent_losses)
        for event in sorted(events, key=lambda e: (e.ts, e.step or 0)):
            if event.kind == "step" and event.step is not None:
                previous = job.rank_stats.get(str(event.rank)) or {}
                if (previous.get("step") or 0) <= event.step:
                    job.rank_stats[str(event.rank)] = {
                        "flavor": event.flavor,
                        "device_id": event.device_id,
                        "step": event.step,
                        "samples": event.samples,
                        # The rank's share of the global batch per optimizer step, and its own speed
                        # (its compute alone, before it waits for the others).
                        "micro_batch": event.samples,
                        "samples_per_s": event.samples_per_s,
                        "step_time_s": event.step_time_s,
                    }
                    fields.add("rank_stats")
                if event.rank == 0 and (event.split is not None or event.global_samples_per_s is not None):
                    _fold_balance(job, event)
                    fields.add("rank_stats")
                if event.rank == 0 and event.comm is not None:
                    _fold_comm_step(job, event)
                    fields.add("rank_stats")
                # Rank 0 speaks for the job: every rank reports the same global loss.
                if event.rank == 0 and event.step > job.steps_done and event.loss is not None:
                    job.steps_done = event.step
                    job.total_steps = max(event.total_steps or job.total_steps, event.step)
                    if job.first_loss is None:
                        job.first_loss = event.loss
                    job.last_loss = event.loss
                    losses.append(round(event.loss, 6))
                    fields |= {"steps_done", "total_steps", "first_loss", "last_loss", "recent_losses"}
            elif event.kind in ("comm", "comm_summary") and event.rank == 0 and event.comm is not None:
                # Rank 0 speaks for the job's exchange, as for its balance: the other ranks' own
                # figures (a group member sends nothing across groups) would overwrite its view.
                comm = job.rank_stats.setdefault(COMM_KEY, {})
                comm["ran" if event.kind == "comm" else "summary"] = event.comm
                fields.add("rank_stats")
            elif event.recovery is not None and event.rank == 0:
                if recovery.fold_event(job, event.kind, event.ts, event.recovery):
                    fields |= {"recovery", "steps_done"}
            elif event.kind == "finished" and event.rank == 0 and event.artifact:
                job.artifact_path = event.artifact
                fields.add("artifact_path")
            elif event.kind == "rebalanced" and event.step is not None and event.split is not None:
                balance = job.rank_stats.setdefault(BALANCE_KEY, {})
                if event.step > (balance.get("last_rebalance") or {}).get("step", 0):
                    balance["rebalances"] = balance.get("rebalances", 0) + 1
                    balance["last_rebalance"] = {
                        "step": event.step,
                        "split": [list(chunk) for chunk in event.split],
                        "reason": event.reason,
                        "steps_since_drift": event.steps_since_drift,
                    }
                    fields.add("rank_stats")
            elif event.kind == "straggler" and event.straggler_rank is not None and event.step is not None:
                balance = job.rank_stats.setdefault(BALANCE_KEY, {})
                reported = balance.setdefault("stragglers", [])
                if [event.straggler_rank, event.step] not in reported:  # a retried batch reports it once
                    reported.append([event.straggler_rank, event.step])
                    del reported[:-20]
                    fields.add("rank_stats")
                    _record_straggler(job, event)
        _store_readings(job, events)
        job.recent_losses = losses[-RECENT_LOSSES:]
        gang = (job.rank_stats.get(BALANCE_KEY) or {}).get("samples_per_s")
        speeds = [
            s["samples_per_s"] for s in rank_entries(job.rank_stats).values() if s.get("samples_per_s") is not None
        ]
        if gang is not None:
            # Rank 0's global batch over its step time: what the gang really does (the sum of the
            # ranks' own speeds is what it could do, balanced perfectly).
            job.samples_per_s = round(float(gang), 3)
            fields.add("samples_per_s")
        elif speeds:
            job.samples_per_s = round(float(sum(speeds)), 3)
            fields.add("samples_per_s")
        job.save(update_fields=sorted(fields))
        # The throughput table learns from rank 0's batches that moved the job on (one small UPDATE
        # per such batch, not per event); other ranks' batches only refresh their rank stats. It
        # learns after this transaction commits: the entry's row is shared by every job of the
        # class, flavor and size, and updating it here, under this job's row lock, would serialize
        # all their ingests on it. A failure there is logged, never raised into ingest.
        if "steps_done" in fields and job.steps_done > throughput.LEARN_AFTER_STEP:
            throughput.learn_after_commit(job.pk, job.job_class, job.rank_stats)
        if "steps_done" in fields and _progress_event_due(job_id):
            _record(
                job,
                kind=JobEvent.Kind.PROGRESS,
                message=f"step {job.steps_done}/{job.total_steps}",
                data={
                    "steps_done": job.steps_done,
                    "total_steps": job.total_steps,
                    "loss": job.last_loss,
                    "samples_per_s": job.samples_per_s,
                },
            )
    return len(events)


BALANCE_KEY = "balance"
COMM_KEY = "comm"
# A device keeps its last hour of health readings (one row a minute): twice what the predictor sees.
KEEP_READINGS = 60


def _store_readings(job: TrainingJob, events: Sequence[TelemetryEvent]) -> None:
    """Append each device's new health rows (from its rank's heartbeats) to its recent history. Only
    for the devices this job holds: its token speaks for them and no others."""
    rows: dict[str, list[list[float]]] = {}
    for event in sorted(events, key=lambda e: e.ts):
        if event.device_readings and event.device_id:
            rows.setdefault(event.device_id, []).extend(list(row) for row in event.device_readings)
    if not rows:
        return
    held = Device.objects.filter(
        allocations__job=job, allocations__ended_at__isnull=True, device_id__in=sorted(rows)
    ).order_by("device_id")
    for device in held.select_for_update():
        fresh = rows[device.device_id]
        device.health_readings = (list(device.health_readings) + fresh)[-KEEP_READINGS:]
        device.readings_at = timezone.now()
        device.unscored_rows += len(fresh)
        device.save(update_fields=["health_readings", "readings_at", "unscored_rows"])


def rank_entries(rank_stats: dict[str, Any]) -> dict[str, Any]:
    """The per-rank entries of a job's rank_stats (keyed by the rank as a string), without the
    job-wide ``balance`` and ``comm`` entries."""
    return {key: value for key, value in rank_stats.items() if key.isdigit()}


def _fold_balance(job: TrainingJob, event: TelemetryEvent) -> None:
    """Rank 0's step event carries the job's split, predicted speeds and balance efficiency."""
    assert event.step is not None
    balance = job.rank_stats.setdefault(BALANCE_KEY, {})
    if event.step < balance.get("step", 0):
        return
    balance["step"] = event.step
    if event.split is not None:
        balance["split"] = [list(chunk) for chunk in event.split]
    if event.predicted is not None:
        balance["predicted"] = [round(p, 3) for p in event.predicted]
    if event.efficiency is not None:
        balance["efficiency"] = round(event.efficiency, 4)
    if event.global_samples_per_s is not None:
        balance["samples_per_s"] = round(event.global_samples_per_s, 3)


def _fold_comm_step(job: TrainingJob, event: TelemetryEvent) -> None:
    """Rank 0's step event carries that step's exchange: bytes inside and across vendor groups, the
    collective's time, the part of it the backward pass did not hide, and the hidden share."""
    assert event.step is not None and event.comm is not None
    comm = job.rank_stats.setdefault(COMM_KEY, {})
    if event.step < (comm.get("last_step") or {}).get("step", 0):
        return
    comm["last_step"] = {"step": event.step, **event.comm}


def _record_straggler(job: TrainingJob, event: TelemetryEvent) -> None:
    rank = event.straggler_rank
    flavor = (job.rank_stats.get(str(rank)) or {}).get("flavor") or "unknown flavor"
    measured, expected = event.measured_samples_per_s or 0.0, event.expected_samples_per_s or 0.0
    _record(
        job,
        kind=JobEvent.Kind.PROGRESS,
        message=(
            f"straggler: rank {rank} ({flavor}) runs at {measured:.1f} samples/s where its benchmark score "
            f"promises {expected:.1f} (step {event.step}); consider replacing its device"
        )[:500],
        data={
            "straggler": {
                "rank": rank,
                "flavor": flavor,
                "step": event.step,
                "measured_samples_per_s": measured,
                "expected_samples_per_s": expected,
            }
        },
    )


def _progress_event_due(job_id: int) -> bool:
    """Progress goes into the event log (and so to the portal) at most once a second per job."""
    last = (
        JobEvent.objects.filter(job_id=job_id, kind=JobEvent.Kind.PROGRESS)
        .order_by("-pk")
        .values_list("created_at", flat=True)
        .first()
    )
    return last is None or timezone.now() - last >= PROGRESS_EVENT_EVERY


# --- reconciliation -----------------------------------------------------------------------------


def allocated_ms() -> dict[tuple[int, str], int]:
    """Milliseconds held by closed allocations per (tenant, flavor), each counted exactly as billing
    counts the usage record it wrote (whole epoch milliseconds of the end less those of the start),
    so that a reconciliation compares like with like. Open allocations have no usage record yet."""
    totals: dict[tuple[int, str], int] = {}
    rows = Allocation.objects.filter(ended_at__isnull=False).values_list(
        "job__tenant_id", "device__flavor__name", "started_at", "ended_at"
    )
    for tenant_id, flavor, started_at, ended_at in rows.iterator(chunk_size=5000):
        assert ended_at is not None  # only closed ones were selected
        key = (tenant_id, flavor)
        totals[key] = totals.get(key, 0) + billing.held_ms(started_at, ended_at)
    return totals
