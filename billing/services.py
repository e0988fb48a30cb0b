"""Use cases of the billing app."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction
from django.db.models import Count, Sum

from billing.contracts import FlavorUsage, UsageInterval
from billing.models import UsageRecord


def duration_ms(interval: UsageInterval) -> int:
    """Whole milliseconds held; microseconds are truncated so a replay always agrees."""
    delta = interval.ended_at - interval.started_at
    return (delta.days * 86_400_000) + (delta.seconds * 1000) + (delta.microseconds // 1000)


def record_usage(intervals: Iterable[UsageInterval]) -> int:
    """Write usage records; must run inside the transaction of the change that ends the intervals.

    Returns how many were new: a replayed key is ignored, never counted twice.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("record_usage must run inside the transaction that ends the allocation")
    created = 0
    for interval in intervals:
        if interval.ended_at < interval.started_at:
            raise ValueError(f"usage {interval.key}: ended_at is before started_at")
        _, was_created = UsageRecord.objects.get_or_create(
            key=interval.key,
            defaults={
                "tenant_id": interval.tenant_id,
                "job_id": interval.job_id,
                "device_id": interval.device_id,
                "flavor": interval.flavor,
                "started_at": interval.started_at,
                "ended_at": interval.ended_at,
                "duration_ms": duration_ms(interval),
            },
        )
        created += was_created
    return created


def usage_by_flavor(*, tenant_id: int, job_id: int | None = None) -> list[FlavorUsage]:
    records = UsageRecord.objects.filter(tenant_id=tenant_id)
    if job_id is not None:
        records = records.filter(job_id=job_id)
    rows = records.values("flavor").annotate(devices=Count("device_id", distinct=True), total=Sum("duration_ms"))
    return [
        FlavorUsage(flavor=row["flavor"], devices=row["devices"], duration_ms=int(row["total"] or 0))
        for row in rows.order_by("flavor")
    ]
