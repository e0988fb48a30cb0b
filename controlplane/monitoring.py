"""What every app's metrics share: bounded label values and the families' plumbing.

Cardinality is bounded by design. A label takes its values from a closed set: tenants from the tenant
table, flavors, nodes and devices from the pool, task names from the Celery app, job classes from the
built-in models and the workload kinds, reasons and causes from fixed lists. A value outside its set is
counted under ``_other`` and the miss is counted in ``polychip_metrics_label_overflow_total{label}``, so
a label that starts to overflow is seen before it costs anything. No job, user or run id appears on a
series, except on the series of running jobs (``polychip_job_*``), which are bounded by the devices in
the pool and dropped when a job ends. That label is ``job_id``: Prometheus gives every series a ``job``
label of its own (the scrape job's name).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

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


def priority_band(priority: int) -> str:
    """Priorities run from -1000 to 1000; a label gets one of three bands."""
    if priority > 0:
        return "high"
    return "low" if priority < 0 else "normal"
