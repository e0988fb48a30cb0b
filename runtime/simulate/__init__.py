"""Trace-driven cluster simulators that run the production scheduling code on a virtual clock.

- ``admission``: the admission cycle (quotas, cohorts, fair share, preemption) at every arrival and
  completion, as the control plane runs it (``runtime.scheduling.schedule``).
- ``rounds``: placement policies (``runtime.scheduling.policies``) and the round mechanism
  (``runtime.scheduling.rounds``) over a throughput table, for job completion times, makespan and
  utilization; ``python -m runtime.simulate`` is its command line.
- ``forecast``: when waiting jobs would start, the live snapshot played forward with the same
  ``schedule`` (the advisor's start estimate at submit).
- ``trace``: Gavel's trace and throughput formats, and a seeded trace generator.
"""

from runtime.simulate.admission import SimResult, TraceJob, simulate, water_fill
from runtime.simulate.forecast import Forecast, Work, forecast_starts
from runtime.simulate.rounds import Cluster, JobRates, RoundResult, Summary, run_rounds, summarize
from runtime.simulate.trace import (
    SimJob,
    ThroughputTable,
    TraceError,
    generate_trace,
    load_gavel_throughputs,
    load_trace,
    write_trace,
)

__all__ = [
    "Cluster",
    "Forecast",
    "JobRates",
    "RoundResult",
    "SimJob",
    "SimResult",
    "Summary",
    "ThroughputTable",
    "TraceError",
    "TraceJob",
    "Work",
    "forecast_starts",
    "generate_trace",
    "load_gavel_throughputs",
    "load_trace",
    "run_rounds",
    "simulate",
    "summarize",
    "water_fill",
    "write_trace",
]
