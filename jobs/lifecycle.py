"""A job's life on the backend: submit, provision, observe, cancel, tear down.

Tasks call these with ids, so running a task twice changes nothing the second time: launching is a
claim on the attempt (one worker launches it), every state change is a claim through the transition
table, and a run is crossed off only once the backend confirms it is gone.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from controlplane import logs
from controlplane.domain import Invalid
from jobs import bundles, capacity, dispatch, locks, moving, recovery, submission, throughput, transitions
from jobs.backends import device_limits, get_backend
from jobs.contracts import AdmissionPreview
from jobs.errors import InvalidTransition, JobNotFound, QueueFull
from jobs.finishing import finish_job
from jobs.models import TERMINAL_STATES, Flavor, JobAttempt, JobEvent, JobState, TrainingJob
from jobs.pool import devices_per_flavor, untorn_attempts
from jobs.runs import checkpoint_url, ingest_token, job_key, run_key
from runtime.backends.base import Backend, BackendUnavailable, LaunchRequest, Phase, RankPlacement
from runtime.jobspec import MAX_PRIORITY, JobSpec, stored_job_spec
from tenants import services as tenants

log = logging.getLogger(__name__)

PROVISION_CLAIM_TIMEOUT = timedelta(seconds=120)


def check_workload(*, tenant_id: int, spec: JobSpec) -> None:
    """What the spec alone cannot tell: that the tenant's bundle exists and holds the entrypoint,
    and that this installation's backend runs the kind."""
    workload = spec.workload
    if workload.kind in ("python", "torchrun"):
        bundles.bundle_entrypoint(tenant_id=tenant_id, ref=workload.bundle, entrypoint=workload.entrypoint)
    if workload.kind == "container" and settings.POLYCHIP_BACKEND == "local":
        raise Invalid(
            "container workloads run their image on the Kubernetes backend (POLYCHIP_BACKEND=kubernetes); "
            "this installation runs the local backend: use builtin, python (upload your code as a bundle) or torchrun",
            field="workload.kind",
            code="invalid_spec",
        )


def preview_submit(*, tenant_id: int, spec: JobSpec) -> AdmissionPreview:
    """What submitting the spec now would do (the checks submit makes, then admission's verdict),
    storing nothing."""
    check_workload(tenant_id=tenant_id, spec=spec)
    return capacity.preview(tenant_id=tenant_id, spec=spec)


def check_submit(*, tenant_id: int, spec: JobSpec) -> None:
    """Every check submit makes before it stores anything (a dry run makes them too): the workload, a
    job that could never start (unless it may wait for capacity), the tenant's queue cap."""
    _check_spec(tenant_id=tenant_id, spec=spec)
    waiting = TrainingJob.objects.filter(tenant_id=tenant_id, state=JobState.QUEUED).count()
    if waiting >= tenants.queued_jobs_cap(tenant_id):
        raise _queue_full(waiting)


def _check_spec(*, tenant_id: int, spec: JobSpec) -> None:
    check_workload(tenant_id=tenant_id, spec=spec)
    if not spec.wait_for_capacity and (why := capacity.never_fits(tenant_id=tenant_id, spec=spec)) is not None:
        raise Invalid(why, field="devices", code="never_fits")


def _queue_full(waiting: int) -> QueueFull:
    # A soft cap: two submissions at the same instant may both see room for one. It is there so that
    # one tenant cannot queue without end, not to count exactly.
    return QueueFull(
        f"the tenant has {waiting} jobs waiting, the most it may have (an operator sets it per tenant); "
        "wait for some to start, or cancel some"
    )


def submit_job(*, tenant_id: int, user_id: int | None, spec: JobSpec) -> TrainingJob:
    """Store the job queued (its first attempt and its event with it, behind the queue cap) and ask for
    an admission cycle once that commits."""
    _check_spec(tenant_id=tenant_id, spec=spec)
    job, attempt, event = submission.queued_job(tenant_id=tenant_id, user_id=user_id, spec=spec)
    waiting = submission.store_queued_job(job, attempt, event)
    if waiting is not None:
        raise _queue_full(waiting)
    # robust: a broker hiccup must not turn a stored job into a 500 (and a retried duplicate); beat's
    # sweep admits it anyway. Outside a transaction (the one statement committed) it sends at once.
    dispatch.after_commit(dispatch.ADMIT)
    return job


# --- provisioning -------------------------------------------------------------------------------


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
    spec = job.job_spec
    public = settings.POLYCHIP_PUBLIC_URL.rstrip("/")
    return LaunchRequest(
        job_id=run_key(job),
        placements=placements,
        workload=spec.workload_on(len(placements)),  # an elastic job's batch and rate follow its count
        telemetry_url=f"{public}/api/v1/ingest/jobs/{job.pk}/telemetry",
        telemetry_token=ingest_token(job),
        artifacts_dir=str(settings.POLYCHIP_ARTIFACTS_DIR / run_key(job)),
        balancing=spec.balancing.mode,
        comm=spec.comm,
        checkpoint=spec.checkpoint,
        checkpoint_url=checkpoint_url(job),
        bundle_path=str(_bundle_file(job)) if spec.workload.bundle else None,
        bundle_url=f"{public}/api/v1/ingest/jobs/{job.pk}/bundle" if spec.workload.bundle else None,
        job_key=job_key(job),
        tenant=job.tenant.slug,
    )


def _prepare_tenant(backend: Backend, job: TrainingJob) -> None:
    """On a cluster, the tenant's namespace and its guards, made or brought up to date before each launch
    (a quota may have changed since the last)."""
    sync_tenant = getattr(backend, "sync_tenant", None)
    if sync_tenant is None:
        return
    sync_tenant(job.tenant.slug, device_limits(job.tenant_id, devices_per_flavor()))


def _bundle_file(job: TrainingJob) -> Path:
    return bundles.bundle_path(tenant_id=job.tenant_id, ref=job.job_spec.workload.bundle)


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


def _claim_launch(job: TrainingJob, now: Any) -> bool:
    """The launch claim on the job's current attempt: only one worker launches it. A claim older
    than the timeout is taken over, which is safe because the backend's provision is idempotent per
    run."""
    JobAttempt.objects.get_or_create(job_id=job.pk, number=job.attempt)  # jobs made before attempts had rows
    stale = now - PROVISION_CLAIM_TIMEOUT
    return (
        JobAttempt.objects.filter(job_id=job.pk, number=job.attempt, ended_at__isnull=True)
        .filter(Q(provision_claimed_at__isnull=True) | Q(provision_claimed_at__lt=stale))
        .update(provision_claimed_at=now)
        == 1
    )


def provision_job(job_id: int) -> bool:
    """Launch an admitted job on the backend; True when this call moved it to running."""
    now = timezone.now()
    job = TrainingJob.objects.filter(pk=job_id, state=JobState.ADMITTED).first()
    if job is None or not _claim_launch(job, now):
        return False
    number = job.attempt
    logs.bind(job=job_id, attempt=number)
    if not TrainingJob.objects.filter(pk=job_id, state=JobState.ADMITTED, attempt=number).exists():
        return False  # cancelled or preempted since it was read: nothing to launch
    if JobAttempt.objects.filter(job_id=job_id).filter(untorn_attempts()).exists():
        # An earlier attempt still runs (it is saving its checkpoint before it stops): the sweep
        # launches this one once it is gone, so two attempts never write the same checkpoints.
        JobAttempt.objects.filter(job_id=job_id, number=number, provision_claimed_at=now).update(
            provision_claimed_at=None
        )
        return False
    if recovery.place_again_if_unschedulable(job_id):
        return False  # a device was cordoned (or failed) since admission: it launches on others
    backend = get_backend()
    try:
        _prepare_tenant(backend, job)
        handle = backend.provision(_launch_request(job))
    except BackendUnavailable as exc:
        # Nothing was started; the claim stays, so the sweep launches it again once the claim is stale.
        log.warning("provisioning job %s: %s; retrying later", job_id, exc)
        return False
    except Exception as exc:
        log.exception("provisioning job %s failed", job_id)
        finish_job(
            job_id,
            JobState.FAILED,
            reason=f"provisioning failed: {exc}",
            from_states=[JobState.ADMITTED],
            attempt=number,
        )
        return False
    with transaction.atomic():
        running = transitions.claim(
            job_id,
            JobState.RUNNING,
            from_states=[JobState.ADMITTED],
            attempt=number,
            message=f"launched on the {backend.name} backend",
            started_at=timezone.now(),
            # None until this attempt's workers speak: until then the start-up grace applies, not liveness.
            last_heartbeat_at=None,
        )
        run = locks.attempt(job_id, number)
        if run is not None and run.backend_handle is None:
            # Also when the claim failed (cancelled or preempted while we launched): the run is then an
            # attempt that should not run, and the sweep tears it down.
            run.backend_handle = handle
            run.save(update_fields=["backend_handle"])
        elif running is None and run is not None and run.backend_handle == handle:
            # A provisioner that took over our stale claim already moved it to running: the backend
            # returned that same launch to both of us, so there is nothing to undo.
            return False
        elif running is None:
            # The attempt holds another launch than ours (a backend whose launches are not idempotent
            # per run): ours has no row to wait on, so it goes now.
            log.warning("job %s: a second launch of attempt %s is torn down at once", job_id, number)
            backend.teardown(handle)
    if running is None:
        teardown_job(job_id)
    return running is not None


def stale_admitted_job_ids() -> list[int]:
    """Admitted jobs whose launch never happened or whose launcher died mid-way."""
    stale = timezone.now() - PROVISION_CLAIM_TIMEOUT
    claimed = JobAttempt.objects.filter(job__state=JobState.ADMITTED, number=F("job__attempt")).filter(
        provision_claimed_at__gte=stale
    )
    return list(
        TrainingJob.objects.filter(state=JobState.ADMITTED)
        .exclude(pk__in=claimed.values("job_id"))
        .values_list("pk", flat=True)
    )


# --- ending -------------------------------------------------------------------------------------


def cancel_job(*, tenant_id: int, job_id: int) -> None:
    job = TrainingJob.scoped.for_tenant(tenant_id).filter(pk=job_id).first()
    if job is None:
        raise JobNotFound(job_id)
    if job.state in TERMINAL_STATES:
        raise InvalidTransition(f"job {job_id} already ended as {job.state}; nothing to cancel")
    if not finish_job(job_id, JobState.CANCELLED, message="cancelled by the tenant"):
        state = TrainingJob.objects.values_list("state", flat=True).get(pk=job_id)
        raise InvalidTransition(f"job {job_id} ended as {state} before the cancel arrived; nothing to cancel")


def retry_job(*, tenant_id: int, job_id: int, user_id: int | None) -> TrainingJob:
    """A new job with the spec of one that has ended (a clone: its own id, queue place and attempts);
    each of the two jobs' events names the other."""
    job = TrainingJob.scoped.for_tenant(tenant_id).filter(pk=job_id).first()
    if job is None:
        raise JobNotFound(job_id)
    if job.state not in TERMINAL_STATES:
        raise InvalidTransition(
            f"job {job_id} is {job.state}; a retry clones a job that has ended: wait for it, or cancel it first"
        )
    with transaction.atomic():  # the clone and both events, or none of them
        clone = submit_job(tenant_id=tenant_id, user_id=user_id, spec=stored_job_spec(job.spec))
        transitions.record_event(
            clone, kind=JobEvent.Kind.ACTION, message=f"a retry of job {job_id}", data={"retry_of": job_id}
        )
        transitions.record_event(
            job, kind=JobEvent.Kind.ACTION, message=f"retried as job {clone.pk}", data={"retried_as": clone.pk}
        )
    return clone


def set_priority(*, tenant_id: int, job_id: int, priority: int) -> None:
    """Move a job that has not ended within its tenant's queue. Priority orders the tenant's own queue
    and lets its work preempt borrowed capacity only, never another tenant's nominal share: any value
    the spec allows is the tenant's to set."""
    low, high = -MAX_PRIORITY, MAX_PRIORITY
    if not low <= priority <= high:
        raise Invalid(f"priority: between {low} and {high}, got {priority}", field="priority")
    with transaction.atomic():
        job = locks.job(job_id)
        if job is None or job.tenant_id != tenant_id:  # another tenant's job is not found either
            raise JobNotFound(job_id)
        if job.state in TERMINAL_STATES:
            raise InvalidTransition(f"job {job_id} already ended as {job.state}; its priority no longer matters")
        before = job.priority
        job.priority = priority
        job.spec = {**job.spec, "priority": priority}
        job.save(update_fields=["priority", "spec"])
        transitions.record_event(
            job,
            kind=JobEvent.Kind.ACTION,
            message=f"priority {before} → {priority}",
            data={"priority": priority, "was": before},
        )
        if job.state == JobState.QUEUED:
            dispatch.after_commit(dispatch.ADMIT)


def teardown_job(job_id: int) -> None:
    """Make sure nothing runs of an ended job, or of a replaced attempt; each run is marked gone
    only once the backend confirms it."""
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is None:
        return
    backend = get_backend()
    freed = False
    for run in JobAttempt.objects.filter(job_id=job_id).filter(untorn_attempts()).order_by("number"):
        handle = run.backend_handle or {}  # untorn attempts have one
        replaced = run.number != job.attempt
        if replaced and _still_stopping(run, handle, backend):
            continue  # the sweep comes back once it has saved and stopped, or its time is up
        backend.teardown(handle)
        freed |= bool(
            JobAttempt.objects.filter(pk=run.pk, torn_down_at__isnull=True).update(torn_down_at=timezone.now())
        )
    if freed:
        # Admission holds back the devices of runs not yet confirmed gone; they are free now.
        dispatch.send(dispatch.ADMIT)


def _still_stopping(run: JobAttempt, handle: dict[str, Any], backend: Backend) -> bool:
    """Whether a run that is being replaced (a preemption) should be left to finish its stop: the
    first call asks it to checkpoint and stop, and it gets ``moving.STOP_WINDOW_S`` to do so, so
    that its next attempt resumes from that step rather than an older one. Never blocks."""
    if backend.observe(handle).phase not in (Phase.RUNNING, Phase.PENDING):
        return False
    now = timezone.now()
    asked = JobAttempt.objects.filter(pk=run.pk, stop_asked_at__isnull=True).update(stop_asked_at=now)
    if asked:
        backend.request_stop(handle, "preempted")
        return True
    asked_at = JobAttempt.objects.values_list("stop_asked_at", flat=True).get(pk=run.pk)
    # A backend whose stop takes longer to arrive (a cluster's ConfigMap refresh) says how long to give it.
    return asked_at is not None and (now - asked_at).total_seconds() < moving.stop_window_s(backend)


def untorn_job_ids() -> list[int]:
    """Jobs with a run the backend has not confirmed gone: an ended job whose teardown message was
    lost (or whose worker died), or an earlier attempt of a preempted or recovered job."""
    return list(JobAttempt.objects.filter(untorn_attempts()).values_list("job_id", flat=True).distinct())


# --- observing ----------------------------------------------------------------------------------


def observe_job(job_id: int) -> str:
    """Ask the backend how a running job fares and act on it; returns the job's state after."""
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is None:
        raise JobNotFound(job_id)
    run = recovery.current_attempt(job)
    if job.state != JobState.RUNNING or run is None or not run.backend_handle:
        return job.state
    observation = get_backend().observe(run.backend_handle)
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
    elif (reason := _silence(job)) is not None:
        recovery.handle_failure(job_id, job.attempt, None, reason=reason)
    return TrainingJob.objects.values_list("state", flat=True).get(pk=job_id)


def _silence(job: TrainingJob) -> str | None:
    """Why a running attempt counts as gone for want of telemetry, or None.

    Start-up and liveness are different clocks: until the attempt's first telemetry its ranks are
    starting (importing torch, rendezvous), which on a loaded host takes long, so they get the
    start-up grace; after it, silence for the heartbeat timeout means the job is gone.
    """
    now = timezone.now()
    if job.last_heartbeat_at is None:
        grace = settings.POLYCHIP_STARTUP_GRACE_S
        if job.started_at is not None and now - job.started_at > timedelta(seconds=grace):
            return f"no telemetry from the job within its {grace:.0f} s start-up grace (the ranks never reported)"
        return None
    timeout = settings.POLYCHIP_HEARTBEAT_TIMEOUT_S
    if now - job.last_heartbeat_at > timedelta(seconds=timeout):
        return f"no telemetry from the job for {timeout:.0f} s (liveness; it had been reporting)"
    return None


def running_job_ids() -> list[int]:
    return list(TrainingJob.objects.filter(state=JobState.RUNNING).values_list("pk", flat=True))
