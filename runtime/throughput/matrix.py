"""The throughput matrix: what one device of a flavor is worth to a job class, in NAU.

A normalized accelerator unit (NAU) is a unit of work, not of chips: one NAU is the throughput that
one device of the reference flavor gives a job's class. A device of another flavor is worth its
throughput for that class over the reference's, so an H100 may be worth 3 NAU to one job class and
2 to another. Quotas in NAU let a tenant run wherever its work goes fastest without being charged
for chip counts that mean different things on different chips.

Entries are measured (samples per second per device) when a benchmark or real steps supplied them
(``ThroughputTable.measured_per_device`` gives that mapping), and otherwise estimated from the
flavors' peak bf16 figures; an estimate says so (``estimated``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from runtime.scheduling.model import MILLI
from runtime.throughput.bounds import bounded_ratio


@dataclass(frozen=True)
class Rate:
    job_class: str
    flavor: str
    milli_nau: int  # per device
    estimated: bool


@dataclass(frozen=True)
class ThroughputMatrix:
    """Samples per second per device by (job class, flavor), over a flavor catalog's peaks."""

    reference_flavor: str
    peak_tflops: Mapping[str, float]  # flavor -> peak bf16 TFLOP/s, the estimate's basis
    measured: Mapping[tuple[str, str], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.peak_tflops:
            raise ValueError("a throughput matrix needs at least one flavor")
        if self.reference_flavor not in self.peak_tflops:
            raise ValueError(
                f"reference flavor {self.reference_flavor!r} is not in the catalog; "
                f"choose one of {', '.join(sorted(self.peak_tflops))}"
            )

    def rate(self, job_class: str, flavor: str) -> Rate:
        """What one device of ``flavor`` is worth to ``job_class``, in milli-NAU."""
        ref = self.reference_flavor
        measured_here = self.measured.get((job_class, flavor))
        measured_ref = self.measured.get((job_class, ref))
        peak = self.peak_tflops.get(flavor)
        if measured_here is not None and measured_ref:
            ratio = measured_here / measured_ref
            if peak:
                # Measured figures come from telemetry: held near what the peak figures say (bounds).
                ratio = bounded_ratio(ratio, peak / self.peak_tflops[ref])
            return Rate(job_class, flavor, max(1, round(MILLI * ratio)), estimated=False)
        if peak is None:
            # An unknown flavor is charged as one reference device: never free, never a surprise.
            return Rate(job_class, flavor, MILLI, estimated=True)
        return Rate(job_class, flavor, max(1, round(MILLI * peak / self.peak_tflops[ref])), estimated=True)

    def rates(self, job_classes: Iterable[str]) -> dict[tuple[str, str], int]:
        """milli-NAU per device for every (class, flavor) pair, the scheduler's input."""
        return {
            (job_class, flavor): self.rate(job_class, flavor).milli_nau
            for job_class in set(job_classes)
            for flavor in self.peak_tflops
        }


def choose_reference(preferred: str, peak_tflops: Mapping[str, float]) -> str:
    """The preferred reference flavor when the pool has it, else the slowest flavor (so that no
    device is worth less than one NAU)."""
    if preferred in peak_tflops:
        return preferred
    return min(peak_tflops, key=lambda name: (peak_tflops[name], name))
