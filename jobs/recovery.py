"""Recovery: failure detected → job frozen → devices reallocated → state restored → training continues.

No person takes part. The observe sweep (``lifecycle.observe_job``) hands this module what the
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

Quotas hold through all of it: the next attempt takes only what its tenant's quota has room for now
(its own last attempt released, as admission counts it), shrinking toward ``min_devices`` if need
be, and is marked borrowing when it takes its tenant above nominal, so that reclaim can find it. A
shrunk job grows back only into that room, and not while a queued job could start on the free devices
or on those being released.

Every step is an event on the job. Devices are chosen under the admission lock, as admission does,
so a cycle running at the same time never hands out the same device.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, Q, QuerySet
from django.utils import timezone

from jobs import dispatch, locks, throughput, transitions
from jobs.backends import get_backend
from jobs.finishing import finish_job
from jobs.metering import charge, end_allocations, open_allocations
from jobs.models import Allocation, Device, DeviceHealth, JobAttempt, JobEvent, JobState, TrainingJob
from jobs.moving import request_move
from jobs.pool import (
    SCHEDULABLE,
    as_free_device,
    free_and_releasing_devices,
    free_devices,
    pool_fabric,
    set_device_health,
)
from jobs.snapshot import holding_jobs, pending_jobs, tenant_quotas
from jobs.throughput import nau_rates
from runtime.backends.base import DISRUPTION, NODE_LOST, Failure, Observation
from runtime.recovery.plan import RestartPlan, RestartRequest, grow_target, plan_restart, worth_growing
from runtime.scheduling import QuotaLedger
from runtime.scheduling.placement import FreeDevice
from runtime.worker.cli import EXIT_BAD_CONFIG

log = logging.getLogger(__name__)


# A move's cost is the median of this many recent restarts of the job's class.
MOVE_COST_JOBS = 20


def _describe_failure(reason: str, device: str | None) -> str:
    first = reason.splitlines()[0] if reason else "the run failed"
    return f"{first} (device {device})" if device else first


def current_attempt(job: TrainingJob) -> JobAttempt | None:
    return JobAttempt.objects.filter(job_id=job.pk, number=job.attempt).first()


# --- failures ---------------------------------------------------------------------------------


def handle_failure(job_id: int, attempt: int, observation: Observation | None, *, reason: str = "") -> str:
    """A running attempt failed: restart it elsewhere, or end the job ``failed`` if it may not."""
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is None or job.state != JobState.RUNNING or job.attempt != attempt:
        return job.state if job else ""
    failure = observation.failure if observation is not None else None
    reason = reason or (observation.reason if observation is not None else "") or "the run failed"
    observed_at = time.time()
    run = current_attempt(job)
    torn_down = _teardown(run)
    if torn_down and observation is not None and run is not None and run.backend_handle:
        observation = _with_later_failures(observation, get_backend().observe(run.backend_handle))
    with transaction.atomic():
        locked = _lock_job(job_id, JobState.RUNNING, attempt)
        if isinstance(locked, str):
            return locked
        job, allocations = locked
        max_restarts = job.job_spec.max_restarts
        by_rank = {a.rank: a.device for a in allocations}
        device = by_rank.get(failure.rank) if failure is not None else None
        what = _describe_failure(reason, device.device_id if device else None)
        recoverable = failure is None or failure.exit_code != EXIT_BAD_CONFIG
        # Every rank that failed on its own, not only the first.
        observed = (observation.failures if observation is not None else ()) or ((failure,) if failure else ())
        credit = _credit_reason(observed, what)
        # The cluster taking pods away (preemption, eviction, a drain) is nobody's failure: the restart
        # is not counted against max_restarts, like a move the platform asked for.
        counted = not observed or any(seen.cause != DISRUPTION for seen in observed)
        restarts = job.restarts + 1 if counted else job.restarts
        if not recoverable or (counted and job.restarts >= max_restarts):
            why = (
                what
                if not recoverable
                else f"{what}; gave up after {job.restarts} restart(s) (max_restarts {max_restarts})"
            )
            finish_job(
                job_id,
                JobState.FAILED,
                reason=why,
                from_states=[JobState.RUNNING],
                attempt=attempt,
                credit_reason=credit,
            )
            return JobState.FAILED
        detect_s = round(observed_at - failure.detected_at, 3) if failure is not None else None
        transitions.record_event(
            job,
            kind=JobEvent.Kind.RECOVERY,
            message=f"failure detected: {what}",
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
                "restart": restarts,
                "counted": counted,
                "max_restarts": max_restarts,
            },
        )
        failed_ids: frozenset[str] = frozenset()
        # A death after the platform asked this attempt to stop (a move, a drain) is the platform's.
        stopped_by_us = run is not None and run.stop_asked_at is not None
        # Every rank that failed on its own is evidence against its device.
        evidence: dict[str, Failure] = {}
        for seen in observed:
            if seen.device_suspect and seen.rank in by_rank:
                evidence.setdefault(by_rank[seen.rank].device_id, seen)
        if evidence and not stopped_by_us:
            _judge_devices(job, evidence)
            # The next attempt avoids every device with evidence against it, marked failed or not.
            failed_ids = frozenset(evidence)
        previous = tuple(as_free_device(a.device) for a in allocations)
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
            torn_down=torn_down,
            message=(
                f"frozen after a failure; restart {restarts} of at most {max_restarts}"
                if counted
                else "frozen: the cluster took the run's pods away; the restart is not counted"
            ),
            credit_reason=credit,
            restarts=restarts,
            recovery=recovery,
        )
        if frozen is None:
            return TrainingJob.objects.values_list("state", flat=True).get(pk=job_id)
        _reallocate(frozen, previous, failed_ids)
    return TrainingJob.objects.values_list("state", flat=True).get(pk=job_id)


def _credit_reason(observed: tuple[Failure, ...], what: str) -> str:
    """Why the attempt's usage is credited, or "" when the tenant pays for it.

    A device's fault (a rank killed by a signal nobody on the platform sent, a lost heartbeat) or the
    platform losing the run (silence, a run the backend no longer knows) is not the tenant's doing:
    its usage is metered as always and credited. A rank that ended with an error is user code: billed.
    """
    suspects = [seen for seen in observed if seen.device_suspect]
    if suspects:
        return f"a device failed: {'; '.join(_cause_in_words(seen) for seen in suspects)}"[:300]
    if observed and all(seen.cause == DISRUPTION for seen in observed):
        return f"the cluster disrupted the run: {what}"[:300]
    if not observed:
        return f"the platform lost the run: {what}"[:300]
    return ""


# A lost heartbeat counts against a device when another job's failure pointed at it within this long.
SUSPICION_WINDOW_S = 24 * 3600
KEEP_SUSPICIONS = 10


def _cause_in_words(failure: Failure) -> str:
    if failure.cause == "heartbeat":
        return f"rank {failure.rank} sent no heartbeat and was killed"
    if failure.cause == NODE_LOST:
        return f"rank {failure.rank}'s pod was deleted with its node"
    if failure.exit_code is not None and failure.exit_code < 0:
        try:
            name = signal.Signals(-failure.exit_code).name
        except ValueError:
            name = f"signal {-failure.exit_code}"
        return f"rank {failure.rank} was killed by {name}"
    return f"rank {failure.rank} failed ({failure.cause})"


def _judge_devices(job: TrainingJob, evidence: dict[str, Failure]) -> None:
    """Mark failed the devices the evidence is about; a lost heartbeat alone only makes a suspect.

    A rank killed by a signal nobody on the platform sent (the device or its host went away) marks
    its device failed. A lost heartbeat is evidence about the rank, not yet about the device (user
    code that wedged, a starved host): it marks the device failed only when another job's failure
    pointed there within a day, or the device's own readings alert (``health``); otherwise the
    device is a suspect, recorded with the cause in words, and the job's next attempt avoids it.
    """
    now = time.time()
    failed: list[str] = []
    for device in locks.devices(Device.objects.filter(device_id__in=sorted(evidence))):
        seen = evidence[device.device_id]
        cause = _cause_in_words(seen)
        others = [
            s
            for s in device.suspicions
            if isinstance(s, dict) and s.get("job") != job.pk and now - float(s.get("at", 0)) <= SUSPICION_WINDOW_S
        ]
        # Only a kill by a signal is proof by itself; a lost heartbeat or a lost node (the taint manager
        # and the pod GC also act on an operator's taint or a scaled-down node) needs corroboration.
        if seen.cause not in ("heartbeat", NODE_LOST):
            why = cause
        elif others:
            why = f"{cause}; job {others[-1]['job']} failed there too ({others[-1]['cause']})"
        elif device.alert_streak > 0:
            why = f"{cause}; its own readings alert (failure score {device.failure_score or 0:.2f})"
        else:
            why = ""
        device.suspicions = [*device.suspicions, {"job": job.pk, "at": now, "cause": cause}][-KEEP_SUSPICIONS:]
        device.save(update_fields=["suspicions"])
        if why:
            failed.append(device.device_id)
            message = f"device {device.device_id} marked failed: {why}; nothing runs there until an operator returns it"
            data: dict[str, object] = {"device_failed": device.device_id, "cause": why}
        else:
            message = (
                f"device {device.device_id} suspected: {cause}; one job's "
                f"{'lost node' if seen.cause == NODE_LOST else 'lost heartbeat'} does not mark a device failed "
                "(its readings are normal), but another job's failure there will; this job's next attempt avoids it"
            )
            data = {"device_suspected": device.device_id, "cause": cause}
        transitions.record_event(job, kind=JobEvent.Kind.RECOVERY, message=message, data=data)
    if failed:
        set_device_health(failed, DeviceHealth.FAILED, by="recovery")


def handle_stop(job_id: int, attempt: int) -> str:
    """The attempt's ranks saved a full checkpoint and stopped on request: move the job."""
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is None or job.state != JobState.RUNNING or job.attempt != attempt:
        return job.state if job else ""
    run = current_attempt(job)
    torn_down = _teardown(run)
    with transaction.atomic():
        locked = _lock_job(job_id, JobState.RUNNING, attempt)
        if isinstance(locked, str):
            return locked
        job, allocations = locked
        previous = tuple(as_free_device(a.device) for a in allocations)
        reason = (run.stop_requested if run else "") or "stopped on request"
        frozen = _freeze(job, previous, torn_down=torn_down, message=f"checkpointed and stopped: {reason}")
        if frozen is not None:
            _reallocate(frozen, previous, frozenset())
    return TrainingJob.objects.values_list("state", flat=True).get(pk=job_id)


def _lock_job(job_id: int, state: str, attempt: int | None = None) -> tuple[TrainingJob, list[Allocation]] | str:
    """Under the admission lock (taken first, as admission takes it), the job's row locked and still
    in ``state`` (and at ``attempt``), with its open allocations in rank order; else its state now."""
    dispatch.admit_requests_left_to_this_transaction()
    locks.admission_lock(wait=True)
    job = locks.job(job_id)
    if job is None:
        return ""
    if job.state != state or (attempt is not None and job.attempt != attempt):
        return job.state
    held = job.allocations.filter(ended_at__isnull=True).select_related("device__node", "device__flavor")
    return job, list(held.order_by("rank"))


def _with_later_failures(first: Observation, last: Observation) -> Observation:
    """``first`` with the failures of the same run that only its last word has: ranks killed at the
    same moment die one by one as the kernel gets to them, and a loaded host can show the backend
    the first death a poll before the second; the run's final status has them all."""
    seen = {failure.rank for failure in first.failures}
    later = tuple(failure for failure in last.failures if failure.rank not in seen)
    if not later:
        return first
    return dataclasses.replace(first, failures=first.failures + later, failure=first.failure or later[0])


def _teardown(run: JobAttempt | None) -> bool:
    """Stop what is left of a run (ranks that lost their peer, the store's process) before its devices
    are handed out again; False when it could not be confirmed (the sweep retries it, and the
    devices wait for it)."""
    if run is None or not run.backend_handle:
        return True
    try:
        get_backend().teardown(run.backend_handle)
        return True
    except Exception:
        log.exception("tearing down %s failed; the sweep retries it", run.backend_handle)
        return False


def _freeze(
    job: TrainingJob,
    previous: tuple[FreeDevice, ...],
    *,
    torn_down: bool,
    message: str,
    credit_reason: str = "",
    **fields: Any,
) -> TrainingJob | None:
    """RUNNING -> RECOVERING as the next attempt, in the caller's transaction with the row locked:
    its allocations end (and are metered), and news of the old attempt can no longer move it. The
    old attempt's run is marked gone when ``torn_down``; else the sweep tears it down."""
    number = job.attempt
    frozen = transitions.claim(
        job.pk,
        JobState.RECOVERING,
        from_states=[JobState.RUNNING],
        attempt=number,
        next_attempt=True,
        previous_devices=[d.device_id for d in previous],
        message=message,
        data={"attempt": number + 1},
        rank_stats={},
        balance_stats={},
        comm_stats={},
        samples_per_s=None,
        **fields,
    )
    if frozen is not None:
        if torn_down:
            JobAttempt.objects.filter(job_id=job.pk, number=number, torn_down_at__isnull=True).update(
                torn_down_at=timezone.now()
            )
        end_allocations(frozen, timezone.now(), credit_reason=credit_reason)
    return frozen


def quota_ledger(
    job_classes: set[str], *, without: int | None = None
) -> tuple[QuotaLedger, dict[tuple[str, str], int]]:
    """Every tenant's quota and what the jobs holding devices (but ``without``) use of it now, as admission
    sees them."""
    rates = nau_rates(job_classes)
    holding = [h for h in holding_jobs(rates) if h.job_id != without]
    return QuotaLedger(tenant_quotas(), holding), rates


def _within_quota(
    free: Sequence[FreeDevice],
    previous: Sequence[FreeDevice],
    flavors: Sequence[str],
    room: Callable[[str], int | None],
) -> list[FreeDevice]:
    """The free devices cut, per flavor, to what the quota has room for; the last attempt's first."""
    kept = {d.device_id for d in previous}
    ordered = sorted(free, key=lambda d: d.device_id not in kept)  # stable: the pool's order otherwise
    left = {flavor: room(flavor) for flavor in flavors}
    out = []
    for device in ordered:
        limit = left.get(device.flavor)
        if device.flavor in left and limit is None:
            out.append(device)
        elif limit:
            out.append(device)
            left[device.flavor] = limit - 1
    return out


def _reallocate(job: TrainingJob, previous: tuple[FreeDevice, ...], failed: frozenset[str]) -> RestartPlan | None:
    """Give a RECOVERING job its next devices and launch it; or leave it waiting, with the reason.
    The count that the attempt before asked for when it was asked to move (an elastic resize,
    ``request_move(resize_to=)``) is the most it is given, within its range, however that attempt ended
    and however often the placement is tried again; the flavors it was moved to (``resize_flavors``)
    are tried first, and the job's own flavors when those are not free any more.

    Runs in the caller's transaction, under the admission lock."""
    spec = job.job_spec
    min_devices = spec.min_devices or spec.devices
    asked = JobAttempt.objects.filter(job_id=job.pk, number=job.attempt - 1).values_list("resize_to", "resize_flavors")
    resize_to, resize_flavors = asked.first() or (None, None)
    devices = spec.devices if resize_to is None else max(min_devices, min(spec.devices, resize_to))
    ledger, rates = quota_ledger({job.job_class})
    pool_free = free_devices()

    def place(flavors: tuple[str, ...]) -> tuple[RestartPlan | None, str | None, int]:
        """The plan on ``flavors``; the NAU quota's refusal when it cut the plan away; the devices within quota."""
        free = _within_quota(pool_free, previous, flavors, lambda f: ledger.headroom(job.tenant_id, f))
        count, refused = devices, None
        # The per-flavor cut above cannot see the NAU quota: give a device back until that fits too.
        while count >= min_devices:
            request = RestartRequest(
                devices=count, min_devices=min_devices, flavors=flavors, previous=previous, failed=failed
            )
            plan = plan_restart(request, free, distance=pool_fabric())
            if plan is None:
                break
            refused = ledger.fits(job.tenant_id, charge(job.job_class, plan.devices, rates))
            if not refused:
                return plan, None, len(free)
            count = len(plan.devices) - 1
        return None, refused, len(free)

    plan = None
    moved_to = tuple(f for f in resize_flavors or () if f in spec.flavors)
    if moved_to:
        plan, _, _ = place(moved_to)
    if plan is None:
        plan, refused, within = place(spec.flavors)
    if plan is None:
        usable = sum(1 for d in pool_free if d.flavor in spec.flavors)
        waiting = f"waiting for devices: needs at least {min_devices} of {', '.join(spec.flavors)}; {usable} free"
        if refused or within < usable:
            waiting += f", {within} of them within the tenant's quota" + (f" ({refused})" if refused else "")
        waiting = waiting[:500]
        if job.pending_reason != waiting:
            TrainingJob.objects.filter(pk=job.pk).update(pending_reason=waiting)
            transitions.record_event(job, kind=JobEvent.Kind.RECOVERY, message=waiting, data={"waiting": True})
        return None
    demand = charge(job.job_class, plan.devices, rates)
    now = timezone.now()
    admitted = transitions.claim(
        job.pk,
        JobState.ADMITTED,
        from_states=[JobState.RECOVERING],
        attempt=job.attempt,
        message=f"reallocated {plan.describe()}",
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
        demand=demand,
        borrowing=ledger.would_borrow(job.tenant_id, demand),
    )
    if admitted is None:
        return None
    open_allocations({job.pk: [d.device_id for d in plan.devices]}, now)
    dispatch.after_commit(dispatch.PROVISION, job.pk)
    if len(plan.devices) < len(previous):
        # It gave devices back (a shrink, often for a queued job that made room): a cycle may start someone.
        dispatch.after_commit(dispatch.ADMIT)
    return plan


def place_again_if_unschedulable(job_id: int) -> bool:
    """Before a launch: if a device of the admitted job was cordoned or failed since admission (a drain
    only moves running jobs), give the job other devices instead. True when it was placed again (or
    now waits for devices)."""
    with transaction.atomic():
        locked = _lock_job(job_id, JobState.ADMITTED)
        if isinstance(locked, str):
            return False
        job, allocations = locked
        lost = [a.device.device_id for a in allocations if a.device.health not in SCHEDULABLE]
        if not lost:
            return False
        previous = tuple(as_free_device(a.device) for a in allocations if a.device.device_id not in lost)
        moved = transitions.claim(
            job_id,
            JobState.RECOVERING,
            from_states=[JobState.ADMITTED],
            attempt=job.attempt,
            message=f"not launched: {', '.join(lost)} cordoned or failed since admission; placing it again",
            data={"unschedulable": lost},
        )
        if moved is None:
            return False
        JobAttempt.objects.filter(job_id=job_id, number=job.attempt).update(provision_claimed_at=None)
        end_allocations(moved, timezone.now())
        _reallocate(moved, previous, frozenset(lost))
    return True


def recovering_job_ids() -> list[int]:
    return list(TrainingJob.objects.filter(state=JobState.RECOVERING).values_list("pk", flat=True))


def retry_recovering(job_id: int) -> bool:
    """Try again to give a job that waits for devices its next attempt (the sweep calls this)."""
    with transaction.atomic():
        locked = _lock_job(job_id, JobState.RECOVERING)
        if isinstance(locked, str):
            return False
        job, held = locked
        if held:
            return False
        run = current_attempt(job)
        ids = list(run.previous_devices) if run is not None else []
        devices = {d.device_id: d for d in Device.objects.filter(device_id__in=ids).select_related("node", "flavor")}
        previous = tuple(as_free_device(devices[i]) for i in ids if i in devices)
        return _reallocate(job, previous, frozenset()) is not None


# --- moving healthy jobs ------------------------------------------------------------------------


def running_not_moving() -> QuerySet[TrainingJob]:
    """Running jobs whose current attempt has not been asked to move."""
    moving = (
        JobAttempt.objects.filter(job__state=JobState.RUNNING, number=F("job__attempt"))
        .exclude(stop_requested="")
        .values("job_id")
    )
    return TrainingJob.objects.filter(state=JobState.RUNNING).exclude(pk__in=moving)


def shrunk_job_ids() -> list[int]:
    """Running jobs on fewer devices than they asked for (after a recovery that shrank them), and
    not already asked to move. While the elastic round runs, elastic jobs are its to resize
    (``jobs.resizing``): growing one back every sweep would undo the round's shrinks."""
    held = Count("allocations", filter=Q(allocations__ended_at__isnull=True), distinct=True)
    running = running_not_moving().annotate(held=held)
    rounds = settings.POLYCHIP_ELASTIC_ROUND_S > 0
    return [
        job.pk
        for job in running.only("pk", "spec")
        if job.held < job.job_spec.devices and not (rounds and job.job_spec.elastic)
    ]


def move_cost_s(job_class: str) -> float:
    """What a move costs a job of the class, from the frozen-to-training times that its recent restarts
    measured (their median); the setting until some did."""
    recent = (
        TrainingJob.objects.filter(job_class=job_class, recovery__resumed__since_frozen_s__isnull=False)
        .order_by("-pk")
        .values_list("recovery__resumed__since_frozen_s", flat=True)[:MOVE_COST_JOBS]
    )
    measured = sorted(float(value) for value in recent)
    if not measured:
        return float(settings.POLYCHIP_MOVE_COST_S)
    return measured[len(measured) // 2]


def _step_seconds(job: TrainingJob, held: Sequence[FreeDevice], target: int) -> tuple[float, float]:
    """A step's seconds now (measured) and on ``target`` devices: the measured speed times what the
    throughput table's scaling curve says the larger gang gains, on the flavor it mostly runs on.
    (0, 0) when it has not measured a speed yet."""
    if not job.samples_per_s or not held:
        return 0.0, 0.0
    spec = job.job_spec
    flavor = Counter(d.flavor for d in held).most_common(1)[0][0]
    speeds = throughput.table()
    try:
        gain = (
            speeds.lookup(job.job_class, flavor, target).samples_per_s
            / speeds.lookup(job.job_class, flavor, len(held)).samples_per_s
        )
    except LookupError:
        return 0.0, 0.0
    now_s = spec.workload_on(len(held)).global_batch / job.samples_per_s
    after_s = spec.workload_on(target).global_batch / (job.samples_per_s * gain)
    return now_s, after_s


def grow_back(job_id: int) -> bool:
    """Ask a shrunk job to move to more devices once the pool has them again."""
    job = TrainingJob.objects.filter(pk=job_id, state=JobState.RUNNING).first()
    if job is None:
        return False
    run = current_attempt(job)
    if run is not None and run.stop_requested:
        return False
    free, releasing = free_and_releasing_devices()
    pool_free = [d for d in free if not d.degraded]
    # A queued job that could start on what is free, or soon free (a preempted run's devices, seconds from
    # their teardown): it goes first, not this job's growth. Without the second, a job shrunk for one
    # that also waits on another victim's teardown would grow back into the room it made.
    soon = Counter(d.flavor for d in (*free, *releasing) if not d.degraded)
    if any(sum(soon[f] for f in set(p.flavors)) >= (p.min_devices or p.devices) for p in pending_jobs()):
        return False
    held = [
        as_free_device(a.device)
        for a in job.allocations.filter(ended_at__isnull=True).select_related("device__node", "device__flavor")
    ]
    current = len(held)
    flavors = job.job_spec.flavors
    usable = [d for d in pool_free if d.flavor in flavors]
    # The move releases what it holds: its next attempt may take that and what the quota has room for.
    ledger, _ = quota_ledger({job.job_class}, without=job.pk)
    total = len(_within_quota([*held, *usable], held, flavors, lambda f: ledger.headroom(job.tenant_id, f)))
    target = grow_target(current, job.job_spec.devices, total - current)
    if target is None:
        return False
    steps_left = max(0, job.total_steps - job.steps_done)
    now_s, after_s = _step_seconds(job, held, target)
    cost_s = move_cost_s(job.job_class)
    if not worth_growing(steps_left, now_s, after_s, cost_s):
        # The move would cost more than the faster steps save over the rest of the run.
        log.info(
            "job %s stays on %s devices: growing to %s saves %.1f s over %s steps, the move costs %.1f s",
            job_id,
            current,
            target,
            steps_left * (now_s - after_s),
            steps_left,
            cost_s,
        )
        return False
    return request_move(
        job_id, f"growing back from {current} to {target} devices ({len(usable)} free again, within quota)"
    )
