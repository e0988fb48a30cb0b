"""The throughput table: samples per second of a job class on N devices of a flavor, and where the figure came from.

An entry is keyed by (job class, flavor, devices) and holds the whole gang's samples per second on
that many devices of that one flavor. Its ``source`` says where the figure came from:

- ``benchmark``: ``runtime.bench`` ran the class on the local backend with the flavor emulated;
- ``measured``: real step telemetry of jobs of that class on that many devices of that flavor,
  learned online (``learn``: an exponentially weighted moving average);
- ``estimated``: nobody measured it; ``lookup`` derived it (and ``basis`` says how).

The table is a value: ``learn`` and ``with_entries`` return a new table. It is pure (no Django);
the control plane stores its entries and rebuilds it from them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from runtime.errors import FieldError

FORMAT = "polychip-throughput/1"

# Online learning: a new observation moves the figure by this fraction of the difference. At 0.2 a
# single noisy telemetry batch moves it by at most a fifth, while a real change (a throttled chip, a
# noisy neighbour) is mostly followed after ten batches (0.8**10 = 0.11 of the old figure left):
# about five seconds of a job's telemetry, which rank 0 flushes every half second.
LEARNING_WEIGHT = 0.2

# For a job class that no flavor has seen: samples per second per device per peak bf16 TFLOP/s.
# This is a unit, not a measurement: it makes an unknown class's estimates proportional to the
# flavors' peak figures (the same rule as ``ThroughputMatrix``'s estimates), so only the ratios
# between flavors mean anything; the entry is marked ``estimated`` and says so in ``basis``.
DEFAULT_SAMPLES_PER_S_PER_TFLOP = 1.0


class Source(StrEnum):
    BENCHMARK = "benchmark"
    MEASURED = "measured"
    ESTIMATED = "estimated"


class ThroughputTableError(FieldError):
    """A table (or its JSON) that cannot be used; ``field`` is the dotted path of what is wrong."""


Key = tuple[str, str, int]


@dataclass(frozen=True)
class ThroughputEntry:
    job_class: str
    flavor: str
    devices: int
    samples_per_s: float  # the whole gang's, on ``devices`` devices of ``flavor``
    source: Source
    samples: int = 0  # observations the figure rests on: timed benchmark steps or telemetry batches
    basis: str = field(default="", compare=False)  # how an estimate was derived; empty when stored

    @property
    def key(self) -> Key:
        return (self.job_class, self.flavor, self.devices)

    @property
    def per_device(self) -> float:
        return self.samples_per_s / self.devices

    @property
    def estimated(self) -> bool:
        return self.source == Source.ESTIMATED

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_class": self.job_class,
            "flavor": self.flavor,
            "devices": self.devices,
            "samples_per_s": self.samples_per_s,
            "source": self.source.value,
            "samples": self.samples,
        }


def check_entry(entry: ThroughputEntry, where: str = "entry") -> None:
    """Raise ThroughputTableError naming the field of ``entry`` that is wrong."""
    for name in ("job_class", "flavor"):
        value = getattr(entry, name)
        if not isinstance(value, str) or not value:
            raise ThroughputTableError(f"{where}.{name}", f"must be a non-empty string, got {value!r}")
    if isinstance(entry.devices, bool) or not isinstance(entry.devices, int) or entry.devices < 1:
        raise ThroughputTableError(f"{where}.devices", f"must be a whole number >= 1, got {entry.devices!r}")
    rate = entry.samples_per_s
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate) or rate <= 0:
        raise ThroughputTableError(f"{where}.samples_per_s", f"must be a finite number > 0, got {rate!r}")
    if not isinstance(entry.source, Source):
        raise ThroughputTableError(f"{where}.source", f"must be one of {', '.join(Source)}, got {entry.source!r}")
    if isinstance(entry.samples, bool) or not isinstance(entry.samples, int) or entry.samples < 0:
        raise ThroughputTableError(f"{where}.samples", f"must be a whole number >= 0, got {entry.samples!r}")


def observation_weight(previous: ThroughputEntry | None, weight: float = LEARNING_WEIGHT) -> float:
    """How much a new measured observation counts against the figure it updates.

    Real steps replace a benchmark or an estimate outright (weight 1): they measure the thing
    itself, collectives included, where the benchmark measured a stand-in. Over measured figures
    the weight is ``max(weight, 1 / (n + 1))`` for n earlier observations: a plain mean while there
    are few, so that the first observation is not diluted by a prior of zero, then the moving
    average. The control plane applies this same rule in SQL (``jobs.throughput``).
    """
    if previous is None or previous.source != Source.MEASURED:
        return 1.0
    return max(weight, 1.0 / (previous.samples + 1))


@dataclass(frozen=True)
class ThroughputTable:
    """Entries by (job class, flavor, devices), with the flavors' peak bf16 TFLOP/s for estimates."""

    entries: Mapping[Key, ThroughputEntry] = field(default_factory=dict)
    peak_tflops: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key, entry in self.entries.items():
            where = f"entries[{key[0]}/{key[1]}/{key[2]}]"
            check_entry(entry, where)
            if entry.key != key:
                raise ThroughputTableError(where, f"is keyed {key} but describes {entry.key}")
        for flavor, peak in self.peak_tflops.items():
            if isinstance(peak, bool) or not isinstance(peak, int | float) or not math.isfinite(peak) or peak <= 0:
                raise ThroughputTableError(f"peak_tflops.{flavor}", f"must be a finite number > 0, got {peak!r}")
        # Frozen in depth: a caller's dict changing later must not change this table.
        object.__setattr__(self, "entries", MappingProxyType(dict(self.entries)))
        object.__setattr__(self, "peak_tflops", MappingProxyType({k: float(v) for k, v in self.peak_tflops.items()}))

    @classmethod
    def of(cls, entries: Iterable[ThroughputEntry], peak_tflops: Mapping[str, float] | None = None) -> ThroughputTable:
        """A table from a list of entries; two entries with the same key are refused."""
        by_key: dict[Key, ThroughputEntry] = {}
        for i, entry in enumerate(entries):
            check_entry(entry, f"entries[{i}]")
            if entry.key in by_key:
                raise ThroughputTableError(
                    f"entries[{i}]", f"repeats {entry.job_class}/{entry.flavor}/{entry.devices}; keep one entry per key"
                )
            by_key[entry.key] = entry
        return cls(by_key, peak_tflops or {})

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[ThroughputEntry]:
        return iter(sorted(self.entries.values(), key=lambda e: e.key))

    def job_classes(self) -> set[str]:
        return {key[0] for key in self.entries}

    # -- reading -----------------------------------------------------------------------------------

    def lookup(self, job_class: str, flavor: str, devices: int) -> ThroughputEntry:
        """The gang's samples per second for ``job_class`` on ``devices`` devices of ``flavor``.

        In order: the stored entry; one scaled from the same class and flavor at other device
        counts; one from the class on another flavor, scaled by peak bf16 figures; the documented
        default for a class nobody measured. Anything but the first is marked ``estimated`` and
        says how in ``basis``. Raises LookupError when the flavor has neither entries nor a peak.
        """
        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
            raise ValueError(f"devices must be a whole number >= 1, got {devices!r}")
        stored = self.entries.get((job_class, flavor, devices))
        if stored is not None:
            return stored
        scaled = self._scaled(job_class, flavor, devices)
        if scaled is not None:
            return scaled
        peak = self.peak_tflops.get(flavor)
        if peak is None:
            raise LookupError(
                f"flavor {flavor!r} has no throughput entry for {job_class!r} and no peak bf16 figure to estimate "
                "from; add the flavor to the pool (with peak_bf16_tflops) or seed it with seed_throughput"
            )
        by_peak = self._from_other_flavor(job_class, flavor, devices, peak)
        if by_peak is not None:
            return by_peak
        return ThroughputEntry(
            job_class,
            flavor,
            devices,
            samples_per_s=peak * DEFAULT_SAMPLES_PER_S_PER_TFLOP * devices,
            source=Source.ESTIMATED,
            basis=f"class never measured: {DEFAULT_SAMPLES_PER_S_PER_TFLOP:g} sample/s per peak bf16 TFLOP/s per "
            "device (a unit; only ratios between flavors mean anything)",
        )

    def _counts(self, job_class: str, flavor: str) -> list[int]:
        return sorted(key[2] for key in self.entries if key[0] == job_class and key[1] == flavor)

    def _scaled(self, job_class: str, flavor: str, devices: int) -> ThroughputEntry | None:
        """From the same class and flavor at other device counts.

        Between two stored counts, the per-device rate is interpolated linearly in the device count
        and multiplied by ``devices``. Outside them, the scaling curve learned from the stored counts
        (``_scaling_curve``) when there are two or more; with one, that count's per-device rate is held:
        perfect data-parallel scaling, optimistic when scaling up (a larger gang spends more on
        collectives) and pessimistic when scaling down.
        """
        counts = self._counts(job_class, flavor)
        if not counts:
            return None
        below = [c for c in counts if c < devices]
        above = [c for c in counts if c > devices]
        if below and above:
            lo, hi = self.entries[(job_class, flavor, below[-1])], self.entries[(job_class, flavor, above[0])]
            t = (devices - lo.devices) / (hi.devices - lo.devices)
            per_device = lo.per_device + t * (hi.per_device - lo.per_device)
            basis = f"per-device rate interpolated between {lo.devices} and {hi.devices} devices"
            samples = min(lo.samples, hi.samples)
        else:
            nearest = self.entries[(job_class, flavor, below[-1] if below else above[0])]
            curve = self._scaling_curve(job_class, flavor, counts)
            samples = nearest.samples
            if curve is None:
                per_device = nearest.per_device
                basis = f"per-device rate of {nearest.devices} device(s) ({nearest.source}), scaled linearly"
            else:
                intercept, slope = curve
                per_device = 1.0 / (intercept + slope * (devices - 1))
                basis = (
                    f"scaling curve learned from {len(counts)} device counts ({counts[0]}-{counts[-1]}): "
                    f"{slope / intercept:.3g} of a device's time lost per device added"
                )
        return ThroughputEntry(
            job_class, flavor, devices, per_device * devices, Source.ESTIMATED, samples=samples, basis=basis
        )

    def _scaling_curve(self, job_class: str, flavor: str, counts: list[int]) -> tuple[float, float] | None:
        """How the per-device rate falls as the gang grows, from the stored counts: the time a device
        spends per sample is ``intercept + slope * (n - 1)`` (its own compute, plus a share of the
        collectives that grows with the gang), fitted by least squares; None with fewer than two
        counts, or when the fit says a device gets faster in a larger gang (noise; nothing to learn)."""
        if len(counts) < 2:
            return None
        xs = [float(n - 1) for n in counts]
        ys = [1.0 / self.entries[(job_class, flavor, n)].per_device for n in counts]
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        spread = sum((x - mean_x) ** 2 for x in xs)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
        intercept = mean_y - slope * mean_x
        if slope < 0 or intercept <= 0:
            return None
        return intercept, slope

    def _from_other_flavor(self, job_class: str, flavor: str, devices: int, peak: float) -> ThroughputEntry | None:
        """From the class on another flavor, times the ratio of the two flavors' peak bf16 figures.

        The other flavor is the one whose stored device count is nearest ``devices`` (then the one
        with more observations, then by name), so that as little scaling as possible is stacked.
        """
        candidates = []
        for other in {key[1] for key in self.entries if key[0] == job_class and key[1] != flavor}:
            other_peak = self.peak_tflops.get(other)
            if other_peak is None:
                continue
            counts = self._counts(job_class, other)
            nearest = min(counts, key=lambda c: (abs(c - devices), c))
            samples = self.entries[(job_class, other, nearest)].samples
            candidates.append((abs(nearest - devices), -samples, other, other_peak))
        if not candidates:
            return None
        _, _, other, other_peak = min(candidates)
        base = self.lookup(job_class, other, devices)
        return ThroughputEntry(
            job_class,
            flavor,
            devices,
            samples_per_s=base.samples_per_s * peak / other_peak,
            source=Source.ESTIMATED,
            samples=base.samples,
            basis=f"{other} ({base.basis or base.source}) times peak bf16 {peak:g}/{other_peak:g} TFLOP/s",
        )

    def measured_per_device(self) -> dict[tuple[str, str], float]:
        """Per-device samples/s by (class, flavor), at the smallest stored device count of each pair:
        the ``measured`` mapping that ``ThroughputMatrix`` takes. The smallest gang is the one least
        shaped by collectives, so its per-device rate is closest to what the chip itself does.
        Estimated entries are left out (the matrix makes its own estimates and marks them)."""
        smallest: dict[tuple[str, str], ThroughputEntry] = {}
        for entry in self.entries.values():
            if entry.source == Source.ESTIMATED:
                continue
            pair = (entry.job_class, entry.flavor)
            if pair not in smallest or entry.devices < smallest[pair].devices:
                smallest[pair] = entry
        return {pair: entry.per_device for pair, entry in smallest.items()}

    # -- changing (new tables) ---------------------------------------------------------------------

    def with_entries(self, entries: Iterable[ThroughputEntry]) -> ThroughputTable:
        """A new table with ``entries`` put in place of any of the same key."""
        merged = dict(self.entries)
        for i, entry in enumerate(entries):
            check_entry(entry, f"entries[{i}]")
            merged[entry.key] = replace(entry, basis="")
        return ThroughputTable(merged, self.peak_tflops)

    def learn(
        self, job_class: str, flavor: str, devices: int, samples_per_s: float, *, weight: float = LEARNING_WEIGHT
    ) -> ThroughputTable:
        """A new table with an observed samples/s folded into (class, flavor, devices).

        The update is an exponentially weighted moving average (``observation_weight``): the first
        measured observation replaces a benchmark figure, later ones move it by ``weight``.
        """
        if not 0 < weight <= 1:
            raise ValueError(f"weight must be in (0, 1], got {weight}")
        check_entry(ThroughputEntry(job_class, flavor, devices, samples_per_s, Source.MEASURED), "observation")
        previous = self.entries.get((job_class, flavor, devices))
        w = observation_weight(previous, weight)
        if previous is None or previous.source != Source.MEASURED:
            value, samples = float(samples_per_s), 1
        else:
            value, samples = (1 - w) * previous.samples_per_s + w * samples_per_s, previous.samples + 1
        entry = ThroughputEntry(job_class, flavor, devices, value, Source.MEASURED, samples=samples)
        check_entry(entry, "observation")
        return self.with_entries([entry])

    # -- JSON --------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "peak_tflops": dict(sorted(self.peak_tflops.items())),
            "entries": [entry.to_dict() for entry in self],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    @classmethod
    def from_dict(cls, raw: Any) -> ThroughputTable:
        if not isinstance(raw, dict):
            raise ThroughputTableError(
                "table", 'expected an object {"format": ..., "peak_tflops": ..., "entries": ...}'
            )
        if raw.get("format") != FORMAT:
            raise ThroughputTableError("format", f"expected {FORMAT!r}, got {raw.get('format')!r}")
        peaks = raw.get("peak_tflops", {})
        if not isinstance(peaks, dict):
            raise ThroughputTableError("peak_tflops", "expected an object mapping flavor to peak bf16 TFLOP/s")
        rows = raw.get("entries")
        if not isinstance(rows, list):
            raise ThroughputTableError("entries", "expected a list of entries")
        known = {"job_class", "flavor", "devices", "samples_per_s", "source", "samples"}
        entries = []
        for i, row in enumerate(rows):
            where = f"entries[{i}]"
            if not isinstance(row, dict):
                raise ThroughputTableError(where, "expected an object")
            for name in ("job_class", "flavor", "devices", "samples_per_s", "source"):
                if name not in row:
                    raise ThroughputTableError(f"{where}.{name}", "missing; every entry needs it")
            unknown = sorted(set(row) - known)
            if unknown:
                raise ThroughputTableError(
                    f"{where}.{unknown[0]}", f"unknown field; allowed: {', '.join(sorted(known))}"
                )
            try:
                source = Source(row["source"])
            except ValueError:
                raise ThroughputTableError(
                    f"{where}.source", f"must be one of {', '.join(Source)}, got {row['source']!r}"
                ) from None
            entries.append(
                ThroughputEntry(
                    job_class=row["job_class"],
                    flavor=row["flavor"],
                    devices=row["devices"],
                    samples_per_s=row["samples_per_s"],
                    source=source,
                    samples=row.get("samples", 0),
                )
            )
        return cls.of(entries, peaks)

    @classmethod
    def from_json(cls, text: str) -> ThroughputTable:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ThroughputTableError("table", f"not valid JSON ({exc})") from None
        return cls.from_dict(raw)
