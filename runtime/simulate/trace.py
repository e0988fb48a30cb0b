"""Job traces and throughput tables for the round simulator: Gavel's CSV formats, and a generator.

A trace row is a job: ``job_id, arrival_s, job_type, num_gpus, total_steps`` (and optionally ``tenant_id``
and ``flavors``, ``|``-separated). A job is done when it has run ``total_steps`` steps; how fast depends on
the throughput table: steps per second by job type, flavor, device count, and whether the devices share a
server (``consolidated``) or not.

Elastic jobs (optional columns ``min_gpus``, ``max_gpus``, ``batch``): a job may run on any device count in
``[min_gpus, max_gpus]`` that a policy chooses, ``num_gpus`` being the count it asked for. ``batch`` says
what happens to its global batch when the count changes: ``fixed`` (each device's share of the batch
shrinks or grows; the optimization is unchanged) or ``scales`` (each device keeps its batch, so the global
batch grows with the count, with the linear learning-rate rule; larger batches make less progress per
sample, by the gradient-noise-scale model, ``noise_scale``). A step is the table's unit, one device-sized
batch (Gavel's rates for a gang are the gang's steps per second over all its devices), so
``total_steps`` measures the same work whatever the count. ``make_elastic`` turns any trace elastic.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

BatchRule = Literal["fixed", "scales"]
BATCH_RULES: tuple[BatchRule, ...] = ("fixed", "scales")


class TraceError(ValueError):
    """A trace or table that cannot be used; the message names the row, the field and the fix."""


@dataclass(frozen=True)
class SimJob:
    job_id: int
    arrival_s: float
    job_type: str
    devices: int
    total_steps: float
    tenant_id: int = 0
    flavors: tuple[str, ...] = ()  # allowed flavors; empty means every flavor the table knows for it
    mixable: bool = True  # may run on several flavors at once under a mixing policy
    # Elastic range: the device counts a policy may give it (None: exactly ``devices``).
    min_devices: int | None = None
    max_devices: int | None = None
    batch: BatchRule = "fixed"  # what its global batch does when the count changes (see the module docstring)
    # With batch "scales": the gradient noise scale in multiples of the requested global batch (Pollux's phi
    # over M0; McCandlish et al. 2018). Progress per sample at k times the requested batch is
    # (noise_scale + 1) / (noise_scale + k). No default: it is a property of the model and data, not ours to guess.
    noise_scale: float | None = None

    def __post_init__(self) -> None:
        low, high = self.device_range
        if (self.min_devices is not None or self.max_devices is not None) and not 1 <= low <= self.devices <= high:
            raise TraceError(
                f"job {self.job_id}: device range [{low}, {high}] must hold its requested {self.devices} devices "
                "and start at 1 or more"
            )
        if self.batch not in BATCH_RULES:
            raise TraceError(f"job {self.job_id}: batch {self.batch!r}: choose one of {', '.join(BATCH_RULES)}")
        if self.batch == "scales" and (self.noise_scale is None or self.noise_scale <= 0):
            raise TraceError(f"job {self.job_id}: batch 'scales' needs a noise_scale > 0 (its gradient noise scale)")

    @property
    def device_range(self) -> tuple[int, int]:
        """The device counts a policy may give the job: (min, max), both inclusive."""
        return (
            self.devices if self.min_devices is None else self.min_devices,
            self.devices if self.max_devices is None else self.max_devices,
        )

    @property
    def elastic(self) -> bool:
        return self.device_range != (self.devices, self.devices)


def make_elastic(
    jobs: Iterable[SimJob],
    *,
    low: float = 0.5,
    high: float = 2.0,
    batch: BatchRule = "fixed",
    noise_scale: float | None = None,
) -> list[SimJob]:
    """The same jobs, each allowed from ``low`` to ``high`` times its requested count (at least 1 device;
    the lower end rounded up, the upper down, so a job never gets less than ``low`` of what it asked for)."""
    if not 0 < low <= 1 <= high:
        raise TraceError(f"make_elastic: need 0 < low <= 1 <= high, got low={low}, high={high}")
    return [
        replace(
            job,
            min_devices=max(1, math.ceil(job.devices * low)),
            max_devices=max(job.devices, math.floor(job.devices * high)),
            batch=batch,
            noise_scale=noise_scale,
        )
        for job in jobs
    ]


@dataclass(frozen=True)
class ThroughputTable:
    """Steps per second: (job type, flavor, devices, consolidated) -> rate."""

    rates: Mapping[tuple[str, str, int, bool], float]

    def steps_per_s(self, job_type: str, flavor: str, devices: int, *, consolidated: bool) -> float | None:
        return self.rates.get((job_type, flavor, devices, consolidated))

    @property
    def flavors(self) -> tuple[str, ...]:
        return tuple(sorted({flavor for _, flavor, _, _ in self.rates}))

    def knows(self, job_type: str, devices: int) -> bool:
        return any((job_type, f, devices, False) in self.rates for f in self.flavors)


def load_gavel_throughputs(path: str | Path) -> ThroughputTable:
    """Gavel's ``throughputs.csv``: ``job_type, scale_factor`` then ``<flavor>_steps_per_s`` (packed on
    one server) and ``<flavor>_unconsolidated_steps_per_s`` (spread over servers)."""
    rates: dict[tuple[str, str, int, bool], float] = {}
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        fields = reader.fieldnames or []
        for column in ("job_type", "scale_factor"):
            if column not in fields:
                raise TraceError(f"{path}: column {column!r} missing; Gavel's throughputs.csv has it")
        packed = [c for c in fields if c.endswith("_steps_per_s") and "_unconsolidated_" not in c]
        for line, row in enumerate(reader, start=2):
            devices = _int(row["scale_factor"], path, line, "scale_factor")
            if devices < 1:
                raise TraceError(f"{path}:{line}: scale_factor must be >= 1")
            for column in packed:
                flavor = column.removesuffix("_steps_per_s")
                rates[(row["job_type"], flavor, devices, True)] = _float(row[column], path, line, column)
                spread = row.get(f"{flavor}_unconsolidated_steps_per_s")
                rates[(row["job_type"], flavor, devices, False)] = (
                    _float(spread, path, line, f"{flavor}_unconsolidated_steps_per_s")
                    if spread not in (None, "")
                    else rates[(row["job_type"], flavor, devices, True)]
                )
    for key, rate in list(rates.items()):
        if rate < 0:
            raise TraceError(f"{path}: {key[0]!r} on {key[1]} x{key[2]}: steps per second must be >= 0")
        if rate == 0:
            del rates[key]  # Gavel writes 0 where the job does not run there (it does not fit in memory)
    if not rates:
        raise TraceError(f"{path}: no throughputs; expected rows of job_type, scale_factor, <flavor>_steps_per_s")
    return ThroughputTable(rates)


def load_trace(path: str | Path, table: ThroughputTable | None = None) -> list[SimJob]:
    jobs: list[SimJob] = []
    seen: set[int] = set()
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        for column in ("job_id", "arrival_s", "job_type", "num_gpus", "total_steps"):
            if column not in (reader.fieldnames or []):
                raise TraceError(
                    f"{path}: column {column!r} missing; a trace has job_id, arrival_s, job_type, num_gpus, total_steps"
                )
        for line, row in enumerate(reader, start=2):
            job = SimJob(
                job_id=_int(row["job_id"], path, line, "job_id"),
                arrival_s=_float(row["arrival_s"], path, line, "arrival_s"),
                job_type=row["job_type"],
                devices=_int(row["num_gpus"], path, line, "num_gpus"),
                total_steps=_float(row["total_steps"], path, line, "total_steps"),
                tenant_id=_int(row.get("tenant_id") or "0", path, line, "tenant_id"),
                flavors=tuple(f for f in (row.get("flavors") or "").split("|") if f),
            )
            job = _with_elastic_columns(job, row, path, line)
            if job.job_id in seen:
                raise TraceError(f"{path}:{line}: job_id {job.job_id} appears twice; ids must be unique")
            if job.devices < 1 or job.total_steps <= 0 or job.arrival_s < 0:
                raise TraceError(f"{path}:{line}: num_gpus must be >= 1, total_steps > 0 and arrival_s >= 0")
            if table is not None and not table.knows(job.job_type, job.devices):
                raise TraceError(
                    f"{path}:{line}: job_type {job.job_type!r} with num_gpus {job.devices} is not in the "
                    "throughput table; add its row or change the job"
                )
            seen.add(job.job_id)
            jobs.append(job)
    return jobs


def _with_elastic_columns(job: SimJob, row: Mapping[str, str | None], path: str | Path, line: int) -> SimJob:
    """The job with the row's optional ``min_gpus``, ``max_gpus``, ``batch`` and ``noise_scale``."""
    low, high = row.get("min_gpus") or "", row.get("max_gpus") or ""
    batch = row.get("batch") or "fixed"
    noise = row.get("noise_scale") or ""
    if not (low or high or noise) and batch == "fixed":
        return job
    if batch not in BATCH_RULES:
        raise TraceError(f"{path}:{line}: batch {batch!r}: choose one of {', '.join(BATCH_RULES)}")
    try:
        return replace(
            job,
            min_devices=_int(low, path, line, "min_gpus") if low else None,
            max_devices=_int(high, path, line, "max_gpus") if high else None,
            batch=batch,
            noise_scale=_float(noise, path, line, "noise_scale") if noise else None,
        )
    except TraceError as exc:
        raise TraceError(f"{path}:{line}: {exc}") from None


def write_trace(path: str | Path, jobs: Iterable[SimJob]) -> None:
    """Write ``jobs`` in the format ``load_trace`` reads; the elastic columns only when some job is elastic."""
    jobs = list(jobs)
    elastic = any(job.elastic or job.batch != "fixed" for job in jobs)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        header = ["job_id", "arrival_s", "job_type", "num_gpus", "total_steps", "tenant_id", "flavors"]
        writer.writerow(header + (["min_gpus", "max_gpus", "batch", "noise_scale"] if elastic else []))
        for job in jobs:
            row: list[object] = [
                job.job_id,
                f"{job.arrival_s:.3f}",
                job.job_type,
                job.devices,
                f"{job.total_steps:.3f}",
                job.tenant_id,
                "|".join(job.flavors),
            ]
            if elastic:
                row += [
                    "" if job.min_devices is None else job.min_devices,
                    "" if job.max_devices is None else job.max_devices,
                    job.batch,
                    "" if job.noise_scale is None else job.noise_scale,
                ]
            writer.writerow(row)


def generate_trace(
    table: ThroughputTable,
    *,
    jobs: int,
    jobs_per_hour: float,
    seed: int,
    tenants: int = 1,
    sizes: Sequence[tuple[int, float]] = ((1, 0.7), (2, 0.1), (4, 0.15), (8, 0.05)),
    reference_flavor: str | None = None,
) -> list[SimJob]:
    """A Gavel-like trace: Poisson arrivals, a random job type, a size drawn from ``sizes`` (devices,
    probability), and a duration on the reference flavor drawn as Gavel's generator does from the Philly
    distribution (80% short: 10**U(1.5, 3) minutes; 20% long: 10**U(3, 4) minutes). Seeded: the same
    arguments always give the same trace."""
    rng = random.Random(seed)
    flavor = reference_flavor or table.flavors[-1]
    types_by_size = {
        size: sorted({t for (t, f, n, c) in table.rates if n == size and f == flavor and not c}) for size, _ in sizes
    }
    usable = [(size, p) for size, p in sizes if types_by_size[size]]
    if not usable:
        raise TraceError("generate_trace: the table has no job types for the sizes asked; check sizes")
    out: list[SimJob] = []
    now = 0.0
    for job_id in range(jobs):
        if job_id:
            now += rng.expovariate(jobs_per_hour / 3600.0)
        size = rng.choices([s for s, _ in usable], weights=[p for _, p in usable])[0]
        job_type = rng.choice(types_by_size[size])
        minutes = 10 ** rng.uniform(1.5, 3) if rng.random() < 0.8 else 10 ** rng.uniform(3, 4)
        rate = table.steps_per_s(job_type, flavor, size, consolidated=False) or 1.0
        out.append(
            SimJob(
                job_id=job_id,
                arrival_s=now,
                job_type=job_type,
                devices=size,
                total_steps=minutes * 60 * rate,
                tenant_id=job_id % tenants,
            )
        )
    return out


def _int(value: str, path: str | Path, line: int, column: str) -> int:
    number = _float(value, path, line, column)
    if not number.is_integer():
        raise TraceError(f"{path}:{line}: {column} {value!r} is not a whole number")
    return int(number)


def _float(value: str | None, path: str | Path, line: int, column: str) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise TraceError(f"{path}:{line}: {column} {value!r} is not a number") from None
    if not math.isfinite(number):
        raise TraceError(f"{path}:{line}: {column} {value!r} is not a finite number")
    return number
