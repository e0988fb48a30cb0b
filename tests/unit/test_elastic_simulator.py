"""Elastic jobs in the round simulator: the trace model, rates on other counts, the workloads module, and a
small trace worked by hand on which ``elastic`` beats ``aware``."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from pathlib import Path

import pytest

from runtime.scheduling.policies import Config, get_policy
from runtime.simulate.rounds import Cluster, JobRates, run_rounds, summarize
from runtime.simulate.trace import (
    SimJob,
    ThroughputTable,
    TraceError,
    load_gavel_throughputs,
    load_trace,
    make_elastic,
    write_trace,
)
from runtime.simulate.workloads import (
    SIA_CLUSTER,
    extend_counts,
    fit_comm_overhead,
    queue_growth,
    ring_factor,
    sia_like_workload,
    sustainable,
)

GAVEL = Path(__file__).resolve().parents[2] / "bench" / "data" / "gavel"


def table(rates: Mapping[tuple[str, str, int], float]) -> ThroughputTable:
    """(job type, flavor, devices) -> rate, the same packed or spread."""
    return ThroughputTable({(t, f, n, packed): r for (t, f, n), r in rates.items() for packed in (True, False)})


def sim(job_id: int, at: float, steps: float, devices: int = 1, **kwargs) -> SimJob:
    return SimJob(job_id=job_id, arrival_s=at, job_type="A", devices=devices, total_steps=steps, **kwargs)


# --------------------------------------------------------------------------------------------------
# The trace model


@pytest.mark.parametrize(("devices", "low", "high"), [(1, 1, 2), (2, 1, 4), (3, 2, 6), (4, 2, 8), (8, 4, 16)])
def test_make_elastic_allows_half_to_twice_the_count(devices: int, low: int, high: int):
    (job,) = make_elastic([sim(0, 0.0, 10.0, devices)])
    assert job.device_range == (low, high) and job.elastic and job.batch == "fixed"


def test_bad_ranges_and_batch_rules_are_refused_with_the_field_named():
    with pytest.raises(TraceError, match="device range"):
        sim(0, 0.0, 1.0, 4, min_devices=5, max_devices=8)
    with pytest.raises(TraceError, match="noise_scale"):
        sim(0, 0.0, 1.0, 2, batch="scales")
    with pytest.raises(TraceError, match="low"):
        make_elastic([sim(0, 0.0, 1.0)], low=2.0)
    assert not sim(0, 0.0, 1.0, 2).elastic


def test_elastic_columns_round_trip_through_a_trace_file(tmp_path: Path):
    jobs = [*make_elastic([sim(0, 0.0, 10.0, 2), sim(1, 5.0, 20.0, 4)]), sim(2, 9.0, 5.0, 1)]
    scaling = SimJob(3, 12.0, "A", 2, 7.0, min_devices=1, max_devices=4, batch="scales", noise_scale=3.0)
    write_trace(tmp_path / "t.csv", [*jobs, scaling])
    assert load_trace(tmp_path / "t.csv") == [*jobs, scaling]
    write_trace(tmp_path / "rigid.csv", [sim(0, 0.0, 1.0)])
    assert "min_gpus" not in (tmp_path / "rigid.csv").read_text()


# --------------------------------------------------------------------------------------------------
# Rates on counts other than the requested one

# One device: 10 steps/s. Two: 16 (each step of the pair spends 2/16 s: 1/10 s computing, 0.025 s exchanging).
SCALING = table({("A", "v100", 1): 10.0, ("A", "v100", 2): 16.0, ("A", "v100", 4): 24.0})


def rates(server: int = 8) -> JobRates:
    return JobRates(SCALING, Cluster({"v100": 8}, {"v100": server}), 1.0)


def test_a_fixed_batch_split_over_more_devices_computes_faster_but_exchanges_as_long():
    job = sim(0, 0.0, 100.0, 1, min_devices=1, max_devices=2)
    # The job's batch is one device's: on two devices each computes half (0.05 s), then exchanges (0.025 s).
    assert rates()(job, Config.of(v100=2)) == pytest.approx(1 / (0.05 + 0.025))
    assert rates()(job, Config.of(v100=1)) == 10.0  # its own count: the table's rate
    big = sim(1, 0.0, 100.0, 2, min_devices=1, max_devices=4)
    # Its batch is two devices'; on one device, no exchange: 2 batches at 10/s.
    assert rates()(big, Config.of(v100=1)) == pytest.approx(10.0)


def test_a_scaling_batch_keeps_the_gang_rate_times_its_statistical_efficiency():
    job = SimJob(0, 0.0, "A", 1, 100.0, min_devices=1, max_devices=4, batch="scales", noise_scale=3.0)
    # Four times the batch: progress per sample (3 + 1) / (3 + 4).
    assert rates()(job, Config.of(v100=4)) == pytest.approx(24.0 * 4 / 7)


def test_a_count_the_table_lacks_has_no_rate_until_the_table_is_extended():
    job = sim(0, 0.0, 100.0, 2, min_devices=1, max_devices=3)
    assert rates()(job, Config.of(v100=3)) == 0.0
    extended = JobRates(extend_counts(SCALING, 8), Cluster({"v100": 8}, {"v100": 8}), 1.0)
    assert 16.0 < extended(sim(1, 0.0, 1.0, 3), Config.of(v100=3)) < 24.0


def test_the_fitted_overhead_reproduces_a_ring_exchange_and_keeps_measured_rates():
    # Built from kappa = 0.02 s: rate(m) = m / (0.1 + 0.02 * 2 (m - 1) / m).
    ring = table({("A", "v100", m): m / (0.1 + 0.02 * ring_factor(m)) for m in (1, 2, 4)})
    assert fit_comm_overhead(ring)[("A", "v100", True)] == pytest.approx(0.02)
    extended = extend_counts(ring, 16)
    assert extended.steps_per_s("A", "v100", 16, consolidated=True) == pytest.approx(16 / (0.1 + 0.02 * 30 / 16))
    assert extended.steps_per_s("A", "v100", 4, consolidated=True) == ring.steps_per_s(
        "A", "v100", 4, consolidated=True
    )
    # Sub-linear: more devices are faster, each one less so.
    speeds = [extended.steps_per_s("A", "v100", m, consolidated=True) or 0.0 for m in range(1, 17)]
    assert all(a < b and a / m > b / (m + 1) for m, (a, b) in enumerate(itertools.pairwise(speeds), start=1))


def test_a_type_measured_on_one_device_only_is_not_extended():
    single = table({("A", "v100", 1): 5.0})
    assert extend_counts(single, 4).rates == single.rates


# --------------------------------------------------------------------------------------------------
# The simulator


def test_elastic_beats_aware_on_a_small_trace_worked_by_hand():
    """4 v100, rate linear in the count (10 steps/s a device). Job 0 asks for 2 devices (1..4), 36,000 steps;
    job 1 arrives at 3,600 s asking for 2 (1..4), 3,600 steps. Rounds of 360 s, restarts of 36 s.

    aware: job 0 on 2 devices from 0 s: 36 s restart, then 20 steps/s: done at 36 + 1,800 = 1,836 s; job 1
    arrives after, runs alone: done at 3,600 + 36 + 180 = 3,816 s. JCTs 1,836 and 216 s.
    elastic: job 0 alone takes all 4 devices: 36 + 900 = 936 s; job 1 takes 4: 3,600 + 36 + 90 = 3,726 s.
    JCTs 936 and 126 s."""
    linear = table({("A", "v100", m): 10.0 * m for m in (1, 2, 3, 4)})
    trace = make_elastic([sim(0, 0.0, 36_000.0, 2), sim(1, 3600.0, 3_600.0, 2)])
    cluster = Cluster({"v100": 4}, {"v100": 4})
    results = {
        name: run_rounds(trace, cluster, get_policy(name), linear, round_s=360.0, restart_cost_s=36.0)
        for name in ("aware", "elastic")
    }
    assert results["aware"].jct_s == pytest.approx({0: 1836.0, 1: 216.0})
    assert results["elastic"].jct_s == pytest.approx({0: 936.0, 1: 126.0})


def test_an_elastic_job_shrinks_to_let_a_newcomer_run_when_that_pays():
    """2 v100, linear rates. Job 0 (2 devices, 1..2) runs alone, then a short job arrives: the elastic policy
    gives each one device rather than making the newcomer wait for the long job."""
    linear = table({("A", "v100", m): 10.0 * m for m in (1, 2)})
    trace = make_elastic([sim(0, 0.0, 200_000.0, 2), sim(1, 360.0, 3_000.0, 1)])
    result = run_rounds(trace, Cluster({"v100": 2}, {"v100": 2}), get_policy("elastic"), linear, round_s=360.0)
    assert result.jct_s[1] == pytest.approx(300.0)  # started at once on one device: 3,000 steps at 10/s
    assert result.finish_s[0] < 200_000.0 / 20 + 2 * 360.0  # and job 0 lost only that stretch at half speed


def test_every_round_of_the_elastic_policy_fits_the_pool_on_gavel_s_static_trace():
    gavel = load_gavel_throughputs(GAVEL / "throughputs.csv")
    trace = make_elastic(load_trace(GAVEL / "trace_static_multi_100.csv", gavel)[:30])
    cluster = Cluster({"k80": 12, "p100": 12, "v100": 12}, {"k80": 12, "p100": 12, "v100": 12})
    result = run_rounds(trace, cluster, get_policy("elastic"), extend_counts(gavel, 16), restart_cost_s=30.0)
    assert set(result.finish_s) == {j.job_id for j in trace}
    assert result.busy_device_s <= result.capacity_device_s
    assert summarize(result).avg_jct_h > 0 and result.allocations == result.rounds  # asked every round


# --------------------------------------------------------------------------------------------------
# Sia-like workloads and sustainability


def test_sia_like_workloads_are_deterministic_and_have_the_published_shape():
    gavel = load_gavel_throughputs(GAVEL / "throughputs.csv")
    first = sia_like_workload(gavel, jobs=120, jobs_per_hour=30.0, seed=3)
    assert first.jobs == sia_like_workload(gavel, jobs=120, jobs_per_hour=30.0, seed=3).jobs
    assert first.jobs != sia_like_workload(gavel, jobs=120, jobs_per_hour=30.0, seed=4).jobs
    assert set(first.models.values()) == {"image", "language", "speech"}
    assert {first.models[j.job_type] for j in first.jobs} == {"image", "language", "speech"}
    assert len(first.cluster) == 3 and first.cluster == SIA_CLUSTER
    hours = first.jobs[-1].arrival_s / 3600
    assert 120 / hours == pytest.approx(30.0, rel=0.3)  # Poisson at the asked rate
    for job in first.jobs:
        low, high = job.device_range
        assert low == max(1, math.ceil(job.devices / 2)) and high == 2 * job.devices
        for count in range(low, high + 1):
            assert first.table.steps_per_s(job.job_type, "v100", count, consolidated=False)


@pytest.mark.parametrize(
    ("finish_after", "stable"),
    [
        (lambda i: 100.0, True),  # every job done 100 s after it arrives: a steady queue
        (lambda i: 100.0 * i, False),  # each job waits longer than the last: the queue grows
    ],
)
def test_queue_growth_tells_a_steady_queue_from_a_growing_one(finish_after, stable: bool):
    arrivals = [10.0 * i for i in range(400)]
    finishes = [a + finish_after(i) for i, a in enumerate(arrivals)]
    assert sustainable(arrivals, finishes) is stable
    assert queue_growth(arrivals, finishes) == pytest.approx(1.0 if stable else 2.33, rel=0.05)
