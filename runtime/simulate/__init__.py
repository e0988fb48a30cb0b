"""Trace-driven cluster simulators that run the production scheduling code on a virtual clock.

- ``admission``: the admission cycle (quotas, cohorts, fair share, preemption) at every arrival and
  completion, as the control plane runs it (``runtime.scheduling.schedule``).
- ``rounds``: placement policies (``runtime.scheduling.policies``) and the round mechanism
  (``runtime.scheduling.rounds``) over a throughput table, for job completion times, makespan and
  utilization; ``python -m runtime.simulate`` is its command line.
- ``forecast``: when waiting jobs would start, the live snapshot played forward with the same
  ``schedule`` (the advisor's start estimate at submit).
- ``trace``: Gavel's trace and throughput formats, elastic jobs (``make_elastic``), and a seeded trace generator.
- ``workloads``: scaling curves fitted to a throughput table (``extend_counts``), Sia-like elastic workloads,
  and the queue-growth test of a sustainable arrival rate.
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
    make_elastic,
    write_trace,
)
from runtime.simulate.workloads import extend_counts, queue_growth, sia_like_workload, sustainable

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
    "extend_counts",
    "forecast_starts",
    "generate_trace",
    "load_gavel_throughputs",
    "load_trace",
    "make_elastic",
    "queue_growth",
    "run_rounds",
    "sia_like_workload",
    "simulate",
    "summarize",
    "sustainable",
    "water_fill",
    "write_trace",
]
