"""What a throughput figure can physically be, and how figures of many jobs combine.

Worker telemetry is untrusted: a tenant's code runs beside the worker that reports it. A figure is
first checked against what its flavor can do (``per_device_ceiling``: a multiple of the flavor's
benchmark for the class, scaled by peak figures from another flavor's benchmark, or an absolute
ceiling when nobody benchmarked the class); the shared table then takes the median of recent jobs'
own figures (``robust_figure``), so that one job moves it by at most one vote; and a measured NAU rate
stays within a factor of the peak-based estimate (``ThroughputMatrix``), so that no learned figure
can price a device at nothing or at a 300-digit number.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence

from runtime.throughput.table import Source, ThroughputEntry

# A device may report up to this multiple of its flavor's benchmark for the class: real steps beat a
# benchmark taken on a loaded host, or with a smaller model, by a few times, never by this much.
FIGURE_MARGIN = 8.0
# For a class that no flavor has benchmarked: no device does more samples per second than this.
MAX_SAMPLES_PER_S_PER_DEVICE = 1e7
# A measured NAU rate stays within this factor of the estimate from the flavors' peak figures.
PEAK_MARGIN = 4.0
# The shared figure is the median over this many of the most recent jobs' own figures.
RECENT_JOBS = 15


def per_device_ceiling(
    job_class: str, flavor: str, entries: Iterable[ThroughputEntry], peak_tflops: Mapping[str, float]
) -> float:
    """The most samples/s one device of ``flavor`` can report for ``job_class``.

    ``FIGURE_MARGIN`` times the class's benchmark on the flavor; else the class's benchmark on other
    flavors, each scaled by the peak figures (never scaled down); else ``MAX_SAMPLES_PER_S_PER_DEVICE``.
    Only benchmark entries count: a measured figure came from telemetry, the thing being checked.
    """
    own: list[float] = []
    scaled: list[float] = []
    for entry in entries:
        if entry.job_class != job_class or entry.source != Source.BENCHMARK:
            continue
        if entry.flavor == flavor:
            own.append(entry.per_device)
            continue
        here, there = peak_tflops.get(flavor), peak_tflops.get(entry.flavor)
        ratio = here / there if here and there else PEAK_MARGIN
        scaled.append(entry.per_device * max(1.0, ratio) * PEAK_MARGIN)
    if own:
        return FIGURE_MARGIN * max(own)
    if scaled:
        return min(MAX_SAMPLES_PER_S_PER_DEVICE, FIGURE_MARGIN * max(scaled))
    return MAX_SAMPLES_PER_S_PER_DEVICE


def robust_figure(figures: Sequence[float]) -> float:
    """The shared figure over jobs' own figures: their median (one job is one vote)."""
    if not figures:
        raise ValueError("robust_figure needs at least one figure")
    return float(statistics.median(figures))


def bounded_ratio(measured_ratio: float, estimated_ratio: float) -> float:
    """A measured ratio of throughputs held within ``PEAK_MARGIN`` of the peak-based estimate."""
    low, high = estimated_ratio / PEAK_MARGIN, estimated_ratio * PEAK_MARGIN
    return min(high, max(low, measured_ratio))
