"""Use over time, from the allocations: a tenant's quota use (what the quota card charts) and each
flavor's devices held and training (the console's utilization chart).

A stretch of time is cut into equal buckets; each bucket holds the average over it (device-seconds or
NAU-seconds held in the bucket, over its length), so a short burst shows at its true weight rather
than as a spike. Training is the held time inside each run's window of reported steps
(``jobs.metering.training_windows``), as the billing page's idle time counts it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import NamedTuple

from django.db.models import Count, Q
from django.utils import timezone

from jobs.contracts import FlavorUtilizationView, QuotaHistoryView, UsageBuckets, UtilizationHistoryView
from jobs.metering import training_windows
from jobs.models import Allocation, Device
from jobs.snapshot import tenant_quotas
from jobs.throughput import nau_rates
from runtime.scheduling import NAU
from runtime.scheduling.model import MILLI

# Enough points for a chart's width, few enough to read at a glance.
BUCKETS = 96
MAX_HOURS = 24 * 31


def _buckets(hours: int, now: datetime | None) -> UsageBuckets:
    if not 1 <= hours <= MAX_HOURS:
        raise ValueError(f"hours: between 1 and {MAX_HOURS}, got {hours}")
    until = now or timezone.now()
    return UsageBuckets(since=until - timedelta(hours=hours), until=until, bucket_s=hours * 3600 / BUCKETS)


def _spread(totals: list[float], span: UsageBuckets, start: datetime, end: datetime, weight: float) -> None:
    """Add ``weight`` x the seconds of ``[start, end)`` that fall in each bucket."""
    lo = max(0.0, (start - span.since).total_seconds())
    hi = min(span.bucket_s * BUCKETS, (end - span.since).total_seconds())
    index = int(lo // span.bucket_s)
    while lo < hi and index < BUCKETS:
        edge = min(hi, (index + 1) * span.bucket_s)
        totals[index] += (edge - lo) * weight
        lo, index = edge, index + 1


def _averages(totals: list[float], span: UsageBuckets) -> tuple[float, ...]:
    return tuple(round(total / span.bucket_s, 3) for total in totals)


class _Held(NamedTuple):
    """A device held by a job, clipped to the stretch charted."""

    job_id: int
    job_class: str
    flavor: str
    start: datetime
    end: datetime


def _allocations(span: UsageBuckets, *, tenant_id: int | None = None) -> list[_Held]:
    rows = Allocation.objects.filter(Q(ended_at__isnull=True) | Q(ended_at__gt=span.since), started_at__lt=span.until)
    if tenant_id is not None:
        rows = rows.filter(job__tenant_id=tenant_id)
    return [
        _Held(job_id, job_class, flavor, max(started, span.since), min(ended or span.until, span.until))
        for job_id, job_class, flavor, started, ended in rows.values_list(
            "job_id", "job__job_class", "device__flavor__name", "started_at", "ended_at"
        )
    ]


def quota_history(*, tenant_id: int, hours: int = 24, now: datetime | None = None) -> QuotaHistoryView:
    """The tenant's use of each resource its quota names, averaged per bucket, with today's nominal
    share (quotas keep no history: a changed nominal shows at its new value all along)."""
    span = _buckets(hours, now)
    own = tenant_quotas().get(tenant_id)
    limits = own.limits if own is not None else {}
    held = _allocations(span, tenant_id=tenant_id)
    rates = nau_rates({job_class for _, job_class, *_ in held}) if held else {}
    use: dict[str, list[float]] = {resource: [0.0] * BUCKETS for resource in limits}
    for _, job_class, flavor, start, end in held:
        if flavor in use:
            _spread(use[flavor], span, start, end, 1.0)
        if NAU in use:
            _spread(use[NAU], span, start, end, rates.get((job_class, flavor), MILLI) / MILLI)
    scale = {resource: (1 / MILLI if resource == NAU else 1.0) for resource in limits}
    return QuotaHistoryView(
        span=span,
        nominal={resource: limit.nominal * scale[resource] for resource, limit in limits.items()},
        in_use={resource: _averages(totals, span) for resource, totals in use.items()},
    )


def utilization_history(*, hours: int = 24, now: datetime | None = None) -> UtilizationHistoryView:
    """Per flavor: its devices, and how many were held and how many training, averaged per bucket."""
    span = _buckets(hours, now)
    held = _allocations(span)
    windows = training_windows({job_id for job_id, *_ in held})
    allocated: dict[str, list[float]] = {}
    training: dict[str, list[float]] = {}
    for job_id, _, flavor, start, end in held:
        _spread(allocated.setdefault(flavor, [0.0] * BUCKETS), span, start, end, 1.0)
        for first, last in windows.get(job_id, ()):
            if min(end, last) > max(start, first):
                _spread(training.setdefault(flavor, [0.0] * BUCKETS), span, max(start, first), min(end, last), 1.0)
    devices = dict(Device.objects.values("flavor__name").annotate(n=Count("pk")).values_list("flavor__name", "n"))
    flavors = tuple(
        FlavorUtilizationView(
            flavor=flavor,
            devices=devices[flavor],
            allocated=_averages(allocated.get(flavor, [0.0] * BUCKETS), span),
            training=_averages(training.get(flavor, [0.0] * BUCKETS), span),
        )
        for flavor in sorted(devices)
    )
    return UtilizationHistoryView(span=span, flavors=flavors)
