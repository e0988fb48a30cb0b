"""Worker telemetry folded into the job: one fold function per event kind.

A batch is checked first (``jobs.telemetry``), then applied under the job's row lock: each event,
oldest first, goes to the fold for its kind, which changes the job in memory and names the fields it
changed; the job is saved once. Rank 0 speaks for the job (its loss, its split, its exchange, its
checkpoints, its metrics history); every rank speaks for its own step figures and its own device's
health readings. Rank 0's loss and named metrics are stored per step (``jobs.metrics``) in the same
transaction, one statement a batch.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from controlplane import domain
from jobs import bundles, locks, metrics, throughput, transitions
from jobs.errors import TelemetryRejected
from jobs.models import Allocation, Device, JobAttempt, JobEvent, JobState, TrainingJob
from jobs.runs import ingest_token, run_key
from jobs.telemetry import InvalidTelemetry, TelemetryEvent
from runtime.recovery.health import FEATURES
from runtime.throughput import FIGURE_MARGIN

RECENT_LOSSES = 50
PROGRESS_EVENT_EVERY = timedelta(seconds=1)
# A device keeps its last hour of health readings (one row a minute): twice what the predictor sees.
KEEP_READINGS = 60
ECC_COLUMN = FEATURES.index("ecc_errors")
PCIE_COLUMN = FEATURES.index("pcie_errors")

Fold = Callable[[TrainingJob, TelemetryEvent], set[str]]


def _fold_step(job: TrainingJob, event: TelemetryEvent) -> set[str]:
    if event.step is None:
        return set()
    changed: set[str] = set()
    previous = job.rank_stats.get(str(event.rank)) or {}
    if (previous.get("step") or 0) <= event.step:
        job.rank_stats[str(event.rank)] = {
            "flavor": event.flavor,
            "device_id": event.device_id,
            "step": event.step,
            "samples": event.samples,
            # The rank's share of the global batch per optimizer step, and its own speed (its compute
            # alone, before it waits for the others).
            "micro_batch": event.samples,
            "samples_per_s": event.samples_per_s,
            "step_time_s": event.step_time_s,
        }
        changed.add("rank_stats")
    if event.rank != 0:
        return changed
    if event.split is not None or event.global_samples_per_s is not None:
        changed |= _fold_balance(job, event, event.step)
    if event.comm is not None:
        changed |= _fold_comm_step(job, event.comm, event.step)
    # Rank 0 speaks for the job: every rank reports the same global loss.
    if event.step > job.steps_done and event.loss is not None:
        job.steps_done = event.step
        job.total_steps = max(event.total_steps or job.total_steps, event.step)
        if job.first_loss is None:
            job.first_loss = event.loss
        job.last_loss = event.loss
        job.recent_losses = [*job.recent_losses, round(event.loss, 6)][-RECENT_LOSSES:]
        changed |= {"steps_done", "total_steps", "first_loss", "last_loss", "recent_losses"}
    return changed


def _fold_balance(job: TrainingJob, event: TelemetryEvent, step: int) -> set[str]:
    """Rank 0's step event carries the job's split, predicted speeds and balance efficiency."""
    balance = job.balance_stats
    if step < balance.get("step", 0):
        return set()
    balance["step"] = step
    if event.split is not None:
        balance["split"] = [list(chunk) for chunk in event.split]
    if event.predicted is not None:
        balance["predicted"] = [round(p, 3) for p in event.predicted]
    if event.efficiency is not None:
        balance["efficiency"] = round(event.efficiency, 4)
    if event.global_samples_per_s is not None:
        balance["samples_per_s"] = round(event.global_samples_per_s, 3)
    return {"balance_stats"}


def _fold_comm_step(job: TrainingJob, comm: dict[str, Any], step: int) -> set[str]:
    """Rank 0's step event carries that step's exchange: bytes inside and across vendor groups, the
    collective's time, the part of it the backward pass did not hide, and the hidden share."""
    if step < (job.comm_stats.get("last_step") or {}).get("step", 0):
        return set()
    job.comm_stats["last_step"] = {"step": step, **comm}
    return {"comm_stats"}


def _fold_comm(job: TrainingJob, event: TelemetryEvent) -> set[str]:
    # Rank 0 speaks for the job's exchange, as for its balance: the other ranks' own figures (a group
    # member sends nothing across groups) would overwrite its view.
    if event.rank != 0 or event.comm is None:
        return set()
    job.comm_stats["ran" if event.kind == "comm" else "summary"] = event.comm
    return {"comm_stats"}


def _fold_finished(job: TrainingJob, event: TelemetryEvent) -> set[str]:
    if event.rank != 0 or not event.artifact:
        return set()
    job.artifact_path = event.artifact
    return {"artifact_path"}


def _fold_rebalanced(job: TrainingJob, event: TelemetryEvent) -> set[str]:
    if event.step is None or event.split is None:
        return set()
    balance = job.balance_stats
    if event.step <= (balance.get("last_rebalance") or {}).get("step", 0):
        return set()
    balance["rebalances"] = balance.get("rebalances", 0) + 1
    balance["last_rebalance"] = {
        "step": event.step,
        "split": [list(chunk) for chunk in event.split],
        "reason": event.reason,
        "steps_since_drift": event.steps_since_drift,
    }
    return {"balance_stats"}


def _fold_straggler(job: TrainingJob, event: TelemetryEvent) -> set[str]:
    if event.straggler_rank is None or event.step is None:
        return set()
    reported = job.balance_stats.setdefault("stragglers", [])
    if [event.straggler_rank, event.step] in reported:  # a retried batch reports it once
        return set()
    reported.append([event.straggler_rank, event.step])
    del reported[:-20]
    rank = event.straggler_rank
    flavor = (job.rank_stats.get(str(rank)) or {}).get("flavor") or "unknown flavor"
    measured, expected = event.measured_samples_per_s or 0.0, event.expected_samples_per_s or 0.0
    transitions.record_event(
        job,
        kind=JobEvent.Kind.PROGRESS,
        message=(
            f"straggler: rank {rank} ({flavor}) runs at {measured:.1f} samples/s where its benchmark score "
            f"promises {expected:.1f} (step {event.step}); consider replacing its device"
        ),
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
    return {"balance_stats"}


def _fold_checkpoint(job: TrainingJob, event: TelemetryEvent) -> set[str]:
    data = event.recovery or {}
    saves = job.recovery.setdefault("checkpoints", {"count": 0, "stall_ms_sum": 0.0, "write_ms_sum": 0.0})
    saves["count"] += 1
    saves["stall_ms_sum"] += data.get("stall_ms") or 0.0
    saves["write_ms_sum"] += data.get("write_ms") or 0.0
    saves["latest"] = {"ts": event.ts, **data}
    return {"recovery"}


def _fold_restored(job: TrainingJob, event: TelemetryEvent) -> set[str]:
    data = event.recovery or {}
    job.recovery["restored"] = {"ts": event.ts, **data}
    step = int(data.get("step") or 0)
    job.steps_done = step  # progress goes back to the checkpoint; the steps after it are redone
    skipped = data.get("skipped") or []
    note = f"; skipped {len(skipped)} unusable checkpoint(s)" if skipped else ""
    optimizer = data.get("optimizer_step")
    transitions.record_event(
        job,
        kind=JobEvent.Kind.RECOVERY,
        message=(
            f"restored step {step} on {data.get('world_size')} rank(s) (saved on {data.get('saved_world_size')}); "
            f"optimizer state from step {optimizer if optimizer is not None else '- (fresh)'}{note}"
        ),
        data={"restored": data},
    )
    return {"recovery", "steps_done"}


def _fold_resumed(job: TrainingJob, event: TelemetryEvent) -> set[str]:
    data = event.recovery or {}
    resumed: dict[str, Any] = {"ts": event.ts, **data}
    after = ""
    # Since the job was frozen: when the attempt before this one ended into recovering.
    frozen_at = (
        JobAttempt.objects.filter(job_id=job.pk, number=job.attempt - 1, ended_as=JobState.RECOVERING)
        .values_list("ended_at", flat=True)
        .first()
    )
    if frozen_at is not None:
        resumed["since_frozen_s"] = round(event.ts - frozen_at.timestamp(), 3)
        after = f", {resumed['since_frozen_s']:.1f} s after the job was frozen"
    job.recovery["resumed"] = resumed
    transitions.record_event(
        job,
        kind=JobEvent.Kind.RECOVERY,
        message=f"training continues at step {data.get('step')}{after}",
        data={"resumed": resumed},
    )
    return {"recovery", "steps_done"}


# Rank 0 speaks for the job's checkpoints and restores.
_RECOVERY_FOLDS: dict[str, Fold] = {
    "checkpoint": _fold_checkpoint,
    "restored": _fold_restored,
    "resumed": _fold_resumed,
}

FOLDS: dict[str, Fold] = {
    "step": _fold_step,
    "comm": _fold_comm,
    "comm_summary": _fold_comm,
    "finished": _fold_finished,
    "rebalanced": _fold_rebalanced,
    "straggler": _fold_straggler,
}


def _fold(job: TrainingJob, event: TelemetryEvent) -> set[str]:
    fold = FOLDS.get(event.kind)
    if fold is not None:
        return fold(job, event)
    recovery_fold = _RECOVERY_FOLDS.get(event.kind)
    if recovery_fold is not None and event.recovery is not None and event.rank == 0:
        return recovery_fold(job, event)
    return set()  # heartbeats and other kinds carry nothing to fold (their readings are stored below)


def _store_readings(job: TrainingJob, events: Sequence[TelemetryEvent]) -> None:
    """Append each device's new health rows (from its rank's heartbeats) to its recent history. Only
    for the devices this job holds: its token speaks for them and no others."""
    heartbeats: dict[str, list[TelemetryEvent]] = {}
    for event in sorted(events, key=lambda e: e.ts):
        if event.device_readings and event.device_id:
            heartbeats.setdefault(event.device_id, []).append(event)
    if not heartbeats:
        return
    held = Device.objects.filter(
        allocations__job=job, allocations__ended_at__isnull=True, device_id__in=sorted(heartbeats)
    )
    for device in locks.devices(held):
        # Only heartbeats newer than the last stored one: a retried batch is not counted again.
        newer = [
            e
            for e in heartbeats[device.device_id]
            if device.readings_event_ts is None or e.ts > device.readings_event_ts
        ]
        if not newer:
            continue
        fresh = [list(row) for event in newer for row in event.device_readings or ()]
        device.readings_event_ts = newer[-1].ts
        device.health_readings = (list(device.health_readings) + fresh)[-KEEP_READINGS:]
        device.readings_at = timezone.now()
        device.unscored_rows += len(fresh)
        device.last_reading = list(fresh[-1])
        device.ecc_errors_total += sum(_count(row, ECC_COLUMN) for row in fresh)
        device.pcie_errors_total += sum(_count(row, PCIE_COLUMN) for row in fresh)
        device.save(
            update_fields=[
                "health_readings",
                "readings_at",
                "unscored_rows",
                "last_reading",
                "ecc_errors_total",
                "pcie_errors_total",
                "readings_event_ts",
            ]
        )


def _count(row: Sequence[float], column: int) -> int:
    """A reading's error count for the minute (a rank reports them as floats; a count is whole, >= 0)."""
    return max(0, round(row[column])) if len(row) > column else 0


def _metric_points(events: Sequence[TelemetryEvent]) -> list[metrics.ReportedPoint]:
    """Rank 0's loss, the gang's samples/s and named scalars, in the order they were reported (a later
    report of the same step wins). Rank 0 speaks for the job: the other ranks report the same global loss."""
    points: list[metrics.ReportedPoint] = []
    for event in events:
        if event.rank != 0 or event.step is None or event.kind not in ("step", "metrics"):
            continue
        if event.kind == "step" and event.loss is not None:
            points.append(metrics.ReportedPoint(metrics.LOSS, event.step, event.loss))
        if event.kind == "step" and event.global_samples_per_s is not None:
            points.append(metrics.ReportedPoint(metrics.THROUGHPUT, event.step, event.global_samples_per_s))
        points.extend(metrics.ReportedPoint(name, event.step, value) for name, value in event.metrics or ())
    return points


def _gang_speed(job: TrainingJob) -> float | None:
    """Rank 0's global batch over its step time: what the gang really does; else the sum of the
    ranks' own speeds (what it could do, balanced perfectly)."""
    gang = job.balance_stats.get("samples_per_s")
    if gang is not None:
        return round(float(gang), 3)
    speeds = [s["samples_per_s"] for s in job.rank_stats.values() if s.get("samples_per_s") is not None]
    return round(float(sum(speeds)), 3) if speeds else None


def _check_artifacts(job: TrainingJob, events: Sequence[TelemetryEvent]) -> None:
    """A worker names its model file; only a path inside its own run's artifact folder is taken (a
    path elsewhere, ``../../etc/shadow`` or ``/etc/shadow``, would be shown back to the tenant)."""
    own = os.path.normpath(settings.POLYCHIP_ARTIFACTS_DIR / run_key(job))
    for i, event in enumerate(events):
        if not event.artifact:
            continue
        path = os.path.normpath(os.path.join(own, event.artifact))
        if os.path.commonpath([own, path]) != own or path == own:
            raise InvalidTelemetry(
                f"{event.where or f'events[{i}]'}.artifact",
                f"must be a file inside the run's own artifact folder ({own}), got {event.artifact!r}",
            )


def _check_physical(job: TrainingJob, events: Sequence[TelemetryEvent]) -> None:
    """Refuse the batch when a figure is more than the job's devices can do (``throughput.ceilings``).

    Rates are checked against the flavor of the device the rank holds, not the flavor the worker
    names: a worker's telemetry is untrusted, and its figures feed tables every tenant's jobs read.
    """
    rated = [(i, e) for i, e in enumerate(events) if any(value is not None for _, value in _rates(e))]
    if not rated:
        return
    held = dict(
        Allocation.objects.filter(job_id=job.pk, ended_at__isnull=True).values_list("rank", "device__flavor__name")
    )
    ceiling = throughput.ceilings(job.job_class, set(held.values()) or {""})
    fastest = max(ceiling.values())
    gang = sum(ceiling[flavor] for flavor in held.values()) or fastest
    for i, event in rated:
        where = event.where or f"events[{i}]"
        for name, value in _rates(event):
            if value is None:
                continue
            flavor = held.get(event.rank) if name == "samples_per_s" else None
            limit = gang if name == "global_samples_per_s" else ceiling[flavor] if flavor else fastest
            if value > limit:
                held_as = flavor or "the job's fastest device"
                raise InvalidTelemetry(
                    f"{where}.{name}",
                    f"{value:g} samples/s is more than {held_as} can do for {job.job_class} "
                    f"(at most {limit:g}: {FIGURE_MARGIN:g}x its benchmark); report what the steps measured",
                )


def _rates(event: TelemetryEvent) -> list[tuple[str, float | None]]:
    return [
        ("samples_per_s", event.samples_per_s),
        ("global_samples_per_s", event.global_samples_per_s),
        ("measured_samples_per_s", event.measured_samples_per_s),
        ("expected_samples_per_s", event.expected_samples_per_s),
        *(("predicted", p) for p in event.predicted or ()),
    ]


def check_ingest_token(*, job_id: int, token: str) -> None:
    """Refuse a worker's request before its body is read: the ingest route takes no other credential."""
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is None or not hmac.compare_digest(token.encode(), ingest_token(job).encode()):
        raise TelemetryRejected("unknown job or wrong ingest token")


def run_bundle_file(*, job_id: int, token: str) -> Path:
    """The stored code bundle of a job, for its ranks on a cluster (``runtime.codefetch``), with the job's
    own ingest token; ``TelemetryRejected`` for another token, ``NotFound`` when the job has no bundle."""
    check_ingest_token(job_id=job_id, token=token)
    job = TrainingJob.objects.get(pk=job_id)
    ref = job.job_spec.workload.bundle
    if not ref:
        raise domain.NotFound(f"job {job_id} runs no code bundle")
    return bundles.bundle_path(tenant_id=job.tenant_id, ref=ref)


def ingest_telemetry(*, job_id: int, token: str, events: Sequence[TelemetryEvent]) -> int:
    """Fold a batch of worker events into the job's progress; returns how many were applied."""
    with transaction.atomic():
        job = locks.job(job_id)
        if job is None or not hmac.compare_digest(token.encode(), ingest_token(job).encode()):
            raise TelemetryRejected("unknown job or wrong ingest token")
        # Checked whatever the job's state: bad input is refused the same way, ended job or not.
        _check_artifacts(job, events)
        _check_physical(job, events)
        if job.state not in (JobState.ADMITTED, JobState.RUNNING):
            return 0  # late telemetry of an ended job changes nothing
        fields: set[str] = {"last_heartbeat_at"}
        job.last_heartbeat_at = timezone.now()
        ordered = sorted(events, key=lambda e: (e.ts, e.step or 0))
        for event in ordered:
            fields |= _fold(job, event)
        _store_readings(job, events)
        metrics.record_points(job.pk, job.attempt, _metric_points(ordered))
        speed = _gang_speed(job)
        if speed is not None:
            job.samples_per_s = speed
            fields.add("samples_per_s")
        job.save(update_fields=sorted(fields))
        if "steps_done" in fields:
            now = timezone.now()
            JobAttempt.objects.filter(job_id=job.pk, number=job.attempt).update(
                first_step_at=Coalesce("first_step_at", Value(now)), last_step_at=now
            )
        # The throughput table learns from rank 0's batches that moved the job on (one small UPDATE
        # per such batch, not per event); other ranks' batches only refresh their rank stats. It
        # learns after this transaction commits: the entry's row is shared by every job of the
        # class, flavor and size, and updating it here, under this job's row lock, would serialize
        # all their ingests on it. A failure there is logged, never raised into ingest.
        if "steps_done" in fields and job.steps_done > throughput.LEARN_AFTER_STEP:
            throughput.learn_after_commit(job.pk, job.job_class, job.rank_stats)
        if "steps_done" in fields and _progress_event_due(job_id):
            transitions.record_event(
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
