"""The benchmark suite: micro and macro benchmarks in one run, and the throughput entries they seed."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from runtime.bench.macro import WORKLOADS, TrainingRate, training_rate
from runtime.bench.micro import DTYPES, Measurement, host_device_copy_gbps, matmul_tflops, memory_bandwidth_gbps
from runtime.throughput.table import Source, ThroughputEntry, ThroughputTable
from runtime.worker.config import StepHook

# Seconds per benchmark. Quick: the whole suite in well under 10 s on two CPU cores.
QUICK_BUDGET_S = 0.25
FULL_BUDGET_S = 1.5


@dataclass(frozen=True)
class SuiteResult:
    host: dict[str, Any]
    micro: tuple[Measurement, ...] = ()
    macro: tuple[TrainingRate, ...] = ()
    wall_s: float = 0.0
    settings: dict[str, Any] = field(default_factory=dict)  # what the run was asked for (quick, emulation...)

    def rate(self, job_class: str) -> TrainingRate | None:
        return next((r for r in self.macro if r.job_class == job_class), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "settings": self.settings,
            "wall_s": self.wall_s,
            "micro": [m.to_dict() for m in self.micro],
            "macro": [r.to_dict() for r in self.macro],
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SuiteResult:
        return cls(
            host=dict(raw["host"]),
            micro=tuple(Measurement.from_dict(m) for m in raw.get("micro", [])),
            macro=tuple(TrainingRate.from_dict(r) for r in raw.get("macro", [])),
            wall_s=float(raw.get("wall_s", 0.0)),
            settings=dict(raw.get("settings", {})),
        )


def host_info() -> dict[str, Any]:
    return {
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def run_suite(
    *,
    quick: bool = False,
    micro: bool = True,
    macro: bool = True,
    job_classes: Sequence[str] | None = None,
    dtypes: Sequence[str] = tuple(DTYPES),
    step_hooks: Sequence[StepHook] = (),
    settings: Mapping[str, Any] | None = None,
) -> SuiteResult:
    """Run the micro-benchmarks (unless ``micro=False``) and the training steps of each job class.

    ``step_hooks`` are called after each training step (not during micro-benchmarks, which have no
    steps); a backend passes its emulation here.
    """
    budget = QUICK_BUDGET_S if quick else FULL_BUDGET_S
    classes = list(job_classes) if job_classes is not None else list(WORKLOADS)
    for name in classes:
        if name not in WORKLOADS:
            raise ValueError(f"job class {name!r} has no benchmark; choose from {', '.join(WORKLOADS)}")
    started = time.perf_counter()
    measurements: list[Measurement] = []
    if micro:
        measurements += [matmul_tflops(dtype, budget) for dtype in dtypes]
        measurements.append(memory_bandwidth_gbps(budget_s=budget))
        measurements += host_device_copy_gbps(budget_s=budget)
    rates = [training_rate(WORKLOADS[name](), budget * 2, step_hooks) for name in classes] if macro else []
    return SuiteResult(
        host=host_info(),
        micro=tuple(measurements),
        macro=tuple(rates),
        wall_s=time.perf_counter() - started,
        settings={"quick": quick, **(settings or {})},
    )


def benchmark_entries(flavor: str, result: SuiteResult) -> list[ThroughputEntry]:
    """One-device ``benchmark`` entries of ``flavor`` from a suite run on that flavor."""
    return [
        ThroughputEntry(rate.job_class, flavor, 1, rate.samples_per_s, Source.BENCHMARK, samples=rate.steps)
        for rate in result.macro
    ]


def seed_table(results: Mapping[str, SuiteResult], peak_tflops: Mapping[str, float] | None = None) -> ThroughputTable:
    """A table seeded from suite runs per flavor (``{flavor: result}``)."""
    return ThroughputTable.of(
        [entry for flavor, result in sorted(results.items()) for entry in benchmark_entries(flavor, result)],
        peak_tflops,
    )
