"""A job's metrics history: every scalar rank 0 reported, one row per (name, step), read downsampled.

Writing: ingest hands over each batch's points (``record_points``), stored with one upsert statement
in the batch's transaction. A step trained again after a restore overwrites its earlier value, so a
series shows the run that led to the final model.

Reading (``metric_series``): a series with no more points in the asked range than ``points`` comes
back raw. A longer one is cut, in SQL, into at most ``points`` buckets of equal step width over the
steps it has in the range; each bucket answers

- ``step``: the first step in the bucket that has a point (so every step shown was really reported);
- ``value``: the mean of the bucket's values; ``min`` and ``max``: their extremes (a chart's band);
- ``last``: the value at the bucket's last reported step.

A raw point has ``value == min == max == last``. The bucket is ``(step - first) / width`` in integer
arithmetic (steps are whole and never below the range's first), which PostgreSQL and SQLite compute
alike; a chart of a million steps is ``points`` rows whatever the series' length.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from django.db.models import Avg, BigIntegerField, Count, ExpressionWrapper, F, Max, Min, QuerySet, Value
from django.utils import timezone

from controlplane.domain import Invalid
from jobs.contracts import MetricPointView, MetricSeriesView, NewMetricPoint
from jobs.errors import JobNotFound
from jobs.models import MetricPoint, TrainingJob

DEFAULT_POINTS = 500
MAX_POINTS = 5000
# Names asked for at once: more than a job's ranks may report in one event (jobs.telemetry.MAX_METRICS).
MAX_NAMES = 64
LOSS = "loss"
# The gang's samples/s as rank 0 measures it each step (the job page's throughput chart).
THROUGHPUT = "samples_per_s"


@dataclass(frozen=True)
class ReportedPoint:
    """One scalar as ingest takes it from rank 0's telemetry, before it is stored."""

    name: str
    step: int
    value: float


def record_points(job_id: int, attempt: int, points: Iterable[ReportedPoint], *, batch_size: int | None = None) -> int:
    """Upsert the points (a later point of the same name and step wins, here and against what is
    stored); how many rows were written. One INSERT ... ON CONFLICT DO UPDATE per ``batch_size``
    rows (None: the whole lot in one, as ingest's batches are small; bulk loads pass a size)."""
    # The same (name, step) twice in one statement is an error on PostgreSQL ("cannot affect row a
    # second time"): the last one reported is the one kept.
    latest: dict[tuple[str, int], float] = {}
    for point in points:
        latest[(point.name, point.step)] = point.value
    if not latest:
        return 0
    now = timezone.now()
    rows = [
        MetricPoint(job_id=job_id, name=name, step=step, value=value, attempt=attempt, recorded_at=now)
        for (name, step), value in latest.items()
    ]
    MetricPoint.objects.bulk_create(
        rows,
        batch_size=batch_size,
        update_conflicts=True,
        unique_fields=["job", "name", "step"],
        update_fields=["value", "attempt", "recorded_at"],
    )
    return len(rows)


def metric_points_after(
    after_id: int, *, up_to: int, job_ids: Iterable[int], limit: int = 5000
) -> list[NewMetricPoint]:
    """The jobs' points stored with a row id in ``(after_id, up_to]``, oldest first: what the push
    relay sends next (a range of the primary key, so a round reads only what is new). A point
    overwritten in place (a step trained again) keeps its id and is not among them; the charts' own
    periodic read picks those up."""
    rows = (
        MetricPoint.objects.filter(pk__gt=after_id, pk__lte=up_to, job_id__in=list(job_ids))
        .order_by("pk")
        .values_list("pk", "job__tenant_id", "job_id", "name", "step", "value")[:limit]
    )
    return [NewMetricPoint(*row) for row in rows]


def latest_metric_point_id() -> int:
    return MetricPoint.objects.order_by("-pk").values_list("pk", flat=True).first() or 0


def metric_names(job_id: int) -> list[str]:
    return list(MetricPoint.objects.filter(job_id=job_id).values_list("name", flat=True).distinct().order_by("name"))


def _in_range(job_id: int, first_step: int | None, last_step: int | None) -> QuerySet[MetricPoint]:
    points = MetricPoint.objects.filter(job_id=job_id)
    if first_step is not None:
        points = points.filter(step__gte=first_step)
    if last_step is not None:
        points = points.filter(step__lte=last_step)
    return points


def _raw(points: QuerySet[MetricPoint]) -> tuple[MetricPointView, ...]:
    return tuple(
        MetricPointView(step=step, value=value, min=value, max=value, last=value)
        for step, value in points.order_by("step").values_list("step", "value")
    )


def _bucketed(points: QuerySet[MetricPoint], first: int, last: int, buckets: int) -> tuple[MetricPointView, ...]:
    width = -(-(last - first + 1) // buckets)  # ceil: ``buckets`` buckets cover every step of the range
    bucket = ExpressionWrapper((F("step") - Value(first)) / Value(width), output_field=BigIntegerField())
    rows = list(
        points.annotate(bucket=bucket)
        .values("bucket")
        .annotate(first_step=Min("step"), last_step=Max("step"), low=Min("value"), high=Max("value"), mean=Avg("value"))
        .order_by("bucket")
        .values_list("first_step", "last_step", "low", "high", "mean")
    )
    # The value at each bucket's last step: one indexed read for the whole series (the unique
    # (job, name, step) index), where a correlated subquery per bucket would be one each.
    last_values = dict(points.filter(step__in=[row[1] for row in rows]).values_list("step", "value"))
    return tuple(
        MetricPointView(step=first_step, value=mean, min=low, max=high, last=last_values[last_step])
        for first_step, last_step, low, high, mean in rows
    )


def metric_series(
    *,
    tenant_id: int,
    job_id: int,
    names: Sequence[str] = (),
    first_step: int | None = None,
    last_step: int | None = None,
    points: int = DEFAULT_POINTS,
) -> list[MetricSeriesView]:
    """The job's series named ``names`` (none: every name it has, sorted) over ``first_step`` ..
    ``last_step`` (inclusive; None: open), each at most ``points`` points. A name the job never
    reported is an empty series. Another tenant's job is ``JobNotFound``, like a missing one."""
    if isinstance(points, bool) or not isinstance(points, int) or not 1 <= points <= MAX_POINTS:
        raise Invalid(f"must be a whole number from 1 to {MAX_POINTS}", field="points")
    if first_step is not None and last_step is not None and last_step < first_step:
        raise Invalid(f"must not be below from ({first_step})", field="to")
    if len(names) > MAX_NAMES:
        raise Invalid(f"at most {MAX_NAMES} names at once", field="name")
    if not TrainingJob.scoped.for_tenant(tenant_id).filter(pk=job_id).exists():
        raise JobNotFound(job_id)
    wanted = list(dict.fromkeys(names)) if names else metric_names(job_id)
    in_range = _in_range(job_id, first_step, last_step)
    extent = {
        row["name"]: (row["n"], row["first"], row["last"])
        for row in in_range.filter(name__in=wanted)
        .values("name")
        .annotate(n=Count("pk"), first=Min("step"), last=Max("step"))
        .order_by()
    }
    series = []
    for name in wanted:
        total, first, last = extent.get(name, (0, 0, 0))
        named = in_range.filter(name=name)
        downsampled = total > points
        series.append(
            MetricSeriesView(
                name=name,
                points=_bucketed(named, first, last, points) if downsampled else _raw(named) if total else (),
                downsampled=downsampled,
                total_points=total,
            )
        )
    return series
