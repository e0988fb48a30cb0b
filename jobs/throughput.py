"""The stored throughput table: seeded from benchmarks, learned from step telemetry, read by admission.

The table's logic is ``runtime.throughput`` (pure); this module loads it from ``ThroughputEntry``
rows and persists what changes. Each job keeps its own figure (``ThroughputObservation``, the rule of
``ThroughputTable.learn``), and a shared entry is the median of the recent jobs' figures
(``runtime.throughput.bounds``): worker telemetry is untrusted, so one job is one vote. Learning runs
after the ingest transaction commits (``learn_after_commit``), under the entry's row lock, so that no
job's ingest holds the shared row while it holds its own job's row.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import IntegrityError, transaction

from controlplane import compiled_queries
from jobs import locks
from jobs.contracts import ThroughputEntryView
from jobs.models import Allocation, Flavor, ThroughputSource
from jobs.models import ThroughputEntry as EntryRow
from jobs.models import ThroughputObservation as ObservationRow
from runtime.throughput import (
    LEARNING_WEIGHT,
    RECENT_JOBS,
    Source,
    ThroughputEntry,
    ThroughputMatrix,
    ThroughputTable,
    choose_reference,
    per_device_ceiling,
    robust_figure,
)

log = logging.getLogger(__name__)

# Steps 1..LEARN_AFTER_STEP are not learned from: they include the rendezvous, DDP's set-up and
# the first kernel choices, and say little about the steady rate.
LEARN_AFTER_STEP = 3


def peak_tflops() -> dict[str, float]:
    return dict(Flavor.objects.values_list("name", "peak_bf16_tflops"))


def _entry(row: EntryRow) -> ThroughputEntry:
    return ThroughputEntry(
        job_class=row.job_class,
        flavor=row.flavor,
        devices=row.devices,
        samples_per_s=row.samples_per_s,
        source=Source(row.source),
        samples=row.samples,
    )


def table() -> ThroughputTable:
    """The stored table, with the pool's peak figures for estimates."""
    return ThroughputTable.of((_entry(row) for row in EntryRow.objects.all()), peak_tflops())


def measured_per_device() -> dict[tuple[str, str], float]:
    """Per-device samples/s by (class, flavor): what ``ThroughputMatrix`` takes as ``measured``."""
    rows = compiled_queries.rows(
        "jobs.throughput.measured",
        lambda: EntryRow.objects.exclude(source=ThroughputSource.ESTIMATED).values_list(
            "job_class", "flavor", "devices", "samples_per_s", "source", "samples"
        ),
    )
    return ThroughputTable.of(
        ThroughputEntry(
            job_class=job_class,
            flavor=flavor,
            devices=devices,
            samples_per_s=samples_per_s,
            source=Source(source),
            samples=samples,
        )
        for job_class, flavor, devices, samples_per_s, source, samples in rows
    ).measured_per_device()


def list_entries(*, job_class: str | None = None, flavor: str | None = None) -> list[ThroughputEntryView]:
    rows = EntryRow.objects.order_by("job_class", "flavor", "devices")
    if job_class:
        rows = rows.filter(job_class=job_class)
    if flavor:
        rows = rows.filter(flavor=flavor)
    return [
        ThroughputEntryView(
            job_class=row.job_class,
            flavor=row.flavor,
            devices=row.devices,
            samples_per_s=row.samples_per_s,
            per_device_samples_per_s=row.samples_per_s / row.devices,
            source=row.source,
            samples=row.samples,
            updated_at=row.updated_at,
        )
        for row in rows
    ]


def throughput_matrix() -> ThroughputMatrix:
    """Per-device rates by (class, flavor) in NAU: measured where the table has them, else estimated
    from the flavors' peak figures (as it did before there was a table)."""
    peaks = dict(
        compiled_queries.rows("jobs.throughput.peaks", lambda: Flavor.objects.values_list("name", "peak_bf16_tflops"))
    )
    if not peaks:
        peaks = {settings.POLYCHIP_NAU_REFERENCE: 1.0}
    return ThroughputMatrix(
        reference_flavor=choose_reference(settings.POLYCHIP_NAU_REFERENCE, peaks),
        peak_tflops=peaks,
        measured=measured_per_device(),
    )


def nau_rates(job_classes: Iterable[str]) -> dict[tuple[str, str], int]:
    """Milli-NAU per device for each (job class, flavor): what a price per NAU-hour charges for."""
    return throughput_matrix().rates(set(job_classes))


@transaction.atomic
def store_benchmarks(entries: Iterable[ThroughputEntry], *, over_measured: bool = False) -> dict[str, int]:
    """Upsert benchmark entries; a ``measured`` entry (real steps) is kept unless ``over_measured``.

    Returns counts: ``stored`` (created or replaced) and ``kept`` (measured entries left alone).
    """
    counts = {"stored": 0, "kept": 0}
    for entry in entries:
        existing = locks.throughput_entries(
            EntryRow.objects.filter(job_class=entry.job_class, flavor=entry.flavor, devices=entry.devices)
        )
        row = existing.first()
        if row is not None and row.source == ThroughputSource.MEASURED and not over_measured:
            if entry.source == Source.BENCHMARK:  # the figure stays measured; the bound is the new benchmark's
                row.benchmark_samples_per_s = entry.samples_per_s
                row.save(update_fields=["benchmark_samples_per_s"])
                cache.delete(_ceilings_key(entry.job_class))
            counts["kept"] += 1
            continue
        EntryRow.objects.update_or_create(
            job_class=entry.job_class,
            flavor=entry.flavor,
            devices=entry.devices,
            defaults={
                "samples_per_s": entry.samples_per_s,
                "source": entry.source.value,
                "samples": entry.samples,
                "benchmark_samples_per_s": entry.samples_per_s if entry.source == Source.BENCHMARK else None,
            },
        )
        counts["stored"] += 1
        cache.delete(_ceilings_key(entry.job_class))
    return counts


def learn(job_id: int, job_class: str, flavor: str, devices: int, samples_per_s: float) -> None:
    """Fold one job's observation into its own figure, and the shared entry into the median of jobs.

    The job's own figure follows ``runtime.throughput.observation_weight``: the observation itself the
    first time, then ``w = max(LEARNING_WEIGHT, 1 / (n + 1))`` of it over n earlier ones. The entry of
    (class, flavor, devices) becomes the median of the most recent ``RECENT_JOBS`` jobs' figures, and
    rests on their observations: one job, whose telemetry is untrusted, is one vote. A figure above
    what the flavor can do (``ceilings``) is refused before it gets here; it is clamped here too.
    """
    key = {"job_class": job_class, "flavor": flavor, "devices": devices}
    ceiling = devices * ceilings(job_class, {flavor})[flavor]
    observed = min(float(samples_per_s), ceiling)
    if not observed > 0:
        return
    with transaction.atomic():
        entry = locks.throughput_entries(EntryRow.objects.filter(**key)).first()
        mine = locks.throughput_observations(ObservationRow.objects.filter(job_id=job_id, **key)).first()
        if mine is None:
            mine = ObservationRow(job_id=job_id, **key, samples_per_s=observed, samples=1)
        else:
            weight = max(LEARNING_WEIGHT, 1.0 / (mine.samples + 1))
            mine.samples_per_s = (1.0 - weight) * mine.samples_per_s + weight * observed
            mine.samples += 1
        mine.save()
        recent = list(
            ObservationRow.objects.filter(**key)
            .order_by("-updated_at", "-pk")
            .values_list("samples_per_s", "samples")[:RECENT_JOBS]
        )
        figure = robust_figure([rate for rate, _ in recent])
        rests_on = sum(n for _, n in recent)
        if entry is None:
            try:
                with transaction.atomic():  # a savepoint: a lost race must not spoil this transaction
                    EntryRow.objects.create(
                        **key, samples_per_s=figure, source=ThroughputSource.MEASURED, samples=rests_on
                    )
                    return
            except IntegrityError:
                entry = locks.throughput_entries(EntryRow.objects.filter(**key)).get()
        entry.samples_per_s, entry.samples, entry.source = figure, rests_on, ThroughputSource.MEASURED
        entry.save(update_fields=["samples_per_s", "samples", "source", "updated_at"])


# Every telemetry batch with a rate is checked against the ceilings: they are read from the database
# at most this often per process (benchmarks change when an operator seeds them, which clears them).
CEILINGS_TTL_S = 30


def _ceilings_key(job_class: str) -> str:
    return f"polychip:ceilings:{job_class}"


def ceilings(job_class: str, flavors: Iterable[str]) -> dict[str, float]:
    """The most samples/s one device of each flavor can report for ``job_class``
    (``runtime.throughput.per_device_ceiling``, over the stored benchmark entries)."""
    inputs = cache.get(_ceilings_key(job_class))
    if inputs is None:
        rows = EntryRow.objects.filter(job_class=job_class, benchmark_samples_per_s__isnull=False)
        inputs = (
            [(row.flavor, row.devices, row.benchmark_samples_per_s or 0.0) for row in rows],
            peak_tflops(),
        )
        cache.set(_ceilings_key(job_class), inputs, CEILINGS_TTL_S)
    entries, peaks = inputs
    benchmarks = [ThroughputEntry(job_class, flavor, n, rate, Source.BENCHMARK) for flavor, n, rate in entries]
    return {flavor: per_device_ceiling(job_class, flavor, benchmarks, peaks) for flavor in set(flavors)}


def learn_from_telemetry(job_id: int, job_class: str, rank_stats: Mapping[str, Any]) -> bool:
    """Learn a running job's samples/s from its ranks' latest step telemetry; True when it did.

    Only a job whose devices are all of one flavor teaches the table: (class, flavor, n) gets the
    sum of its ranks' samples/s. A mixed job teaches nothing per flavor: its aggregate is shaped by
    how its batch was split and by the balancer, and in a synchronous gang every rank waits for the
    slowest at each all-reduce, so neither the aggregate nor a rank's own figure says what its
    flavor would do on its own; attributing it would corrupt the single-flavor figures that
    placement compares mixes against.
    """
    placed = list(
        Allocation.objects.filter(job_id=job_id, ended_at__isnull=True)
        .order_by("rank")
        .values_list("rank", "device__flavor__name")
    )
    flavors = {flavor for _, flavor in placed}
    if len(flavors) != 1:
        return False
    (flavor,) = flavors
    total = 0.0
    for rank, _ in placed:
        stats = rank_stats.get(str(rank)) or {}
        rate, step = stats.get("samples_per_s"), stats.get("step")
        # Every rank must have reported past warm-up, from the device it holds now (rank stats of
        # an earlier attempt on other devices must not count).
        if not rate or rate <= 0 or not step or step <= LEARN_AFTER_STEP or stats.get("flavor") != flavor:
            return False
        total += float(rate)
    learn(job_id, job_class, flavor, len(placed), total)
    return True


def learn_after_commit(job_id: int, job_class: str, rank_stats: Mapping[str, Any]) -> None:
    """``learn_from_telemetry`` once the caller's transaction commits, in a transaction of its own.

    The entry's row is shared by every job of one (class, flavor, devices): updating it inside an
    ingest transaction, which holds its job's row lock, would make the ingests of all those jobs
    wait on one another. Learning is best effort: an error is logged, never raised to the caller.
    """
    stats = {rank: dict(values) for rank, values in rank_stats.items()}  # as of now, not of commit

    def learn_quietly() -> None:
        try:
            learn_from_telemetry(job_id, job_class, stats)
        except Exception:
            log.exception("job %s: could not learn throughput from telemetry", job_id)

    transaction.on_commit(learn_quietly)
