"""Use cases of the jobs app: submit, admit, provision, observe, ingest, finish, cancel.

Every state change is a claim: the row is locked, its state checked, and a conditional UPDATE
moves it; the row count says who won. Each change appends a JobEvent in the same transaction,
and usage for every allocation it ends is written there too. Tasks call these functions with
ids, so running a task twice changes nothing the second time.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Count, Q
from django.utils import timezone

from billing import services as billing
from billing.contracts import UsageInterval
from jobs.backends import get_backend
from jobs.contracts import DeviceView, EventView, FlavorPoolView, JobView
from jobs.models import (
    TERMINAL_STATES,
    Allocation,
    Device,
    DeviceHealth,
    Flavor,
    JobEvent,
    JobState,
    Node,
    TrainingJob,
)
from jobs.telemetry import TelemetryEvent
from runtime.backends.base import LaunchRequest, Phase, RankPlacement
from runtime.inventory import Pool
from runtime.jobspec import JobSpec, parse_workload
from runtime.scheduling import FreeDevice, GangRequest, Placement, place_gang

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


def to_view(job: TrainingJob) -> JobView:
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
    )


def get_job(*, tenant_id: int, job_id: int) -> JobView:
    job = TrainingJob.objects.filter(tenant_id=tenant_id, pk=job_id).prefetch_related(*ALLOCATION_DEVICES).first()
    if job is None:
        raise JobNotFound(job_id)
    return to_view(job)


def list_jobs(*, tenant_id: int, limit: int = 100) -> list[JobView]:
    jobs = (
        TrainingJob.objects.filter(tenant_id=tenant_id)
        .prefetch_related(*ALLOCATION_DEVICES)
        .order_by("-created_at", "-pk")[:limit]
    )
    return [to_view(job) for job in jobs]


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
    if not TrainingJob.objects.filter(tenant_id=tenant_id, pk=job_id).exists():
        raise JobNotFound(job_id)
    return [event_view(e) for e in JobEvent.objects.filter(job_id=job_id).order_by("pk")]


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
    flavors = Flavor.objects.annotate(
        total=Count("devices", distinct=True),
        healthy=Count("devices", filter=Q(devices__health=DeviceHealth.HEALTHY), distinct=True),
        allocated=Count(
            "devices",
            filter=Q(devices__allocations__ended_at__isnull=True, devices__allocations__isnull=False),
            distinct=True,
        ),
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
            healthy=f.healthy,
            allocated=f.allocated,
        )
        for f in flavors
    ]


def known_flavors() -> set[str]:
    return set(Flavor.objects.values_list("name", flat=True))


# --- the pool ---------------------------------------------------------------------------------


@transaction.atomic
def sync_pool(pool: Pool) -> int:
    """Upsert flavors, nodes and devices from a parsed pool file; returns the device count."""
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
        Node.objects.update_or_create(name=spec.name, defaults={"flavor": flavors[spec.flavor], "rack": spec.rack})
    nodes = {n.name: n for n in Node.objects.all()}
    devices = pool.devices()
    for device in devices:
        Device.objects.update_or_create(
            device_id=device.device_id,
            defaults={"node": nodes[device.node], "flavor": flavors[device.flavor], "index": device.index},
        )
    return len(devices)


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


def _claim(
    job_id: int,
    from_states: Iterable[str],
    to_state: str,
    *,
    message: str,
    data: dict[str, Any] | None = None,
    **fields: Any,
) -> TrainingJob | None:
    """Move a job from one of ``from_states`` to ``to_state``; None when another worker got there first.

    Must run inside a transaction; the event is appended in it.
    """
    allowed = list(from_states)
    job = TrainingJob.objects.select_for_update().filter(pk=job_id).first()
    if job is None or job.state not in allowed:
        return None
    now = timezone.now()
    won = TrainingJob.objects.filter(pk=job_id, state=job.state).update(state=to_state, state_changed_at=now, **fields)
    if won != 1:
        return None
    previous = job.state
    job.refresh_from_db()
    _record(job, kind=JobEvent.Kind.TRANSITION, from_state=previous, to_state=to_state, message=message, data=data)
    return job


def _end_allocations(job: TrainingJob, ended_at: datetime) -> int:
    """Close the job's open allocations and write their usage in the current transaction."""
    open_allocations = list(job.allocations.filter(ended_at__isnull=True).select_related("device__flavor"))
    for allocation in open_allocations:
        allocation.ended_at = ended_at
    Allocation.objects.bulk_update(open_allocations, ["ended_at"])
    billing.record_usage(
        UsageInterval(
            key=f"allocation:{a.pk}",
            tenant_id=job.tenant_id,
            job_id=job.pk,
            device_id=a.device.device_id,
            flavor=a.device.flavor.name,
            started_at=a.started_at,
            ended_at=ended_at,
        )
        for a in open_allocations
    )
    return len(open_allocations)


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
        )
        _record(job, kind=JobEvent.Kind.TRANSITION, to_state=JobState.QUEUED, message="submitted")
        # robust: a broker hiccup must not turn a stored job into a 500 (and a retried duplicate);
        # beat's sweep admits it anyway.
        transaction.on_commit(tasks.admit_queued_jobs.delay, robust=True)
    return to_view(job)


def _free_devices() -> list[FreeDevice]:
    held = Allocation.objects.filter(ended_at__isnull=True).values("device_id")
    devices = (
        Device.objects.filter(health=DeviceHealth.HEALTHY)
        .exclude(pk__in=held)
        .select_related("node", "flavor")
        .order_by("device_id")
    )
    return [FreeDevice(device_id=d.device_id, node=d.node.name, flavor=d.flavor.name) for d in devices]


def _allocate(job: TrainingJob, placement: Placement, now: datetime) -> None:
    devices = {d.device_id: d for d in Device.objects.filter(device_id__in=[p.device_id for p in placement.devices])}
    Allocation.objects.bulk_create(
        Allocation(job=job, device=devices[p.device_id], rank=rank, started_at=now)
        for rank, p in enumerate(placement.devices)
    )


def admit_queued_jobs() -> list[int]:
    """One admission round: best-effort FIFO over queued jobs, all-or-nothing gangs. Returns admitted ids."""
    from jobs import tasks

    admitted: list[int] = []
    queued = list(
        TrainingJob.objects.filter(state=JobState.QUEUED).order_by("created_at", "pk").values_list("pk", flat=True)
    )
    for job_id in queued:
        try:
            with transaction.atomic():
                job = (
                    TrainingJob.objects.select_for_update(skip_locked=True)
                    .filter(pk=job_id, state=JobState.QUEUED)
                    .first()
                )
                if job is None:
                    continue  # another admitter holds it, or it moved on
                decision = place_gang(
                    GangRequest(devices=job.spec["devices"], flavors=tuple(job.spec["flavors"])), _free_devices()
                )
                if not isinstance(decision, Placement):
                    if job.pending_reason != decision.reason:
                        TrainingJob.objects.filter(pk=job.pk).update(pending_reason=decision.reason)
                    # Best-effort FIFO (Kueue's default): a job that does not fit now waits with its
                    # reason and lets smaller ones behind it start. The pool can grow, so a job larger
                    # than today's pool waits rather than being refused.
                    continue
                now = timezone.now()
                device_ids = [d.device_id for d in decision.devices]
                claimed = _claim(
                    job.pk,
                    [JobState.QUEUED],
                    JobState.ADMITTED,
                    message=f"admitted on {len(device_ids)} devices: {', '.join(decision.flavors)}",
                    data={"devices": device_ids, "flavors": list(decision.flavors)},
                    admitted_at=now,
                    pending_reason="",
                )
                if claimed is None:
                    continue
                _allocate(claimed, decision, now)
                transaction.on_commit(functools.partial(tasks.provision_job.delay, job.pk))
                admitted.append(job.pk)
        except IntegrityError:
            # A device was taken between the snapshot and the insert: the next round sees it.
            log.info("admission of job %s lost a device race; retrying next round", job_id)
            break
    return admitted


def run_key(job: TrainingJob) -> str:
    """A name for the job's run that is unique beyond the primary key, so that a reset database
    never meets an old run's files, artifacts or still-running workers."""
    return f"job-{job.pk}-{job.created_at:%Y%m%d%H%M%S%f}"


def ingest_token(job: TrainingJob) -> str:
    """The job's telemetry secret: derived, so a re-provisioned job gets the same one."""
    message = f"ingest:{run_key(job)}".encode()
    return hmac.new(settings.SECRET_KEY.encode(), message, hashlib.sha256).hexdigest()


def _launch_request(job: TrainingJob) -> LaunchRequest:
    allocations = job.allocations.filter(ended_at__isnull=True).select_related("device__node", "device__flavor")
    placements = tuple(
        RankPlacement(rank=a.rank, device_id=a.device.device_id, flavor=a.device.flavor.name, node=a.device.node.name)
        for a in allocations.order_by("rank")
    )
    return LaunchRequest(
        job_id=run_key(job),
        placements=placements,
        workload=parse_workload(job.spec.get("workload")),
        telemetry_url=f"{settings.POLYCHIP_PUBLIC_URL.rstrip('/')}/api/v1/ingest/jobs/{job.pk}/telemetry",
        telemetry_token=ingest_token(job),
        artifacts_dir=str(settings.POLYCHIP_ARTIFACTS_DIR / run_key(job)),
    )


def provision_job(job_id: int) -> bool:
    """Launch an admitted job on the backend; True when this call moved it to running."""
    now = timezone.now()
    stale = now - PROVISION_CLAIM_TIMEOUT
    # The claim: only one worker launches. A claim older than the timeout is taken over, which
    # is safe because the backend's provision is idempotent per job.
    won = (
        TrainingJob.objects.filter(pk=job_id, state=JobState.ADMITTED)
        .filter(Q(provision_claimed_at__isnull=True) | Q(provision_claimed_at__lt=stale))
        .update(provision_claimed_at=now)
    )
    if won != 1:
        return False
    job = TrainingJob.objects.get(pk=job_id)
    backend = get_backend()
    try:
        handle = backend.provision(_launch_request(job))
    except Exception as exc:
        log.exception("provisioning job %s failed", job_id)
        finish_job(job_id, JobState.FAILED, reason=f"provisioning failed: {exc}")
        return False
    with transaction.atomic():
        running = _claim(
            job_id,
            [JobState.ADMITTED],
            JobState.RUNNING,
            message=f"launched on the {backend.name} backend",
            started_at=timezone.now(),
            backend_handle=handle,
            last_heartbeat_at=timezone.now(),
        )
    if running is not None:
        return True
    state = TrainingJob.objects.values_list("state", flat=True).get(pk=job_id)
    if state in TERMINAL_STATES:
        # Cancelled while we launched: record the handle so the sweep makes sure nothing runs.
        TrainingJob.objects.filter(pk=job_id, backend_handle__isnull=True).update(backend_handle=handle)
        teardown_job(job_id)
    # Otherwise a provisioner that took over our stale claim already moved it to running: the
    # backend returned that same launch to both of us, so there is nothing to undo.
    return False


def finish_job(job_id: int, state: str, *, reason: str = "", message: str = "") -> bool:
    """End a job in a terminal state, closing its allocations and metering their usage."""
    from jobs import tasks

    if state not in TERMINAL_STATES:
        raise InvalidTransition(f"{state} is not a terminal state")
    with transaction.atomic():
        now = timezone.now()
        job = _claim(
            job_id,
            [JobState.QUEUED, JobState.ADMITTED, JobState.RUNNING],
            state,
            message=message or reason or state,
            data={"reason": reason} if reason else None,
            finished_at=now,
            failure_reason=reason,
        )
        if job is None:
            return False
        _end_allocations(job, now)
        if job.backend_handle:
            transaction.on_commit(lambda: tasks.teardown_job.delay(job_id), robust=True)
        transaction.on_commit(tasks.admit_queued_jobs.delay, robust=True)
    return True


def cancel_job(*, tenant_id: int, job_id: int) -> JobView:
    job = TrainingJob.objects.filter(tenant_id=tenant_id, pk=job_id).first()
    if job is None:
        raise JobNotFound(job_id)
    if job.state in TERMINAL_STATES:
        raise InvalidTransition(f"job {job_id} already ended as {job.state}; nothing to cancel")
    if not finish_job(job_id, JobState.CANCELLED, message="cancelled by the tenant"):
        state = TrainingJob.objects.values_list("state", flat=True).get(pk=job_id)
        raise InvalidTransition(f"job {job_id} ended as {state} before the cancel arrived; nothing to cancel")
    return get_job(tenant_id=tenant_id, job_id=job_id)


def teardown_job(job_id: int) -> None:
    """Make sure nothing of an ended job runs; recorded only once the backend confirms it."""
    job = TrainingJob.objects.filter(pk=job_id, state__in=TERMINAL_STATES, torn_down_at__isnull=True).first()
    if job is None or not job.backend_handle:
        return
    get_backend().teardown(job.backend_handle)
    TrainingJob.objects.filter(pk=job_id, torn_down_at__isnull=True).update(torn_down_at=timezone.now())


def untorn_job_ids() -> list[int]:
    """Ended jobs whose teardown was never confirmed (its message lost, or the worker died)."""
    return list(
        TrainingJob.objects.filter(
            state__in=TERMINAL_STATES, backend_handle__isnull=False, torn_down_at__isnull=True
        ).values_list("pk", flat=True)
    )


def observe_job(job_id: int) -> str:
    """Ask the backend how a running job fares and act on it; returns the job's state after."""
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is None:
        raise JobNotFound(job_id)
    if job.state != JobState.RUNNING or not job.backend_handle:
        return job.state
    observation = get_backend().observe(job.backend_handle)
    if observation.phase == Phase.SUCCEEDED:
        finish_job(job_id, JobState.SUCCEEDED, message="all ranks finished")
    elif observation.phase == Phase.FAILED:
        finish_job(job_id, JobState.FAILED, reason=observation.reason or "a rank failed")
    elif observation.phase == Phase.GONE:
        finish_job(job_id, JobState.FAILED, reason="the backend no longer knows this job")
    elif job.last_heartbeat_at and timezone.now() - job.last_heartbeat_at > timedelta(
        seconds=settings.POLYCHIP_HEARTBEAT_TIMEOUT_S
    ):
        finish_job(job_id, JobState.FAILED, reason=f"no heartbeat for {settings.POLYCHIP_HEARTBEAT_TIMEOUT_S:.0f} s")
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
                job.rank_stats[str(event.rank)] = {
                    "flavor": event.flavor,
                    "device_id": event.device_id,
                    "step": event.step,
                    "samples": event.samples,
                    "samples_per_s": event.samples_per_s,
                    "step_time_s": event.step_time_s,
                }
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
            elif event.kind == "finished" and event.rank == 0 and event.artifact:
                job.artifact_path = event.artifact
                fields.add("artifact_path")
        job.recent_losses = losses[-RECENT_LOSSES:]
        speeds = [s["samples_per_s"] for s in job.rank_stats.values() if s.get("samples_per_s") is not None]
        if speeds:
            job.samples_per_s = round(float(sum(speeds)), 3)
            fields.add("samples_per_s")
        job.save(update_fields=sorted(fields))
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


def _progress_event_due(job_id: int) -> bool:
    """Progress goes into the event log (and so to the portal) at most once a second per job."""
    last = (
        JobEvent.objects.filter(job_id=job_id, kind=JobEvent.Kind.PROGRESS)
        .order_by("-pk")
        .values_list("created_at", flat=True)
        .first()
    )
    return last is None or timezone.now() - last >= PROGRESS_EVENT_EVERY
