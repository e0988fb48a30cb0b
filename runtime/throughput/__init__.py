"""Throughput: how fast each job class runs on each flavor and device count, and what that is worth.

- ``ThroughputTable`` (``table``): samples/s by (job class, flavor, devices), seeded from
  ``runtime.bench`` on the local backend and learned online from step telemetry.
- ``ThroughputMatrix`` (``matrix``): what one device of a flavor is worth to a class in NAU; it takes
  its measured rates from ``ThroughputTable.measured_per_device()``.
- ``bounds``: what a figure from untrusted telemetry may be, and the median over jobs that the shared
  table takes.
"""

from runtime.throughput.bounds import (
    FIGURE_MARGIN,
    PEAK_MARGIN,
    RECENT_JOBS,
    bounded_ratio,
    per_device_ceiling,
    robust_figure,
)
from runtime.throughput.matrix import Rate, ThroughputMatrix, choose_reference
from runtime.throughput.table import (
    DEFAULT_SAMPLES_PER_S_PER_TFLOP,
    LEARNING_WEIGHT,
    Source,
    ThroughputEntry,
    ThroughputTable,
    ThroughputTableError,
    observation_weight,
)

__all__ = [
    "DEFAULT_SAMPLES_PER_S_PER_TFLOP",
    "FIGURE_MARGIN",
    "LEARNING_WEIGHT",
    "PEAK_MARGIN",
    "RECENT_JOBS",
    "Rate",
    "Source",
    "ThroughputEntry",
    "ThroughputMatrix",
    "ThroughputTable",
    "ThroughputTableError",
    "bounded_ratio",
    "choose_reference",
    "observation_weight",
    "per_device_ceiling",
    "robust_figure",
]
