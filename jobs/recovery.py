"""Recovery: failure detected → job frozen → devices reallocated → state restored → training continues.

No person takes part. The observe sweep (``services.observe_job``) hands this module what the
backend saw:

- a failed rank (a process exit, a kill, missed heartbeats, a hung collective that timed out), a
  lost run, or a job whose telemetry went silent: ``handle_failure``;
- a run whose ranks saved a full checkpoint and stopped on request: ``handle_stop``.

Both stop what is left of the run, give its devices back (metering them) and choose the next
attempt's devices with ``runtime.recovery.plan.plan_restart``: the surviving devices, then the same
flavors, then any flavor the spec allows, shrinking down to ``min_devices`` when the pool is short.
The next attempt launches through the normal provisioning path; the worker restores the newest
checkpoint in the job's store, whatever world size wrote it. A failure that a device likely caused (a
kill, silence) marks that device ``failed`` so that nothing is placed there again until an operator
returns it. A job that fails more than ``max_restarts`` times ends ``failed`` with the reason.

Moving a healthy job (an operator's drain, growing back after a shrink, a predicted failure) asks its
ranks to checkpoint and stop first (``request_move``); the stop is then handled as above, without
counting a restart.

Every step is an event on the job. Devices are chosen under the admission lock, as admission does,
so a cycle running at the same time never hands out the same device.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from jobs.admission import _free_device as admission_free_device
from jobs.backends import get_backend
from jobs.models import Allocation, Device, DeviceHealth, JobEvent, JobState, TrainingJob
from runtime.backends.base import Observation
from runtime.jobspec import parse_checkpoint
from runtime.recovery.advisor import advise, job_mtbf_s
from runtime.recovery.plan import RestartPlan, RestartRequest, grow_target, plan_restart
from runtime.scheduling.placement import FreeDevice
from runtime.worker.cli import EXIT_BAD_CONFIG

log = logging.getLogger(__name__)


def job_key(job: TrainingJob) -> str:
    """The job's name across its attempts (``services.run_key`` without the attempt)."""
    return f"job-{job.pk}-{job.created_at:%Y%m%d%H%M%S%f}"


def checkpoint_url(job: TrainingJob) -> str:
    """Where the job's checkpoints live: one store per job, shared by all its attempts."""
    base = settings.POLYCHIP_CHECKPOINT_URL.rstrip("/")
    if base.startswith("s3://"):
        bucket_and_prefix, _, query = base.partition("?")
        return f"{bucket_and_prefix}/{job_key(job)}" + (f"?{query}" if query else "")
    return f"{base}/{job_key(job)}"


def _spec_sizes(job: TrainingJob) -> tuple[int, int, int]:
    spec = job.spec if isinstance(job.spec, dict) else {}
    devices = int(spec.get("devices", 1))
    min_devices = int(spec.get("min_devices") or devices)
    max_restarts = int(spec.get("max_restarts", 3))
    return devices, min_devices, max_restarts


def _describe_failure(reason: str, device: str | None) -> str:
    first = reason.splitlines()[0] if reason else "the run failed"
    return f"{first} (device {device})" if device else first


# --- failures ---------------------------------------------------------------------------------


def handle_failure(job_id: int, attempt: int, observation: Observation | None, *, reason: str = "") -> str:
    """A running attempt failed: restart it elsewhere, or end the job ``failed`` if it may not."""
    from jobs import services

    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is None or job.state != JobState.RUNNING or job.attempt != attempt:
        return job.state if job else ""
    failure = observation.failure if observation is not None else None
    reason = reason or (observation.reason if observation is not None else "") or "the run failed"
    observed_at = time.time()
    handle = job.backend_handle
    torn_down = _teardown(handle)
    with transaction.atomic():
        locked = _lock_job(job_id, JobState.RUNNING, attempt)
        if isinstance(locked, str):
            return locked
        job, allocations = locked
        _, _, max_restarts = _spec_sizes(job)
        by_rank = {a.rank: a.device for a in allocations}
        device = by_rank.get(failure.rank) if failure is not None else None
        what = _describe_failure(reason, device.device_id if device else None)
        recoverable = failure is None or failure.exit_code != EXIT_BAD_CONFIG
        if not recoverable or job.restarts >= max_restarts:
            why = (
                what
                if not recoverable
                else f"{what}; gave up after {job.restarts} restart(s) (max_restarts {max_restarts})"
            )
            services.finish_job(job_id, JobState.FAILED, reason=why, from_states=[JobState.RUNNING], attempt=attempt)
            return JobState.FAILED
        detect_s = round(observed_at - failure.detected_at, 3) if failure is not None else None
        services._record(
            job,
            kind=JobEvent.Kind.RECOVERY,
            message=f"failure detected: {what}"[:500],
            data={
                "failure": {
                    "rank": failure.rank if failure else None,
                    "cause": failure.cause if failure else "silent",
                    "device": device.device_id if device else None,
                    "detected_at": failure.detected_at if failure else observed_at,
                    "observed_at": observed_at,
                    "observed_after_s": detect_s,
                    "device_suspect": bool(failure and failure.device_suspect),
                },
                "restart": job.restarts + 1,
                "max_restarts": max_restarts,
            },
        )
        failed_ids: frozenset[str] = frozenset()
        if failure is not None and failure.device_suspect and device is not None:
            services.set_device_health([device.device_id], DeviceHealth.FAILED, by="recovery")
            failed_ids = frozenset({device.device_id})
            services._record(
                job,
                kind=JobEvent.Kind.RECOVERY,
                message=f"device {device.device_id} marked failed: nothing runs there until an operator returns it",
                data={"device_failed": device.device_id},
            )
        previous = tuple(admission_free_device(a.device) for a in allocations)
        recovery = dict(job.recovery)
        recovery["last_failure"] = {
            "detected_at": failure.detected_at if failure else observed_at,
            "cause": failure.cause if failure else "silent",
            "rank": failure.rank if failure else None,
            "device": device.device_id if device else None,
            "reason": what[:300],
            "steps_reported": job.steps_done,
        }
        frozen = _freeze(
            job,
            previous,
            message=f"frozen after a failure; restart {job.restarts + 1} of at most {max_restarts}",
            restarts=job.restarts + 1,
            recovery=recovery,
            teardowns=[] if torn_down or not handle else [handle],
        )
        if frozen is None:
            return TrainingJob.objects.values_list("state", flat=True).get(pk=job_id)
        _reallocate(frozen, previous, failed_ids)
    return TrainingJob.objects.values_list("state", flat=True).get(pk=job_id)


def handle_stop(job_id: int, attempt: int) -> str:
    """The attempt's ranks saved a full checkpoint and stopped on request: move the job."""
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is None or job.state != JobState.RUNNING or job.attempt != attempt:
        return job.state if job else ""
    handle = job.backend_handle
    torn_down = _teardown(handle)
    with transaction.atomic():
        locked = _lock_job(job_id, JobState.RUNNING, attempt)
        if isinstance(locked, str):
            return locked
        job, allocations = locked
        previous = tuple(admission_free_device(a.device) for a in allocations)
        reason = job.stop_requested or "stopped on request"
        frozen = _freeze(
            job,
            previous,
            message=f"checkpointed and stopped: {reason}"[:500],
            teardowns=[] if torn_down or not handle else [handle],
        )
        if frozen is not None:
            _reallocate(frozen, previous, frozenset())
    return TrainingJob.objects.values_list("state", flat=True).get(pk=job_id)


def _lock_job(job_id: int, state: str, attempt: int | None = None) -> tuple[TrainingJob, list[Allocation]] | str:
    """Under the admission lock (taken first, as admission takes it), the job's row locked and still
    in ``state`` (and at ``attempt``), with its open allocations in rank order; else its state now."""
    _take_admission_lock()
    job = TrainingJob.objects.select_for_update().get(pk=job_id)
    if job.state != state or (attempt is not None and job.attempt != attempt):
        return job.state
    held = job.allocations.filter(ended_at__isnull=True).select_related("device__node", "device__flavor")
    return job, list(held.order_by("rank"))


def _teardown(handle: dict[str, Any] | None) -> bool:
    """Stop what is left of a run (ranks that lost their peer, the store's process) before its devices
    are handed out again; False when it could not be confirmed (the sweep retries it, and the
    devices wait for it)."""
    if not handle:
        return True
    try:
        get_backend().teardown(handle)
        return True
    except Exception:
        log.exception("tearing down %s failed; the sweep retries it", handle)
        return False


def _take_admission_lock() -> None:
    from jobs.admission import _lock

    _lock(wait=True)


def _freeze(job: TrainingJob, previous: tuple[FreeDevice, ...], *, message: str, **fields: Any) -> TrainingJob | None:
    """RUNNING → RECOVERING as the next attempt, in the caller's transaction with the row locked:
    its allocations end (and are metered), and news of the old attempt can no longer move it."""
    from jobs import services

    recovery = dict(fields.pop("recovery", job.recovery))
    recovery["previous_devices"] = [d.device_id for d in previous]
    recovery["frozen_at"] = time.time()
    teardowns = [*job.pending_teardowns, *(h for h in fields.pop("teardowns", []) if h not in job.pending_teardowns)]
    frozen = services.claim_transition(
        job.pk,
        [JobState.RUNNING],
        JobState.RECOVERING,
        attempt=job.attempt,
        next_attempt=True,
        message=message[:500],
        data={"attempt": job.attempt + 1},
        provision_claimed_at=None,
        backend_handle=None,
        rank_stats={},
        samples_per_s=None,
        # Whatever move was asked of the old attempt is done with it (a failure may have come first).
        stop_requested="",
        pending_teardowns=teardowns,
        recovery=recovery,
        **fields,
    )
    if frozen is not None:
        services.end_allocations(frozen, timezone.now())
    return frozen


def _reallocate(job: TrainingJob, previous: tuple[FreeDevice, ...], failed: frozenset[str]) -> RestartPlan | None:
    """Give a RECOVERING job its next devices and launch it; or leave it waiting, with the reason.

    Runs in the caller's transaction, under the admission lock."""
    from jobs import admission, services, tasks

    devices, min_devices, _ = _spec_sizes(job)
    flavors = tuple(job.spec.get("flavors") or ())
    free = admission._free_devices()
    request = RestartRequest(
        devices=devices, min_devices=min_devices, flavors=flavors, previous=previous, failed=failed
    )
    plan = plan_restart(request, free, distance=services.pool_fabric().hops)
    if plan is None:
        usable = sum(1 for d in free if d.flavor in flavors)
        waiting = (f"waiting for devices: needs at least {min_devices} of {', '.join(flavors)}; {usable} free")[:500]
        if job.pending_reason != waiting:
            TrainingJob.objects.filter(pk=job.pk).update(pending_reason=waiting)
            services._record(job, kind=JobEvent.Kind.RECOVERY, message=waiting, data={"waiting": True})
        return None
    now = timezone.now()
    rates = admission.throughput_matrix().rates({job.job_class})
    admitted = services.claim_transition(
        job.pk,
        [JobState.RECOVERING],
        JobState.ADMITTED,
        attempt=job.attempt,
        message=f"reallocated {plan.describe()}"[:500],
        data={
            "devices": [d.device_id for d in plan.devices],
            "flavors": [d.flavor for d in plan.devices],
            "kept": plan.kept,
            "same_flavor": plan.same_flavor,
            "other_flavor": plan.other_flavor,
            "shrunk_by": plan.shrunk_by,
        },
        admitted_at=now,
        pending_reason="",
        demand=admission._charge(job.job_class, plan.devices, rates),
    )
    if admitted is None:
        return None
    by_id = {d.device_id: d for d in Device.objects.filter(device_id__in=[d.device_id for d in plan.devices])}
    Allocation.objects.bulk_create(
        Allocation(job=job, device=by_id[d.device_id], rank=rank, started_at=now) for rank, d in enumerate(plan.devices)
    )
    transaction.on_commit(lambda: tasks.provision_job.delay(job.pk), robust=True)
    return plan


def place_again_if_unschedulable(job_id: int) -> bool:
    """Before a launch: if a device of the admitted job was cordoned or failed since admission (a drain
    only moves running jobs), give the job other devices instead. True when it was placed again (or
    now waits for devices)."""
    from jobs import services

    with transaction.atomic():
        locked = _lock_job(job_id, JobState.ADMITTED)
        if isinstance(locked, str):
            return False
        job, allocations = locked
        lost = [a.device.device_id for a in allocations if a.device.health not in SCHEDULABLE]
        if not lost:
            return False
        previous = tuple(admission_free_device(a.device) for a in allocations if a.device.device_id not in lost)
        moved = services.claim_transition(
            job_id,
            [JobState.ADMITTED],
            JobState.RECOVERING,
            attempt=job.attempt,
            message=f"not launched: {', '.join(lost)} cordoned or failed since admission; placing it again"[:500],
            data={"unschedulable": lost},
            provision_claimed_at=None,
        )
        if moved is None:
            return False
        services.end_allocations(moved, timezone.now())
        _reallocate(moved, previous, frozenset(lost))
    return True


SCHEDULABLE = (DeviceHealth.HEALTHY, DeviceHealth.DEGRADED)


def recovering_job_ids() -> list[int]:
    return list(TrainingJob.objects.filter(state=JobState.RECOVERING).values_list("pk", flat=True))


def retry_recovering(job_id: int) -> bool:
    """Try again to give a job that waits for devices its next attempt (the sweep calls this)."""
    with transaction.atomic():
        _take_admission_lock()
        job = TrainingJob.objects.select_for_update().filter(pk=job_id, state=JobState.RECOVERING).first()
        if job is None or job.allocations.filter(ended_at__isnull=True).exists():
            return False
        ids = list((job.recovery or {}).get("previous_devices") or [])
        devices = {d.device_id: d for d in Device.objects.filter(device_id__in=ids).select_related("node", "flavor")}
        previous = tuple(admission_free_device(devices[i]) for i in ids if i in devices)
        return _reallocate(job, previous, frozenset()) is not None


# --- moving healthy jobs ------------------------------------------------------------------------


def request_move(job_id: int, reason: str) -> bool:
    """Ask a running job to checkpoint and stop so that it can move (a drain, growing back, a
    predicted failure). False when it is not running or already asked."""
    from jobs import services

    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().filter(pk=job_id).first()
        if job is None or job.state != JobState.RUNNING or job.stop_requested or not job.backend_handle:
            return False
        job.stop_requested = reason[:300]
        job.save(update_fields=["stop_requested"])
        services._record(
            job,
            kind=JobEvent.Kind.RECOVERY,
            message=f"asked to checkpoint and move: {reason}"[:500],
            data={"stop_requested": reason[:300]},
        )
        handle = job.backend_handle
        transaction.on_commit(lambda: get_backend().request_stop(handle, reason), robust=True)
    return True


def drain_node(node: str, *, by: str = "") -> list[int]:
    """Cordon a node's devices and move its jobs off it, each after a checkpoint; the moved job ids."""
    from jobs import services

    ids = list(Device.objects.filter(node__name=node).values_list("device_id", flat=True))
    if not ids:
        raise services.UnknownDevices(f"node: no such node {node!r} (or it has no devices)")
    who = f" by {by}" if by else ""
    return _drain(ids, f"node {node} drained{who}", by=by or "drain")


def _drain(device_ids: list[str], reason: str, *, by: str) -> list[int]:
    """Cordon devices and ask every running job on them to checkpoint and move."""
    from jobs import services

    services.set_device_health(device_ids, DeviceHealth.CORDONED, by=by)
    job_ids = (
        Allocation.objects.filter(ended_at__isnull=True, device__device_id__in=device_ids, job__state=JobState.RUNNING)
        .values_list("job_id", flat=True)
        .distinct()
    )
    return [job_id for job_id in sorted(job_ids) if request_move(job_id, reason)]


def shrunk_job_ids() -> list[int]:
    """Running jobs on fewer devices than they asked for (after a recovery that shrank them)."""
    held = Count("allocations", filter=Q(allocations__ended_at__isnull=True))
    running = TrainingJob.objects.filter(state=JobState.RUNNING, stop_requested="").annotate(held=held)
    return [job.pk for job in running.only("pk", "spec") if job.held < _spec_sizes(job)[0]]


def grow_back(job_id: int) -> bool:
    """Ask a shrunk job to move to more devices once the pool has them again."""
    from jobs import admission

    job = TrainingJob.objects.filter(pk=job_id, state=JobState.RUNNING, stop_requested="").first()
    if job is None:
        return False
    devices, _, _ = _spec_sizes(job)
    current = job.allocations.filter(ended_at__isnull=True).count()
    flavors = set(job.spec.get("flavors") or ())
    free = sum(1 for d in admission._free_devices() if d.flavor in flavors and not d.degraded)
    target = grow_target(current, devices, free)
    if target is None:
        return False
    return request_move(job_id, f"growing back from {current} to {target} devices ({free} free again)")


# --- what the worker reports ------------------------------------------------------------------


def fold_event(job: TrainingJob, kind: str, ts: float, data: dict[str, Any]) -> bool:
    """Fold a recovery telemetry event of rank 0 into the job; True when the job changed."""
    from jobs import services

    recovery = job.recovery
    if kind == "checkpoint":
        saves = recovery.setdefault("checkpoints", {"count": 0, "stall_ms_sum": 0.0, "write_ms_sum": 0.0})
        saves["count"] += 1
        saves["stall_ms_sum"] += data.get("stall_ms") or 0.0
        saves["write_ms_sum"] += data.get("write_ms") or 0.0
        saves["latest"] = {"ts": ts, **data}
        return True
    if kind == "restored":
        recovery["restored"] = {"ts": ts, **data}
        step = int(data.get("step") or 0)
        job.steps_done = step  # progress goes back to the checkpoint; the steps after it are redone
        skipped = data.get("skipped") or []
        note = f"; skipped {len(skipped)} unusable checkpoint(s)" if skipped else ""
        optimizer = data.get("optimizer_step")
        services._record(
            job,
            kind=JobEvent.Kind.RECOVERY,
            message=(
                f"restored step {step} on {data.get('world_size')} rank(s) (saved on {data.get('saved_world_size')}); "
                f"optimizer state from step {optimizer if optimizer is not None else '- (fresh)'}{note}"
            )[:500],
            data={"restored": data},
        )
        return True
    if kind == "resumed":
        resumed = {"ts": ts, **data}
        after = ""
        if recovery.get("frozen_at"):
            resumed["since_frozen_s"] = round(ts - float(recovery["frozen_at"]), 3)
            after = f", {resumed['since_frozen_s']:.1f} s after the job was frozen"
        recovery["resumed"] = resumed
        services._record(
            job,
            kind=JobEvent.Kind.RECOVERY,
            message=f"training continues at step {data.get('step')}{after}",
            data={"resumed": resumed},
        )
        return True
    return False


# --- what the job detail shows ----------------------------------------------------------------


_RATE_CACHE: dict[str, Any] = {}
RATE_CACHE_S = 60.0


def pool_failure_rate() -> tuple[float, str]:
    """``failures_per_device_hour``, recomputed at most once a minute (every job view shows it)."""
    cached = _RATE_CACHE.get("rate")
    if cached is None or time.monotonic() - cached[0] > RATE_CACHE_S:
        cached = (time.monotonic(), failures_per_device_hour())
        _RATE_CACHE["rate"] = cached
    return cached[1]


def failures_per_device_hour(now: Any = None, window: timedelta = timedelta(days=30)) -> tuple[float, str]:
    """The pool's measured failure rate, with where it came from: failures that marked a device
    failed over the device-hours run in the window; the configured prior until 100 device-hours
    of history exist."""
    now = now or timezone.now()
    since = now - window
    rows = Allocation.objects.filter(Q(ended_at__isnull=True) | Q(ended_at__gte=since)).values_list(
        "started_at", "ended_at"
    )
    hours = sum(((end or now) - max(start, since)).total_seconds() for start, end in rows) / 3600.0
    failures = JobEvent.objects.filter(created_at__gte=since, data__has_key="device_failed").count()
    prior = settings.POLYCHIP_DEVICE_FAILURES_PER_HOUR
    if hours < 100.0:
        return (
            prior,
            f"the configured prior of {prior:g} failures per device-hour ({hours:.0f} device-hours seen so far)",
        )
    return (
        failures / hours,
        f"{failures} device failure(s) in {hours:.0f} device-hours over the last {window.days} days",
    )


def recovery_view(job: TrainingJob) -> dict[str, Any]:
    """Recovery as the API and portal show it: the checkpoint policy, restarts, the last failure and
    restore, and the interval advisor's suggestion with its reasoning."""
    devices, min_devices, max_restarts = _spec_sizes(job)
    spec = job.spec if isinstance(job.spec, dict) else {}
    policy: dict[str, Any] | None
    try:
        policy = parse_checkpoint(spec.get("checkpoint")).to_json()
    except ValueError:  # a spec stored before checkpoints were checked the way they are now
        policy = None
    stored = job.recovery or {}
    saves = stored.get("checkpoints") or {}
    count = saves.get("count") or 0
    checkpoints = None
    if count:
        latest = saves.get("latest") or {}
        checkpoints = {
            "count": count,
            "latest_step": latest.get("step"),
            "latest_kind": latest.get("checkpoint_kind"),
            "bytes": latest.get("bytes"),
            "stall_ms_avg": round(saves["stall_ms_sum"] / count, 3),
            "write_ms_avg": round(saves["write_ms_sum"] / count, 3),
            "background": latest.get("background"),
        }
    return {
        "checkpoint": policy,
        "restarts": job.restarts,
        "max_restarts": max_restarts,
        "devices": devices,
        "min_devices": min_devices,
        "stop_requested": job.stop_requested or None,
        "checkpoints": checkpoints,
        "last_failure": stored.get("last_failure"),
        "restored": stored.get("restored"),
        "resumed": stored.get("resumed"),
        "advice": _advice(job, checkpoints, devices),
    }


def _advice(job: TrainingJob, checkpoints: dict[str, Any] | None, devices: int) -> dict[str, Any] | None:
    """Young/Daly intervals from this job's measured checkpoint cost and step time and the pool's
    failure rate; None until the job has saved a checkpoint and reported its step time."""
    step_time = None
    rank0 = (job.rank_stats or {}).get("0") or {}
    if rank0.get("step_time_s"):
        step_time = float(rank0["step_time_s"])
    elif job.samples_per_s and isinstance(job.spec, dict):
        step_time = float(job.spec.get("workload", {}).get("global_batch", 96)) / job.samples_per_s
    if checkpoints is None or not step_time:
        return None
    rate, source = pool_failure_rate()
    cost_s = max(checkpoints["stall_ms_avg"], 0.001) / 1000.0
    advice = advise(cost_s, job_mtbf_s(devices, rate), step_time)
    return {**advice.to_json(), "failure_rate_source": source}


# --- failure prediction -----------------------------------------------------------------------


# A device is drained after this many consecutive alerting scores, not one: on held-out synthetic
# histories one alert at the best-F1 threshold fires on healthy devices about ten times as often as three
# in a row, which still warn of about half the failures (bench/recovery.py, "alert persistence").
ALERT_STREAK = 3
# A device is scored once it has this many new rows (minutes) of readings: the cadence the bench assumes.
SCORE_EVERY_ROWS = 5


def score_devices() -> list[str]:
    """Score every device with fresh health readings; drain those predicted to fail within the
    horizon (their jobs checkpoint first, then move). Returns the device ids drained."""
    from jobs.predictor import load_predictor

    predictor = load_predictor()
    if predictor is None:
        return []
    fresh = Device.objects.filter(
        health__in=(DeviceHealth.HEALTHY, DeviceHealth.DEGRADED), unscored_rows__gte=SCORE_EVERY_ROWS
    )
    drained = []
    for device in fresh.only("pk", "device_id", "health_readings", "alert_streak"):
        window = device.health_readings[-predictor.window_min :]
        if len(window) < predictor.window_min:
            continue
        score = predictor.score(window)
        streak = device.alert_streak + 1 if score >= predictor.threshold else 0
        Device.objects.filter(pk=device.pk).update(
            failure_score=score, scored_at=timezone.now(), alert_streak=streak, unscored_rows=0
        )
        if streak >= ALERT_STREAK:
            drain_device(
                device.device_id,
                reason=(
                    f"failure predicted within {predictor.horizon_min} min "
                    f"({streak} scores in a row >= threshold {predictor.threshold:.2f}, the last {score:.2f})"
                ),
            )
            drained.append(device.device_id)
    return drained


def drain_device(device_id: str, *, reason: str) -> list[int]:
    """Cordon one device and move the jobs that run on it, each after a checkpoint; the moved job ids."""
    log.warning("device %s drained: %s", device_id, reason)
    return _drain([device_id], f"device {device_id}: {reason}", by=reason)
