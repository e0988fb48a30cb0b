"""Benchmarks that seed the throughput table, and two measurements for the scheduler.

- ``micro``: matmul TFLOP/s per dtype, memory bandwidth, host-device copy;
- ``macro``: training steps of small models (``resnet-small``, ``transformer-small``,
  ``synthetic-mlp``), in samples per second;
- ``suite``: both in one run (``python -m runtime.bench --quick --json``), and the throughput entries
  a run on a flavor seeds (run per flavor by ``runtime.backends.local.bench.benchmark_flavors``);
- ``balance.measure_balance_efficiency``: a mixed gang's samples/s over the sum of its ranks' solo
  samples/s;
- ``restart.measure_restart_cost``: seconds to checkpoint, restart a process, load and step.

Plain Python and torch; imported lazily by name so that ``import runtime.bench`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.bench.balance import BalanceMeasurement, measure_balance_efficiency
    from runtime.bench.restart import RestartMeasurement, measure_restart_cost
    from runtime.bench.suite import SuiteResult, benchmark_entries, run_suite, seed_table

_EXPORTS = {
    "BalanceMeasurement": "runtime.bench.balance",
    "measure_balance_efficiency": "runtime.bench.balance",
    "RestartMeasurement": "runtime.bench.restart",
    "measure_restart_cost": "runtime.bench.restart",
    "SuiteResult": "runtime.bench.suite",
    "benchmark_entries": "runtime.bench.suite",
    "run_suite": "runtime.bench.suite",
    "seed_table": "runtime.bench.suite",
}

__all__ = [
    "BalanceMeasurement",
    "RestartMeasurement",
    "SuiteResult",
    "benchmark_entries",
    "measure_balance_efficiency",
    "measure_restart_cost",
    "run_suite",
    "seed_table",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'runtime.bench' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
