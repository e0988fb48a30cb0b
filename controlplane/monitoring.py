"""What every app's metrics share: bounded label values and the families' plumbing.

Cardinality is bounded by design. A label takes its values from a closed set: tenants from the tenant
table, flavors, nodes and devices from the pool, task names from the Celery app, job classes from the
built-in models and the workload kinds, reasons and causes from fixed lists. A value outside its set is
counted under ``_other`` and the misses of the scrape are shown in
``polychip_metrics_label_overflow{label}``, so a label that starts to overflow is seen before it costs
anything. Values that fall into ``_other`` together add up into one sample (``Tally``): a repeated
series is an error to Prometheus. No job, user or run id appears on a series, except on the series of
running jobs (``polychip_job_*``), which are bounded by the devices in the pool and dropped when a job
ends. That label is ``job_id``: Prometheus gives every series a ``job`` label of its own (the scrape
job's name).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from prometheus_client.metrics_core import Metric

OTHER = "_other"


class LabelBound:
    """The values each bounded label may take in this scrape, and the misses."""

    def __init__(self) -> None:
        self.allowed: dict[str, frozenset[str]] = {}
        self.overflow: Counter[str] = Counter()

    def allow(self, label: str, values: Iterable[str]) -> None:
        self.allowed[label] = frozenset(values)

    def __call__(self, label: str, value: str) -> str:
        if value in self.allowed.get(label, frozenset()):
            return value
        self.overflow[label] += 1
        return OTHER


_Family = TypeVar("_Family", bound=Metric)


class Tally:
    """One family's samples by their label values, combined (summed unless told) where two rows end
    up with the same values, as rows whose tenant or task fell into ``_other`` do."""

    def __init__(self, combine: Callable[[float, float], float] = float.__add__) -> None:
        self.values: dict[tuple[str, ...], float] = {}
        self.combine = combine

    def add(self, labels: Sequence[str], value: float) -> None:
        key = tuple(labels)
        self.values[key] = self.combine(self.values[key], float(value)) if key in self.values else float(value)

    def into(self, family: _Family) -> _Family:
        for labels, value in sorted(self.values.items()):
            family.add_metric(list(labels), value)  # type: ignore[attr-defined]
        return family


class HistogramTally:
    """``Tally`` for histograms: cumulative bucket counts and sums, added bucket by bucket."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.names = [*(str(float(b)) for b in bounds), "+Inf"]
        self.values: dict[tuple[str, ...], tuple[list[float], float]] = {}

    def add(self, labels: Sequence[str], cumulative: Sequence[float], sum_value: float) -> None:
        counts, total = self.values.get(tuple(labels), ([0.0] * len(self.names), 0.0))
        counts = [a + b for a, b in zip(counts, cumulative, strict=False)]
        self.values[tuple(labels)] = counts, total + sum_value

    def into(self, family: _Family) -> _Family:
        for labels, (counts, total) in sorted(self.values.items()):
            family.add_metric(list(labels), list(zip(self.names, counts, strict=True)), total)  # type: ignore[attr-defined]
        return family


def priority_band(priority: int) -> str:
    """Priorities run from -1000 to 1000; a label gets one of three bands."""
    if priority > 0:
        return "high"
    return "low" if priority < 0 else "normal"
