"""Job traces and throughput tables for the round simulator: Gavel's CSV formats, and a generator.

A trace row is a job: ``job_id, arrival_s, job_type, num_gpus, total_steps`` (and optionally ``tenant_id``
and ``flavors``, ``|``-separated). A job is done when it has run ``total_steps`` steps; how fast depends on
the throughput table: steps per second by job type, flavor, device count, and whether the devices share a
server (``consolidated``) or not.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


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


def write_trace(path: str | Path, jobs: Iterable[SimJob]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["job_id", "arrival_s", "job_type", "num_gpus", "total_steps", "tenant_id", "flavors"])
        for job in jobs:
            writer.writerow(
                [
                    job.job_id,
                    f"{job.arrival_s:.3f}",
                    job.job_type,
                    job.devices,
                    f"{job.total_steps:.3f}",
                    job.tenant_id,
                    "|".join(job.flavors),
                ]
            )


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
