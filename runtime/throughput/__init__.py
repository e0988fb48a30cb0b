"""Throughput: how fast each job class runs on each flavor and device count, and what that is worth.

- ``ThroughputTable`` (``table``): samples/s by (job class, flavor, devices), seeded from
  ``runtime.bench`` on the local backend and learned online from step telemetry.
- ``ThroughputMatrix`` (``matrix``): what one device of a flavor is worth to a class in NAU; it takes
  its measured rates from ``ThroughputTable.measured_per_device()``.
"""

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
    "LEARNING_WEIGHT",
    "Rate",
    "Source",
    "ThroughputEntry",
    "ThroughputMatrix",
    "ThroughputTable",
    "ThroughputTableError",
    "choose_reference",
    "observation_weight",
]
