"""Workloads for elastic scheduling: scaling curves from a throughput table, and a Sia-like job generator.

Scaling curves. Gavel's table measures each job type at 1, 2, 4 and 8 devices; an elastic job may run on
counts it never measured (3, 6, 16). ``fit_comm_overhead`` explains each measured gang's step time as
compute plus communication: a gang of ``m`` devices, each with one device-sized batch, takes
``m / rate(m)`` seconds per step of the gang, of which ``1 / rate(1)`` is compute (every device works on its
own batch at the one-device speed) and the rest, ``overhead(m)``, is the gradient exchange. A ring
all-reduce moves ``2 (m - 1) / m`` of the gradient through each link, so ``overhead(m) = kappa * 2 (m - 1) / m``
with one ``kappa`` (seconds) per (job type, flavor, packed or spread), fitted by least squares to the
measured gangs. ``extend_counts`` fills the counts the table lacks from that fit and keeps every measured
rate as measured. Rates then grow sub-linearly with the count wherever communication costs anything.

Sia-like workloads. Sia (Jayaram Subramanya et al., SOSP 2023) evaluates on a job mix of image, language
and speech models arriving at 10 to 50 jobs per hour on a cluster of three GPU types. ``sia_like_workload``
draws such traces from the throughputs the project has (Gavel's table; see ``SIA_MODELS`` for what stands
in for which model), with Poisson arrivals, Gavel's size distribution and Philly-shaped durations scaled
down (``DURATION_SCALE``) so that the cluster saturates inside Sia's range of rates. Deterministic for a
seed.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from runtime.simulate.trace import SimJob, ThroughputTable, TraceError, make_elastic

__all__ = [
    "SIA_CLUSTER",
    "SIA_MODELS",
    "SiaWorkload",
    "extend_counts",
    "fit_comm_overhead",
    "queue_growth",
    "ring_factor",
    "sia_like_workload",
    "sustainable",
]


def ring_factor(devices: int) -> float:
    """The share of the gradient that a ring all-reduce sends through each device's link: 2 (m - 1) / m."""
    return 2.0 * (devices - 1) / devices


def fit_comm_overhead(table: ThroughputTable) -> dict[tuple[str, str, bool], float]:
    """(job type, flavor, packed) -> kappa, the seconds of communication per unit of ``ring_factor``, fitted
    by least squares through the origin to every measured gang of 2+ devices (see the module docstring).
    Only keys with a one-device rate and at least one measured gang appear. A gang measured faster than its
    devices alone (timing noise in the table) counts as no overhead, never as a negative one."""
    by_key: dict[tuple[str, str, bool], dict[int, float]] = defaultdict(dict)
    for (job_type, flavor, devices, packed), rate in table.rates.items():
        by_key[(job_type, flavor, packed)][devices] = rate
    fits: dict[tuple[str, str, bool], float] = {}
    for key, rates in by_key.items():
        solo = rates.get(1)
        gangs = [(m, r) for m, r in rates.items() if m > 1 and r > 0]
        if not solo or not gangs:
            continue
        numerator = sum(max(0.0, m / r - 1 / solo) * ring_factor(m) for m, r in gangs)
        denominator = sum(ring_factor(m) ** 2 for m, _ in gangs)
        fits[key] = numerator / denominator
    return fits


def extend_counts(table: ThroughputTable, max_devices: int) -> ThroughputTable:
    """The table with every count from 1 to ``max_devices`` that it lacks filled in from the fitted
    communication overhead: ``rate(m) = m / (1 / rate(1) + kappa * ring_factor(m))``. Measured rates are kept
    as they are; a job type measured on one device only is not extended (nothing says how it scales)."""
    if max_devices < 1:
        raise TraceError(f"extend_counts: max_devices must be >= 1, got {max_devices}")
    rates = dict(table.rates)
    for (job_type, flavor, packed), kappa in fit_comm_overhead(table).items():
        solo = table.rates[(job_type, flavor, 1, packed)]
        for m in range(2, max_devices + 1):
            rates.setdefault((job_type, flavor, m, packed), m / (1 / solo + kappa * ring_factor(m)))
    return ThroughputTable(rates)


# Which of Gavel's measured job types stands in for each model class of Sia's mix: (category, model, Gavel's
# job type). Sia's image models (ResNet-18 on CIFAR-10, ResNet-50 on ImageNet) are in Gavel's table; its
# language models (BERT fine-tuning, GPT) are Transformers, for which Gavel's Transformer and LSTM language
# model stand in. No speech model was measured by Gavel: DeepSpeech2, Sia's speech model, is a stack of
# recurrent layers over spectrogram frames, so the recurrent LM at its largest batch (the longest steps of
# the LM rows, like DeepSpeech2's long sequences) stands in, renamed so that reports name it for what it is.
SIA_MODELS: tuple[tuple[str, str, str], ...] = (
    ("image", "resnet18-cifar10", "ResNet-18 (batch size 64)"),
    ("image", "resnet50-imagenet", "ResNet-50 (batch size 64)"),
    ("language", "transformer", "Transformer (batch size 64)"),
    ("language", "lstm-lm", "LM (batch size 20)"),
    ("speech", "deepspeech2-like", "LM (batch size 80)"),
)
# No published proportions of the three categories are at hand: each category is drawn with equal
# probability, then a model within it uniformly.
CATEGORIES = ("image", "language", "speech")

# Three GPU types (Sia's clusters have three), 64 devices as in Sia's simulated cluster, in servers of 4.
SIA_CLUSTER: dict[str, int] = {"k80": 16, "p100": 24, "v100": 24}
SIA_SERVER_SIZE = 4

# Gavel's generator draws Philly durations of 10**U(1.5, 3) minutes (80%) or 10**U(3, 4) (20%) on the
# reference device: 16.8 h on average, some 32 device-hours a job at Gavel's sizes, so that 64 devices
# saturate near 1.5 jobs per hour. Dividing by 15 puts saturation inside Sia's 10-50 jobs per hour (measured
# by bench/placement.py, which prints where it falls: near 35-45 jobs per hour under ``aware``), with jobs
# of 2 minutes to 11 hours, the span of Sia's workloads.
DURATION_SCALE = 15.0
# Gavel's size distribution (devices, probability), as ``generate_trace`` uses.
SIZES: tuple[tuple[int, float], ...] = ((1, 0.7), (2, 0.1), (4, 0.15), (8, 0.05))


@dataclass(frozen=True)
class SiaWorkload:
    jobs: list[SimJob]
    table: ThroughputTable  # rates for every model and count the jobs may use
    cluster: dict[str, int]  # flavor -> devices
    server_size: int
    models: dict[str, str]  # job type -> category


def sia_like_workload(
    gavel: ThroughputTable,
    *,
    jobs: int,
    jobs_per_hour: float,
    seed: int,
    elastic: bool = True,
    reference_flavor: str = "v100",
) -> SiaWorkload:
    """A Sia-shaped trace on ``SIA_CLUSTER``: Poisson arrivals at ``jobs_per_hour``, a model drawn from
    ``SIA_MODELS`` by category, a size from ``SIZES``, a Philly-shaped duration divided by
    ``DURATION_SCALE`` (at the requested size on ``reference_flavor``), and, when ``elastic``, each job
    allowed from half to twice its count with a fixed global batch. Rates come from ``gavel`` extended
    to every count up to twice the largest size (``extend_counts``)."""
    if jobs < 1 or jobs_per_hour <= 0:
        raise TraceError("sia_like_workload: jobs and jobs_per_hour must be positive")
    largest = max(size for size, _ in SIZES)
    extended = extend_counts(gavel, 2 * largest)
    rates: dict[tuple[str, str, int, bool], float] = {}
    models: dict[str, str] = {}
    for category, model, gavel_type in SIA_MODELS:
        models[model] = category
        for (job_type, flavor, devices, packed), rate in extended.rates.items():
            if job_type == gavel_type and flavor in SIA_CLUSTER:
                rates[(model, flavor, devices, packed)] = rate
    missing = [gavel_type for _, _, gavel_type in SIA_MODELS if not any(k[0] == gavel_type for k in gavel.rates)]
    if missing:
        raise TraceError(f"sia_like_workload: the throughput table lacks {', '.join(missing)}; use Gavel's table")
    table = ThroughputTable(rates)
    by_category = {c: [model for cat, model, _ in SIA_MODELS if cat == c] for c in CATEGORIES}
    rng = random.Random(seed)
    out: list[SimJob] = []
    now = 0.0
    for job_id in range(jobs):
        if job_id:
            now += rng.expovariate(jobs_per_hour / 3600.0)
        model = rng.choice(by_category[rng.choice(CATEGORIES)])
        size = rng.choices([s for s, _ in SIZES], weights=[p for _, p in SIZES])[0]
        minutes = 10 ** rng.uniform(1.5, 3) if rng.random() < 0.8 else 10 ** rng.uniform(3, 4)
        packed = size <= SIA_SERVER_SIZE
        reference_rate = table.steps_per_s(model, reference_flavor, size, consolidated=packed)
        if not reference_rate:
            raise TraceError(f"sia_like_workload: no rate for {model} on {size} {reference_flavor}")
        out.append(
            SimJob(
                job_id=job_id,
                arrival_s=now,
                job_type=model,
                devices=size,
                total_steps=minutes / DURATION_SCALE * 60 * reference_rate,
            )
        )
    return SiaWorkload(
        jobs=make_elastic(out) if elastic else out,
        table=table,
        cluster=dict(SIA_CLUSTER),
        server_size=SIA_SERVER_SIZE,
        models=models,
    )


def sustainable(arrival_s: Sequence[float], finish_s: Sequence[float], *, growth: float = 1.5) -> bool:
    """Does the queue stay bounded over the arrival window? See ``queue_growth``."""
    return queue_growth(arrival_s, finish_s) <= growth


def queue_growth(arrival_s: Sequence[float], finish_s: Sequence[float]) -> float:
    """The time-averaged number of jobs in the system (arrived, not finished) over the last quarter of the
    arrival window, divided by the same over its second quarter (the first is the warm-up from an empty
    cluster). A stable queue holds a steady length (ratio near 1); a queue that grows without bound grows
    linearly in time, which makes the ratio 3.5 / 1.5 = 2.33 from an empty start. ``sustainable`` draws the
    line at 1.5, halfway in spirit between the two and above the noise of heavy-tailed durations."""
    if len(arrival_s) != len(finish_s) or len(arrival_s) < 4:
        raise ValueError("queue_growth: need matching arrival and finish times of 4+ jobs")
    start, end = min(arrival_s), max(arrival_s)
    span = end - start
    if span <= 0:
        return math.inf
    quarter = span / 4

    def in_system(low: float, high: float) -> float:
        overlap = sum(max(0.0, min(f, high) - max(a, low)) for a, f in zip(arrival_s, finish_s, strict=True))
        return overlap / (high - low)

    early = in_system(start + quarter, start + 2 * quarter)
    late = in_system(start + 3 * quarter, end)
    return late / early if early > 0 else (math.inf if late > 0 else 1.0)
