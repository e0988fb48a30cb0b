"""The capacity snapshot an admission cycle decides on: quotas, waiting jobs, held devices, free
devices, NAU rates, decayed usage and hop distances, loaded from the database in a few queries."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count, F, Q, QuerySet, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from controlplane import compiled_queries
from jobs.metering import charge
from jobs.models import Allocation, JobState, TrainingJob
from jobs.pool import free_and_releasing_devices, pool_fabric
from jobs.throughput import throughput_matrix
from runtime.scheduling import (
    NAU,
    AdmittedJob,
    FreeDevice,
    Limit,
    PendingJob,
    Snapshot,
    TenantQuota,
    decayed_usage,
)
from runtime.scheduling.model import MILLI
from tenants import services as tenants

# Jobs that hold devices against their tenant's quota.
HOLDING_STATES = (JobState.ADMITTED, JobState.RUNNING)


def _amount(resource: str, value: Decimal) -> int:
    """A quota in the scheduler's integers: devices for a flavor, milli-NAU for NAU."""
    return int(value * MILLI) if resource == NAU else int(value)


def tenant_quotas() -> dict[int, TenantQuota]:
    quotas: dict[int, TenantQuota] = {}
    for view in tenants.quotas_for_admission():
        limits = {
            resource: Limit(
                nominal=_amount(resource, q.nominal),
                borrowing_limit=None if q.borrowing_limit is None else _amount(resource, q.borrowing_limit),
                lending_limit=None if q.lending_limit is None else _amount(resource, q.lending_limit),
            )
            for resource, q in view.quotas.items()
        }
        quotas[view.id] = TenantQuota(tenant_id=view.id, cohort=view.cohort, limits=limits, weight=float(view.weight))
    return quotas


@dataclass(frozen=True)
class _Holding:
    """A job that holds devices, with what the scheduler needs of its row."""

    job_id: int
    tenant_id: int
    priority: int
    admitted_at: datetime | None
    demand: dict[str, int]
    borrowing: bool
    job_class: str
    elastic: Any  # the spec's fields as stored (JSON): an elastic job may shrink to min_devices
    min_devices: Any
    devices: list[FreeDevice] = field(default_factory=list)  # in rank order


def _holding_query() -> QuerySet[Allocation, tuple[Any, ...]]:
    return (
        Allocation.objects.filter(ended_at__isnull=True, job__state__in=HOLDING_STATES)
        .order_by("job_id", "rank")
        .values_list(
            *("job_id", "device__device_id", "device__node__name", "device__flavor__name", "job__tenant_id"),
            *("job__priority", "job__admitted_at", "job__demand", "job__borrowing", "job__job_class"),
            *("job__spec__elastic", "job__spec__min_devices"),
        )
    )


def _holding_rows() -> list[_Holding]:
    """The jobs that hold devices now, with their devices in rank order: one read of their open
    allocations, joined to the jobs (a job's few fields repeat on each of its devices' rows)."""
    holding: dict[int, _Holding] = {}
    for job_id, device_id, node, flavor, *job in compiled_queries.rows("jobs.snapshot.holding", _holding_query):
        if job_id not in holding:
            holding[job_id] = _Holding(job_id, *job)
        holding[job_id].devices.append(FreeDevice(device_id=device_id, node=node, flavor=flavor))
    return list(holding.values())


def _admitted(jobs: list[_Holding], rates: Mapping[tuple[str, str], int]) -> list[AdmittedJob]:
    return [
        AdmittedJob(
            job_id=job.job_id,
            tenant_id=job.tenant_id,
            priority=job.priority,
            admitted_at=(job.admitted_at or timezone.now()).timestamp(),
            devices=tuple(job.devices),
            # Jobs admitted before quotas existed carry no charge: price them as they stand.
            demand=job.demand or charge(job.job_class, job.devices, rates),
            borrowing=job.borrowing,
            min_devices=_elastic_min(job.elastic, job.min_devices),
        )
        for job in jobs
    ]


def holding_jobs(rates: Mapping[tuple[str, str], int]) -> list[AdmittedJob]:
    """The jobs that hold devices now (admitted or running), as the scheduler sees them."""
    return _admitted(_holding_rows(), rates)


def pending_jobs() -> list[PendingJob]:
    """Each tenant's first ``POLYCHIP_ADMISSION_WINDOW_PER_TENANT`` waiting jobs, by priority then age.

    A cycle cannot admit more of one tenant's jobs than there are free devices, and best-effort FIFO
    looks past a blocked job only this far: the rest wait their turn, so the cycle's cost grows with
    the number of tenants, not with one tenant's queue (10,000 jobs of one tenant used to make every
    tenant's cycle fifteen times slower).
    """
    rows = _window_rows(settings.POLYCHIP_ADMISSION_WINDOW_PER_TENANT)
    return [
        PendingJob(
            job_id=pk,
            tenant_id=tenant_id,
            priority=priority,
            submitted_at=created_at,
            devices=devices,
            flavors=tuple(flavors),
            job_class=job_class,
            queued_at=queued_at,
            min_devices=min_devices,
        )
        for pk, tenant_id, priority, created_at, queued_at, devices, flavors, job_class, min_devices in rows
    ]


_WINDOW_COLUMNS = (
    *("pk", "tenant_id", "priority", "created_at", "state_changed_at"),
    *("spec__devices", "spec__flavors", "job_class", "spec__elastic", "spec__min_devices"),
)


def _elastic_min(elastic: Any, min_devices: Any) -> int | None:
    """An elastic job's least count (specs stored before elastic jobs lack both fields)."""
    return int(min_devices) if elastic is True and min_devices else None


def _window_rows(window: int) -> list[tuple[Any, ...]]:
    """Each tenant's first ``window`` waiting jobs (priority, then age, then id): their id, tenant,
    priority, the two times in seconds since the epoch, devices, flavors, class and an elastic job's
    least count (else None).

    On PostgreSQL one statement, an index scan per tenant (a LATERAL subquery over the partial index
    of waiting jobs) that reads the columns at once: under a millisecond with one tenant's 10,000
    jobs waiting, where numbering every waiting job took 20 ms. The few fields of the stored spec
    (``JobSpec.to_dict``) it needs are read in SQL, as plain values: a cycle reads thousands of waiting
    jobs, and decoding four JSON values of each took longer than the statement. Elsewhere (SQLite, the
    embedded default) a window function numbers them and a second query reads them.
    """
    if connection.vendor == "postgresql":
        jobs = TrainingJob._meta.db_table
        tenants_table = TrainingJob._meta.get_field("tenant").related_model._meta.db_table
        # The times as seconds: the scheduler wants nothing else of them, and a float is read for a
        # fraction of a timestamp's cost (20,000 of them at 10,000 waiting jobs). trunc() reads a count
        # stored as 4.0 as Python's int() does.
        columns = (
            "id, tenant_id, priority, EXTRACT(EPOCH FROM created_at)::float8, "
            "EXTRACT(EPOCH FROM state_changed_at)::float8, trunc((spec->>'devices')::numeric)::int, "
            "ARRAY(SELECT f FROM jsonb_array_elements_text(spec->'flavors') WITH ORDINALITY AS e(f, n) ORDER BY n), "
            "job_class, "
            "CASE WHEN spec->'elastic' = 'true'::jsonb THEN NULLIF(trunc((spec->>'min_devices')::numeric)::int, 0) END"
        )
        sql = (
            f"SELECT w.* FROM {tenants_table} t CROSS JOIN LATERAL (SELECT {columns} FROM {jobs} q "  # noqa: S608
            "WHERE q.state = %s AND q.tenant_id = t.id ORDER BY q.priority DESC, q.created_at, q.id LIMIT %s) w"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [JobState.QUEUED.value, window])
            return cursor.fetchall()
    place = Window(
        RowNumber(), partition_by=[F("tenant_id")], order_by=[F("priority").desc(), F("created_at"), F("pk")]
    )
    queued = TrainingJob.objects.filter(state=JobState.QUEUED).annotate(place=place).filter(place__lte=window)
    ids = list(queued.values_list("pk", flat=True))
    rows = TrainingJob.objects.filter(pk__in=ids).values_list(*_WINDOW_COLUMNS)
    return [
        (
            pk,
            tenant,
            priority,
            created.timestamp(),
            queued.timestamp(),
            int(devices),
            flavors,
            job_class,
            _elastic_min(*elastic),
        )
        for pk, tenant, priority, created, queued, devices, flavors, job_class, *elastic in rows
    ]


def usage_history(now: datetime, rates: Mapping[tuple[str, str], int]) -> dict[int, dict[str, float]]:
    """Each tenant's decayed usage per resource over the last few half-lives, as an average amount
    in use: last week's burst weighs little, the last hour's a lot."""
    half_life_s = settings.POLYCHIP_FAIR_SHARE_HALF_LIFE_H * 3600.0
    horizon = now - timedelta(seconds=half_life_s * 6)
    # A job's devices of one flavor share its interval: one row for them all, counted (a cycle at 10,000
    # queued jobs reads 1,500 rows, not the 9,000 allocations; the decay is linear in the amount).
    rows = (
        Allocation.objects.filter(Q(ended_at__isnull=True) | Q(ended_at__gte=horizon))
        .values("job__tenant_id", "job__job_class", "device__flavor__name", "started_at", "ended_at")
        .annotate(devices=Count("pk"))
        .values_list("job__tenant_id", "job__job_class", "device__flavor__name", "started_at", "ended_at", "devices")
        .order_by()
    )
    intervals: dict[tuple[int, str], list[tuple[float, float | None, float]]] = defaultdict(list)
    for tenant_id, job_class, flavor, started_at, ended_at, devices in rows:
        start = started_at.timestamp()
        end = ended_at.timestamp() if ended_at else None
        intervals[(tenant_id, flavor)].append((start, end, float(devices)))
        intervals[(tenant_id, NAU)].append((start, end, float(devices * rates.get((job_class, flavor), MILLI))))
    history: dict[int, dict[str, float]] = defaultdict(dict)
    for (tenant_id, resource), spans in intervals.items():
        history[tenant_id][resource] = decayed_usage(spans, now.timestamp(), half_life_s)
    return dict(history)


def load_snapshot(now: datetime) -> Snapshot:
    matrix = throughput_matrix()
    pending = pending_jobs()
    holding = _holding_rows()
    classes = {job.job_class for job in pending} | {job.job_class for job in holding}
    rates = matrix.rates(classes | {"synthetic-mlp"})
    free, releasing = free_and_releasing_devices()
    return Snapshot(
        now=now.timestamp(),
        tenants=tenant_quotas(),
        pending=pending,
        admitted=_admitted(holding, rates),
        free=free,
        releasing=releasing,
        nau_rates=rates,
        history=usage_history(now, rates),
        distance=pool_fabric(),  # devices chosen by topology: fewest hops (a row of them at once)
    )
