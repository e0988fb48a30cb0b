"""Device health: drains (an operator's, or the failure predictor's) that cordon devices and move
the jobs on them, each after a checkpoint."""

from __future__ import annotations

import logging

from django.utils import timezone

from jobs.errors import UnknownDevices
from jobs.models import Allocation, Device, DeviceEvent, DeviceHealth, JobState
from jobs.moving import request_move
from jobs.pool import SCHEDULABLE, set_device_health
from jobs.predictor import load_predictor

log = logging.getLogger(__name__)

# A device is drained after this many consecutive alerting scores, not one: on held-out synthetic
# histories one alert at the best-F1 threshold fires on healthy devices about ten times as often as three
# in a row, which still warn of about half the failures (bench/recovery.py, "alert persistence").
ALERT_STREAK = 3
# A device is scored once it has this many new rows (minutes) of readings: the cadence the bench assumes.
SCORE_EVERY_ROWS = 5


def drain_node(node: str, *, by: str = "") -> list[int]:
    """Cordon a node's devices and move its jobs off it, each after a checkpoint; the moved job ids."""
    ids = list(Device.objects.filter(node__name=node).values_list("device_id", flat=True))
    if not ids:
        raise UnknownDevices(f"node: no such node {node!r} (or it has no devices)")
    reason = f"node {node} drained{f' by {by}' if by else ''}"
    return drain(ids, reason, by=reason)


def drain_device(device_id: str, *, reason: str) -> list[int]:
    """Cordon one device and move the jobs that run on it, each after a checkpoint; the moved job ids."""
    log.warning("device %s drained: %s", device_id, reason)
    return drain([device_id], f"device {device_id}: {reason}", by=reason)


def drain(device_ids: list[str], reason: str, *, by: str) -> list[int]:
    """Cordon devices and ask every running job on them to checkpoint and move."""
    set_device_health(device_ids, DeviceHealth.CORDONED, by=by)
    job_ids = (
        Allocation.objects.filter(ended_at__isnull=True, device__device_id__in=device_ids, job__state=JobState.RUNNING)
        .values_list("job_id", flat=True)
        .distinct()
    )
    return [job_id for job_id in sorted(job_ids) if request_move(job_id, reason)]


def score_devices() -> list[str]:
    """Score every device with fresh health readings; drain those predicted to fail within the
    horizon (their jobs checkpoint first, then move). Returns the device ids drained."""
    predictor = load_predictor()
    if predictor is None:
        return []
    fresh = Device.objects.filter(health__in=SCHEDULABLE, unscored_rows__gte=SCORE_EVERY_ROWS)
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
        if streak:
            DeviceEvent.objects.create(
                device_id=device.pk,
                kind=DeviceEvent.Kind.ALERT,
                score=score,
                by=f"failure predicted within {predictor.horizon_min} min ({streak} of {ALERT_STREAK} to drain)",
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
