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


def _device_views(job: TrainingJob) -> tuple[DeviceView, ...]:
    allocations = job.allocations.select_related("device__node", "device__flavor").order_by("rank", "started_at")
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
    job = TrainingJob.objects.filter(tenant_id=tenant_id, pk=job_id).first()
    if job is None:
        raise JobNotFound(job_id)
    return to_view(job)


def list_jobs(*, tenant_id: int, limit: int = 100) -> list[JobView]:
    jobs = TrainingJob.objects.filter(tenant_id=tenant_id).order_by("-created_at", "-pk")[:limit]
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


def events_after(event_id: int, limit: int = 500) -> list[EventView]:
    """Events newer than ``event_id``, oldest first: what the push relay sends next."""
    return [event_view(e) for e in JobEvent.objects.filter(pk__gt=event_id).order_by("pk")[:limit]]


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
        transaction.on_commit(tasks.admit_queued_jobs.delay)
    return to_view(job)


def _free_devices() -> list[FreeDevice]:
    devices = (
        Device.objects.filter(health=DeviceHealth.HEALTHY)
        .exclude(allocations__ended_at__isnull=True, allocations__isnull=False)
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


def ingest_token(job_id: int) -> str:
    """The job's telemetry secret: derived, so a re-provisioned job gets the same one."""
    return hmac.new(settings.SECRET_KEY.encode(), f"ingest:{job_id}".encode(), hashlib.sha256).hexdigest()


def _launch_request(job: TrainingJob) -> LaunchRequest:
    allocations = job.allocations.filter(ended_at__isnull=True).select_related("device__node", "device__flavor")
    placements = tuple(
        RankPlacement(rank=a.rank, device_id=a.device.device_id, flavor=a.device.flavor.name, node=a.device.node.name)
        for a in allocations.order_by("rank")
    )
    return LaunchRequest(
        # Unique beyond the primary key, so a reset database never meets an old run's files.
        job_id=f"job-{job.pk}-{job.created_at:%Y%m%d%H%M%S%f}",
        placements=placements,
        workload=parse_workload(job.spec.get("workload")),
        telemetry_url=f"{settings.POLYCHIP_PUBLIC_URL.rstrip('/')}/api/v1/ingest/jobs/{job.pk}/telemetry",
        telemetry_token=ingest_token(job.pk),
        artifacts_dir=str(settings.POLYCHIP_ARTIFACTS_DIR / str(job.pk)),
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
            backend_name=backend.name,
            backend_handle=handle,
            last_heartbeat_at=timezone.now(),
        )
    if running is None:
        # Cancelled while we launched: do not leave processes behind.
        backend.teardown(handle)
        return False
    return True


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
            transaction.on_commit(lambda: tasks.teardown_job.delay(job_id))
        transaction.on_commit(tasks.admit_queued_jobs.delay)
    return True


def cancel_job(*, tenant_id: int, job_id: int) -> JobView:
    job = TrainingJob.objects.filter(tenant_id=tenant_id, pk=job_id).first()
    if job is None:
        raise JobNotFound(job_id)
    if job.state in TERMINAL_STATES:
        raise InvalidTransition(f"job {job_id} already ended as {job.state}; nothing to cancel")
    finish_job(job_id, JobState.CANCELLED, message="cancelled by the tenant")
    return get_job(tenant_id=tenant_id, job_id=job_id)


def teardown_job(job_id: int) -> None:
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is not None and job.backend_handle:
        get_backend().teardown(job.backend_handle)


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


def _as_time(ts: Any) -> datetime:
    try:
        return datetime.fromtimestamp(float(ts), tz=timezone.get_current_timezone())
    except (TypeError, ValueError, OverflowError):
        return timezone.now()


def ingest_telemetry(*, job_id: int, token: str, events: Sequence[dict[str, Any]]) -> int:
    """Fold a batch of worker events into the job's progress; returns how many were applied."""
    if not hmac.compare_digest(token, ingest_token(job_id)):
        raise TelemetryRejected("unknown job or wrong ingest token")
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().filter(pk=job_id).first()
        if job is None:
            raise TelemetryRejected("unknown job or wrong ingest token")
        if job.state not in (JobState.ADMITTED, JobState.RUNNING):
            return 0  # late telemetry of an ended job changes nothing
        applied = 0
        losses = list(job.recent_losses)
        fields: set[str] = {"last_heartbeat_at"}
        job.last_heartbeat_at = timezone.now()
        for event in sorted(events, key=lambda e: (e.get("ts", 0), e.get("step", 0))):
            kind = event.get("kind")
            rank = str(event.get("rank", "?"))
            if kind == "step" and isinstance(event.get("step"), int):
                step = event["step"]
                stats = job.rank_stats.setdefault(rank, {})
                stats.update(
                    flavor=event.get("flavor", ""),
                    device_id=event.get("device_id", ""),
                    step=step,
                    samples=event.get("samples"),
                    samples_per_s=event.get("samples_per_s"),
                    step_time_s=event.get("step_time_s"),
                )
                fields.add("rank_stats")
                if event.get("rank") == 0 and step > job.steps_done and isinstance(event.get("loss"), int | float):
                    loss = float(event["loss"])
                    job.steps_done = step
                    job.total_steps = int(event.get("total_steps") or job.total_steps)
                    if job.first_loss is None:
                        job.first_loss = loss
                    job.last_loss = loss
                    losses.append(round(loss, 6))
                    fields |= {"steps_done", "total_steps", "first_loss", "last_loss", "recent_losses"}
                applied += 1
            elif kind == "finished" and event.get("rank") == 0:
                job.artifact_path = str(event.get("artifact", ""))[:500]
                fields.add("artifact_path")
                applied += 1
            elif kind in ("heartbeat", "started"):
                applied += 1
        job.recent_losses = losses[-RECENT_LOSSES:]
        speeds = [
            s.get("samples_per_s") for s in job.rank_stats.values() if isinstance(s.get("samples_per_s"), int | float)
        ]
        if speeds:
            job.samples_per_s = round(float(sum(speeds)), 3)
            fields.add("samples_per_s")
        job.save(update_fields=sorted(fields))
        last_progress = (
            JobEvent.objects.filter(job_id=job_id, kind=JobEvent.Kind.PROGRESS)
            .order_by("-pk")
            .values_list("created_at", flat=True)
            .first()
        )
        if "steps_done" in fields and (last_progress is None or timezone.now() - last_progress >= PROGRESS_EVENT_EVERY):
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
    return applied
