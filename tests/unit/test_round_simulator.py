"""The round mechanism and the round simulator: tiny traces worked by hand, determinism, trace files.

Hand-worked traces use ``round_s = 100`` and rates of a few steps per second, so that every finish time
is a short sum. Each device of a tiny cluster is its own server unless a test says otherwise, so a
1-device job runs at the table's consolidated rate.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from runtime.scheduling.policies import POLICIES, Allocation, AllocationProblem, Config, get_policy
from runtime.scheduling.rounds import RoundJob, plan_round, worth_moving
from runtime.simulate.rounds import Cluster, RoundResult, run_rounds, summarize
from runtime.simulate.trace import (
    SimJob,
    ThroughputTable,
    TraceError,
    generate_trace,
    load_gavel_throughputs,
    load_trace,
    write_trace,
)

GAVEL = Path(__file__).resolve().parents[2] / "bench" / "data" / "gavel"

V1, K1 = Config.of(v100=1), Config.of(k80=1)

# --------------------------------------------------------------------------------------------------
# Builders


def table(rates: Mapping[tuple[str, str, int], float | tuple[float, float]]) -> ThroughputTable:
    """(job type, flavor, devices) -> rate, the same consolidated or not; or (consolidated, spread)."""
    out: dict[tuple[str, str, int, bool], float] = {}
    for (job_type, flavor, devices), rate in rates.items():
        packed, spread = rate if isinstance(rate, tuple) else (rate, rate)
        out[(job_type, flavor, devices, True)] = packed
        out[(job_type, flavor, devices, False)] = spread
    return ThroughputTable(out)


def sim(job_id: int, at: float, steps: float, job_type: str = "A", devices: int = 1, **kwargs) -> SimJob:
    return SimJob(job_id=job_id, arrival_s=at, job_type=job_type, devices=devices, total_steps=steps, **kwargs)


class FixedPolicy:
    """A policy that always answers the same allocation: the simulator's accounting, without an LP."""

    name = "fixed"
    aware = False
    mixes = False

    def __init__(self, allocation: Allocation) -> None:
        self.allocation = allocation

    def allocate(self, problem: AllocationProblem) -> Allocation:
        return {j.job_id: dict(self.allocation.get(j.job_id, {})) for j in problem.jobs}


# A: 2 steps/s on v100, 1 on k80 (1 device).
FAST_SLOW = table({("A", "v100", 1): 2.0, ("A", "k80", 1): 1.0})
ONE_RATE = table({("A", "v100", 1): 1.0})


# --------------------------------------------------------------------------------------------------
# Hand-worked traces


def test_fifo_trace_by_hand():
    """Cluster 1 v100 + 1 k80 (v100 first, so FIFO breaks ties towards it); round 100 s.

    Round 0 (t=0): jobs 1 and 2 arrived. FIFO: job 1 sees 1 v100 / 1 k80 left, a tie, takes v100 (its
    first flavor); job 2 takes the k80.
      job 1: 300 steps at 2/s -> 200 in round 0, 100 left.
      job 2: 50 steps at 1/s -> finishes mid-round at t=50 (recorded exactly); the k80 then idles.
    Job 3 arrives at t=30, mid-round: it waits for the boundary at t=100 even though the k80 is free at 50.
    Round 1 (t=100): job 1 keeps v100 (FIFO never moves a running job) and finishes at 100 + 100/2 = 150;
      job 3 gets the k80: 80 steps at 1/s -> finishes at 180.
    JCT: 150, 50, 150. Makespan 180. Busy device-s: 150 + 50 + 80 = 280; offered 2 * 180 = 360.
    """
    trace = [sim(1, 0.0, 300.0), sim(2, 0.0, 50.0), sim(3, 30.0, 80.0)]
    result = run_rounds(trace, Cluster({"v100": 1, "k80": 1}), get_policy("fifo"), FAST_SLOW, round_s=100.0)
    assert result.finish_s == pytest.approx({1: 150.0, 2: 50.0, 3: 180.0})
    assert result.jct_s == pytest.approx({1: 150.0, 2: 50.0, 3: 150.0})
    assert result.makespan_s == pytest.approx(180.0)
    assert result.busy_device_s == pytest.approx(280.0)
    assert result.capacity_device_s == pytest.approx(360.0)
    assert result.rounds == 2
    assert result.allocations == 2  # t=0 (arrivals), t=100 (job 2 done, job 3 arrived)
    summary = summarize(result)
    assert summary.jobs == 3
    assert summary.utilization == pytest.approx(280 / 360)
    assert summary.makespan_h == pytest.approx(180 / 3600)
    assert summary.avg_jct_h == pytest.approx(350 / 3 / 3600)


def test_an_idle_cluster_jumps_to_the_next_round_boundary():
    """Job 1 arrives at t=250 on an empty cluster: the clock jumps to the grid (t=300), not to 250.
    100 steps at 1/s: finish 400, JCT 150. The makespan counts from t=0, not from the first arrival, so
    the cluster offered 1 device for 400 s (busy 100)."""
    result = run_rounds([sim(1, 250.0, 100.0)], Cluster({"v100": 1}), get_policy("fifo"), ONE_RATE, round_s=100.0)
    assert result.finish_s == pytest.approx({1: 400.0})
    assert result.jct_s == pytest.approx({1: 150.0})
    assert result.rounds == 1
    assert summarize(result).utilization == pytest.approx(100 / 400)


def test_restart_cost_on_first_start_not_while_continuing():
    """1 v100 at 1 step/s, round 100 s, restart 10 s. FIFO: job 1 then job 2.

    Round 0: job 1 starts: 10 s lost, 90 steps done, 60 left. (restart 1)
    Round 1: job 1 continues in the same configuration: no cost; 60 steps -> finishes at 160.
    Round 2 (t=200): job 2 starts: 10 s lost, 50 steps -> finishes at 200 + 10 + 50 = 260. (restart 2)
    Busy: job 1 100 + 60, job 2 10 + 50 = 220 device-s. Without the cost: 150 and 250.
    """
    trace = [sim(1, 0.0, 150.0), sim(2, 0.0, 50.0)]
    cluster = Cluster({"v100": 1})
    result = run_rounds(trace, cluster, get_policy("fifo"), ONE_RATE, round_s=100.0, restart_cost_s=10.0)
    assert result.finish_s == pytest.approx({1: 160.0, 2: 260.0})
    assert result.restarts == 2
    assert result.busy_device_s == pytest.approx(220.0)
    free = run_rounds(trace, cluster, get_policy("fifo"), ONE_RATE, round_s=100.0)
    assert free.finish_s == pytest.approx({1: 150.0, 2: 250.0})


def test_restart_cost_after_a_wait():
    """Two jobs time-share 1 v100 (a fixed allocation of 1/2 each), 1 step/s, round 100 s, restart 10 s.

    Priority = fraction / (share of its age it ran there); never run -> infinite; ties -> smaller id.
    Round 0 (t=0): both infinite: job 1 starts (restart 1): 90 steps, 60 left. Ran 100 of 100 s.
    Round 1 (t=100): job 1 0.5 / (100/100) = 0.5, job 2 infinite: job 2 starts (restart 2): 90 steps,
      10 left.
    Round 2 (t=200): job 1 0.5 / (100/200) = 1, job 2 the same: tie, job 1. It waited a round, so it
      pays again (restart 3): 60 steps after 10 s -> finishes at 270.
    Round 3 (t=300): job 2 alone, back after a wait (restart 4): 10 steps after 10 s -> finishes at 320.
    Busy: job 1 100 + 70, job 2 100 + 20 = 290 of 320 offered.
    Without the cost: round 0 job 1 (50 left), round 1 job 2 finishes at 200 exactly, round 2 job 1 at 250.
    """
    trace = [sim(1, 0.0, 150.0), sim(2, 0.0, 100.0)]
    policy = FixedPolicy({1: {V1: 0.5}, 2: {V1: 0.5}})
    cluster = Cluster({"v100": 1})
    result = run_rounds(trace, cluster, policy, ONE_RATE, round_s=100.0, restart_cost_s=10.0)
    assert result.finish_s == pytest.approx({1: 270.0, 2: 320.0})
    assert result.restarts == 4
    assert result.rounds == 4
    assert result.busy_device_s == pytest.approx(290.0)
    assert summarize(result).utilization == pytest.approx(290 / 320)
    free = run_rounds(trace, cluster, policy, ONE_RATE, round_s=100.0)
    assert free.finish_s == pytest.approx({1: 250.0, 2: 200.0})


def test_a_mixed_gang_runs_at_the_balanced_sum_of_its_devices():
    """A mixable 2-device job of type B on 1 v100 + 1 k80: no flavor has 2 devices, so only the mix fits.
    B's 2-device unconsolidated gang rates: v100 6/s, k80 2/s (consolidated ones differ, and must not be
    used). Mixed rate = efficiency * (1 * 6/2 + 1 * 2/2) = 0.5 * 4 = 2 steps/s.
    300 steps: 200 in round 0, 100 more in round 1 -> finishes at 150. Both rounds ran a mix.
    """
    rates = table({("B", "v100", 2): (100.0, 6.0), ("B", "k80", 2): (100.0, 2.0)})
    cluster = Cluster({"v100": 1, "k80": 1})
    trace = [sim(1, 0.0, 300.0, "B", 2)]
    result = run_rounds(trace, cluster, get_policy("mixed"), rates, round_s=100.0, balance_efficiency=0.5)
    assert result.finish_s == pytest.approx({1: 150.0})
    assert result.mixed_rounds == 2
    assert result.busy_device_s == pytest.approx(2 * 150.0)
    # With perfect balance: 4 steps/s -> 75 s.
    full = run_rounds(trace, cluster, get_policy("mixed"), rates, round_s=100.0)
    assert full.finish_s == pytest.approx({1: 75.0})
    # A policy that cannot mix cannot place it at all.
    with pytest.raises(ValueError, match="cannot hold it"):
        run_rounds(trace, cluster, get_policy("aware"), rates, round_s=100.0)


def test_consolidated_rate_only_within_a_server():
    """Servers of 2 v100: a 2-device gang fits on one (consolidated, 4/s), a 4-device one does not
    (unconsolidated, 5/s rather than 8/s). 400 steps each on 4 v100 under FIFO: job 1 (4 devices) holds
    every device from t=0 and needs 400 / 5 = 80 s; job 2 (2 devices) starts at the next round, t=100,
    and needs 400 / 4 = 100 s -> 200."""
    rates = table({("C", "v100", 2): (4.0, 3.0), ("C", "v100", 4): (8.0, 5.0)})
    cluster = Cluster({"v100": 4}, devices_per_server={"v100": 2})
    trace = [sim(1, 0.0, 400.0, "C", 4), sim(2, 0.0, 400.0, "C", 2)]
    result = run_rounds(trace, cluster, get_policy("fifo"), rates, round_s=100.0)
    assert result.finish_s == pytest.approx({1: 80.0, 2: 200.0})


def test_summarize_percentiles_interpolate_linearly():
    # JCTs 100, 200, 300, 1000 s. p50: position 3 * 0.5 = 1.5 -> 200 + 0.5 * 100 = 250.
    # p99: position 3 * 0.99 = 2.97 -> 300 + 0.97 * 700 = 979. As numpy's default.
    result = RoundResult(policy="x", arrival_s={1: 0.0, 2: 0.0, 3: 50.0, 4: 0.0})
    result.finish_s = {1: 100.0, 2: 200.0, 3: 350.0, 4: 1000.0}
    summary = summarize(result)
    assert summary.p50_jct_h * 3600 == pytest.approx(250.0)
    assert summary.p99_jct_h * 3600 == pytest.approx(979.0)
    assert summary.p99_jct_h * 3600 == pytest.approx(float(np.percentile([100, 200, 300, 1000], 99)))
    assert summary.avg_jct_h * 3600 == pytest.approx(400.0)
    assert summary.utilization == 0.0  # no capacity recorded
    one = RoundResult(policy="x", arrival_s={1: 0.0}, finish_s={1: 36.0})
    assert summarize(one).p50_jct_h == summarize(one).p99_jct_h == pytest.approx(0.01)


def test_tenant_share_held_against_entitled():
    """2 v100, 1 step/s, round 100 s, FIFO. Tenant 1: jobs 1 and 2 (1 device, 300 steps, t=0). Tenant 2:
    job 3 (1 device, 100 steps) at t=50, admitted at t=100 but FIFO keeps both devices with tenant 1.

    Held: tenant 1 2 * 300 = 600 device-s (jobs 1, 2 finish at 300); tenant 2 100 (job 3: 300 -> 400).
    Entitled (water-fill of 2 devices over the tenants' demand, per round):
      t=0: only tenant 1 asks (2): 2 * 100.  t=100, 200: both ask (2 and 1): 1 each.  t=300: tenant 2, 1.
      tenant 1: 200 + 100 + 100 = 400; tenant 2: 100 + 100 + 100 = 300.
    """
    trace = [sim(1, 0.0, 300.0, tenant_id=1), sim(2, 0.0, 300.0, tenant_id=1), sim(3, 50.0, 100.0, tenant_id=2)]
    result = run_rounds(trace, Cluster({"v100": 2}), get_policy("fifo"), ONE_RATE, round_s=100.0)
    assert result.finish_s == pytest.approx({1: 300.0, 2: 300.0, 3: 400.0})
    summary = summarize(result)
    expected = {1: (600 / 3600, 400 / 3600), 2: (100 / 3600, 300 / 3600)}
    assert set(summary.tenant_share) == {1, 2}
    for tenant, (held, entitled) in expected.items():
        assert summary.tenant_share[tenant] == pytest.approx((held, entitled))
    assert summary.utilization == pytest.approx(700 / 800)
    # Tenant 2 weighs twice as much: 2 devices split 4/3 : 2/3, but it asks for only 1 -> 1 : 1 still.
    weighted = run_rounds(
        trace, Cluster({"v100": 2}), get_policy("fifo"), ONE_RATE, round_s=100.0, tenant_weights={1: 1.0, 2: 2.0}
    )
    for tenant, share in summary.tenant_share.items():
        assert summarize(weighted).tenant_share[tenant] == pytest.approx(share)


def test_aware_time_sharing_invariants():
    """Three identical 1-device jobs on 2 v100 under aware: time sharing whose order depends on the LP's
    last digits, so check what must hold. Every job finishes; with one flavor, one rate and no restart
    cost every held device-second does one step, so busy = total steps; busy <= capacity * makespan; and
    the makespan is at least the work over the devices, rounded up to the grid only by the last round."""
    trace = [sim(1, 0.0, 250.0), sim(2, 0.0, 250.0), sim(3, 0.0, 250.0)]
    result = run_rounds(trace, Cluster({"v100": 2}), get_policy("aware"), ONE_RATE, round_s=100.0)
    assert set(result.finish_s) == {1, 2, 3}
    assert result.busy_device_s == pytest.approx(750.0)
    assert result.busy_device_s <= result.capacity_device_s + 1e-9
    assert result.makespan_s >= 750.0 / 2
    # Work conserving: both devices busy every round until fewer than two jobs are left.
    assert result.makespan_s <= 500.0


def test_run_rounds_rejects_bad_arguments():
    cluster = Cluster({"v100": 1})
    with pytest.raises(ValueError, match="round_s"):
        run_rounds([sim(1, 0.0, 1.0)], cluster, get_policy("fifo"), ONE_RATE, round_s=0.0)
    with pytest.raises(ValueError, match="balance_efficiency"):
        run_rounds([sim(1, 0.0, 1.0)], cluster, get_policy("fifo"), ONE_RATE, balance_efficiency=1.5)
    with pytest.raises(ValueError, match="job 1: no flavor"):
        run_rounds([sim(1, 0.0, 1.0, "unknown")], cluster, get_policy("fifo"), ONE_RATE)


class NoProgress(Exception):
    pass


def give_up_after(rounds: int):
    def progress(done: int, total: int, now_s: float) -> None:
        if now_s >= rounds * 100.0:
            raise NoProgress(f"{done}/{total} jobs done after {rounds} rounds")

    return progress


def test_a_restart_cost_of_a_whole_round_is_rejected():
    # Two jobs time-share one device. Each turn is a restart (the other job ran the round before), and a
    # restart of >= round_s leaves no useful time: no job would ever finish. So it is refused up front,
    # as round_s <= 0 is. (The progress callback would stop an endless loop after 50 rounds.)
    trace = [sim(1, 0.0, 150.0), sim(2, 0.0, 100.0)]
    with pytest.raises(ValueError, match="restart_cost_s"):
        run_rounds(
            trace,
            Cluster({"v100": 1}),
            FixedPolicy({1: {V1: 0.5}, 2: {V1: 0.5}}),
            ONE_RATE,
            round_s=100.0,
            restart_cost_s=100.0,
            progress=give_up_after(50),
        )


# --------------------------------------------------------------------------------------------------
# Determinism on a generated trace


@pytest.fixture(scope="module")
def gavel_table() -> ThroughputTable:
    return load_gavel_throughputs(GAVEL / "throughputs.csv")


SIZES = ((1, 0.7), (2, 0.2), (4, 0.1))


def generated(gavel_table: ThroughputTable, seed: int) -> list[SimJob]:
    return generate_trace(gavel_table, jobs=40, jobs_per_hour=6.0, seed=seed, tenants=2, sizes=SIZES)


def test_generate_trace_is_seeded(gavel_table: ThroughputTable):
    first = generated(gavel_table, 3)
    assert first == generated(gavel_table, 3)
    assert first != generated(gavel_table, 4)
    assert [j.job_id for j in first] == list(range(40))
    assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(first))
    assert {j.devices for j in first} <= {1, 2, 4}
    assert {j.tenant_id for j in first} == {0, 1}
    assert all(gavel_table.knows(j.job_type, j.devices) and j.total_steps > 0 for j in first)
    with pytest.raises(TraceError, match="sizes"):
        generate_trace(gavel_table, jobs=1, jobs_per_hour=1.0, seed=0, sizes=((3, 1.0),))


@pytest.mark.parametrize("name", list(POLICIES))
def test_the_same_trace_always_gives_the_same_result(gavel_table: ThroughputTable, name: str):
    trace = generated(gavel_table, 3)
    cluster = Cluster({"v100": 4, "p100": 4, "k80": 4}, devices_per_server={"v100": 4, "p100": 4, "k80": 4})

    def once() -> RoundResult:
        return run_rounds(trace, cluster, get_policy(name), gavel_table, round_s=1800.0, restart_cost_s=60.0)

    first, second = once(), once()
    assert set(first.finish_s) == {j.job_id for j in trace}
    assert first.finish_s == second.finish_s  # exactly
    assert (first.rounds, first.restarts, first.busy_device_s) == (second.rounds, second.restarts, second.busy_device_s)
    assert first.busy_device_s <= first.capacity_device_s
    assert all(first.finish_s[j.job_id] > j.arrival_s for j in trace)


# --------------------------------------------------------------------------------------------------
# plan_round


def rate_table(rates: Mapping[tuple[int, Config], float]):
    return lambda job_id, config: rates.get((job_id, config), 1.0)


def test_plan_round_gives_the_job_behind_its_share_the_turn():
    # Both are allocated half the v100; job 1 ran 80 of its 100 s (priority 0.5 / 0.8 = 0.625), job 2 ran
    # 20 (0.5 / 0.2 = 2.5): job 2 goes first.
    allocation = {1: {V1: 0.5}, 2: {V1: 0.5}}
    jobs = [RoundJob(1, 100.0, received_s={V1: 80.0}), RoundJob(2, 100.0, received_s={V1: 20.0})]
    plan = plan_round(allocation, jobs, {"v100": 1}, rate=rate_table({}), round_s=100.0)
    assert plan == {2: V1}
    # Swap the history and job 1 goes first; the plan depends on received time, not on list order.
    jobs = [RoundJob(2, 100.0, received_s={V1: 80.0}), RoundJob(1, 100.0, received_s={V1: 20.0})]
    assert plan_round(allocation, jobs, {"v100": 1}, rate=rate_table({}), round_s=100.0) == {1: V1}
    # Never run: infinite priority, ahead of any job that has run.
    jobs = [RoundJob(1, 100.0, received_s={V1: 1.0}), RoundJob(2, 100.0)]
    assert plan_round(allocation, jobs, {"v100": 1}, rate=rate_table({}), round_s=100.0) == {2: V1}


def test_plan_round_never_exceeds_capacity():
    rng = random.Random(11)
    flavors = ("v100", "p100", "k80")
    for _ in range(200):
        capacity = {f: rng.randint(0, 4) for f in flavors}
        jobs: list[RoundJob] = []
        allocation: Allocation = {}
        for job_id in range(rng.randint(1, 8)):
            options = [Config.from_mapping({f: rng.randint(0, 3) for f in flavors}) for _ in range(3)]
            options = [c for c in options if c.devices > 0]
            allocation[job_id] = {c: rng.random() / len(options) for c in options}
            jobs.append(
                RoundJob(
                    job_id,
                    age_s=rng.choice([0.0, 100.0, 1000.0]),
                    current=rng.choice([None, *options]) if options else None,
                    received_s={c: rng.uniform(0, 100) for c in options if rng.random() < 0.5},
                    configs=options,
                )
            )
        plan = plan_round(
            allocation, jobs, capacity, rate=lambda j, c: float(c.devices + j % 3), round_s=100.0, restart_cost_s=10.0
        )
        for flavor in flavors:
            assert sum(c.count(flavor) for c in plan.values()) <= capacity[flavor]
        assert set(plan) <= {j.job_id for j in jobs}


def test_work_conserving_fill_gives_idle_devices_to_waiting_jobs():
    # Two v100 and a k80; the policy gave job 1 one v100 and job 2 nothing. Job 2 may run on v100
    # (rate 3) or k80 (rate 1): the fill gives it the fastest configuration that fits, a v100.
    allocation: Allocation = {1: {V1: 1.0}, 2: {}}
    jobs = [RoundJob(1, 100.0, received_s={V1: 100.0}), RoundJob(2, 100.0, configs=(K1, V1))]
    rates = rate_table({(2, V1): 3.0, (2, K1): 1.0})
    capacity = {"v100": 2, "k80": 1}
    assert plan_round(allocation, jobs, capacity, rate=rates, round_s=100.0) == {1: V1, 2: V1}
    # Gavel's behaviour: the idle devices stay idle.
    assert plan_round(allocation, jobs, capacity, rate=rates, round_s=100.0, work_conserving=False) == {1: V1}
    # Only the k80 left: the fill takes what fits.
    assert plan_round(allocation, jobs, {"v100": 1, "k80": 1}, rate=rates, round_s=100.0) == {1: V1, 2: K1}
    # Nothing left: job 2 waits.
    assert plan_round(allocation, jobs, {"v100": 1}, rate=rates, round_s=100.0) == {1: V1}


def test_fill_order_waiting_longest_first_allocated_configuration_before_faster():
    # One idle v100 and two waiting jobs outside the allocation: job 3 has run 10% of its life, job 2 50%:
    # job 3 gets it.
    allocation: Allocation = {1: {V1: 1.0}}
    jobs = [
        RoundJob(1, 100.0, received_s={V1: 100.0}),
        RoundJob(2, 100.0, received_s={V1: 50.0}, configs=(V1,)),
        RoundJob(3, 100.0, received_s={V1: 10.0}, configs=(V1,)),
    ]
    assert plan_round(allocation, jobs, {"v100": 2}, rate=rate_table({}), round_s=100.0) == {1: V1, 3: V1}
    # A configuration listed in the allocation comes before a faster one. (The priority pass skips
    # zero fractions, so a listed configuration that fits reaches the fill only at fraction 0.)
    allocation = {1: {V1: 1.0}, 2: {K1: 0.0}}
    jobs = [RoundJob(1, 100.0, received_s={V1: 100.0}), RoundJob(2, 100.0, configs=(V1, K1))]
    rates = rate_table({(2, V1): 5.0, (2, K1): 1.0})
    assert plan_round(allocation, jobs, {"v100": 2, "k80": 1}, rate=rates, round_s=100.0) == {1: V1, 2: K1}
    # A job that ran last round is offered its own configuration first: staying costs no restart.
    jobs = [RoundJob(1, 100.0, received_s={V1: 100.0}), RoundJob(2, 100.0, current=K1, configs=(V1, K1))]
    assert plan_round({1: {V1: 1.0}}, jobs, {"v100": 2, "k80": 1}, rate=rates, round_s=100.0) == {1: V1, 2: K1}


def test_a_running_job_moves_only_when_the_move_pays_for_its_restart():
    # Job 1 runs on k80 at 1 step/s; the policy now wants it on v100. Round 100 s, restart 10 s.
    # v100 at 1.05: 1.05 * 90 = 94.5 steps < 100 staying put -> it stays on k80.
    # v100 at 2: 2 * 90 = 180 > 100 -> it moves.
    allocation = {1: {V1: 1.0}}
    job = RoundJob(1, 100.0, current=K1, received_s={K1: 100.0}, configs=(K1, V1))
    capacity = {"v100": 1, "k80": 1}
    slow = rate_table({(1, K1): 1.0, (1, V1): 1.05})
    fast = rate_table({(1, K1): 1.0, (1, V1): 2.0})

    def plan(rate, restart_cost_s: float = 10.0, work_conserving: bool = True) -> dict[int, Config]:
        return plan_round(
            allocation,
            [job],
            capacity,
            rate=rate,
            round_s=100.0,
            restart_cost_s=restart_cost_s,
            work_conserving=work_conserving,
        )

    assert plan(slow) == {
        1: K1
    }  # not moved; it keeps its k80 (staying costs nothing), though the policy gave it no time
    assert plan(slow, work_conserving=False) == {}  # only allocated configurations: it waits rather than move
    assert plan(fast) == {1: V1}
    # Free restarts: any faster configuration is worth it.
    assert plan(slow, restart_cost_s=0.0) == {1: V1}
    # A job that did not run last round has nothing to keep: it goes where the policy says.
    waiting = RoundJob(1, 100.0, received_s={K1: 100.0}, configs=(K1, V1))
    assert plan_round(allocation, [waiting], capacity, rate=slow, round_s=100.0, restart_cost_s=10.0) == {1: V1}


def test_the_move_rule_never_lets_a_job_keep_a_fast_device_for_good():
    # Two identical jobs, one fast device (a: 10 steps/s) and one slow (b: 5). Max-min gives each half its
    # time on each. Moving from a to b never pays, but that must not pin job 1 to a: the job on b moves up
    # to a when its turn comes (a faster move pays), and the displaced job fills in on b.
    a, b = Config.of(a=1), Config.of(b=1)
    allocation = {1: {a: 0.5, b: 0.5}, 2: {a: 0.5, b: 0.5}}
    rate = rate_table({(1, a): 10.0, (1, b): 5.0, (2, a): 10.0, (2, b): 5.0})
    current: dict[int, Config | None] = {1: None, 2: None}
    received = {1: {a: 0.0, b: 0.0}, 2: {a: 0.0, b: 0.0}}
    work = {1: 0.0, 2: 0.0}
    for round_no in range(20):
        jobs = [RoundJob(j, 100.0 * round_no, current[j], dict(received[j]), (a, b)) for j in (1, 2)]
        plan = plan_round(allocation, jobs, {"a": 1, "b": 1}, rate=rate, round_s=100.0, restart_cost_s=30.0)
        for j in (1, 2):
            current[j] = plan.get(j)
            if current[j] is not None:
                received[j][current[j]] += 100.0
                work[j] += rate(j, current[j]) * 100.0
    assert received[1][a] == received[2][a] == 1000.0  # the fast device, shared equally
    assert work[1] == work[2]


def test_worth_moving():
    assert worth_moving(1.0, 2.0, round_s=100.0, restart_cost_s=10.0)  # 180 > 100
    assert not worth_moving(1.0, 1.05, round_s=100.0, restart_cost_s=10.0)  # 94.5 < 100
    assert not worth_moving(0.9, 1.0, round_s=100.0, restart_cost_s=10.0)  # 90 == 90: not a gain
    assert not worth_moving(1.0, 100.0, round_s=100.0, restart_cost_s=100.0)  # the whole round lost
    assert not worth_moving(1.0, 100.0, round_s=100.0, restart_cost_s=500.0)
    assert worth_moving(1.0, 1.01, round_s=100.0, restart_cost_s=0.0)
    assert not worth_moving(1.0, 1.0, round_s=100.0, restart_cost_s=0.0)


# --------------------------------------------------------------------------------------------------
# Trace files


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_trace_round_trip(tmp_path: Path):
    jobs = [sim(1, 0.0, 100.0, tenant_id=2, flavors=("v100", "k80")), sim(2, 12.5, 3.25, devices=1)]
    write_trace(tmp_path / "t.csv", jobs)
    back = load_trace(tmp_path / "t.csv", ONE_RATE)
    assert back == jobs


def test_the_bundled_gavel_data_loads(gavel_table: ThroughputTable):
    assert gavel_table.flavors == ("k80", "p100", "v100")
    rate = gavel_table.steps_per_s("LM (batch size 10)", "v100", 2, consolidated=False)
    assert rate == pytest.approx(35.14049049611691)
    assert len(load_trace(GAVEL / "trace_continuous_300.csv", gavel_table)) == 300
    assert len(load_trace(GAVEL / "trace_static_multi_100.csv", gavel_table)) == 100


@pytest.mark.parametrize("missing", ["job_id", "arrival_s", "job_type", "num_gpus", "total_steps"])
def test_a_trace_missing_a_column_names_it(tmp_path: Path, missing: str):
    columns = ["job_id", "arrival_s", "job_type", "num_gpus", "total_steps"]
    values = {"job_id": "1", "arrival_s": "0", "job_type": "A", "num_gpus": "1", "total_steps": "10"}
    kept = [c for c in columns if c != missing]
    path = write(tmp_path / "t.csv", ",".join(kept) + "\n" + ",".join(values[c] for c in kept) + "\n")
    with pytest.raises(TraceError, match=f"column '{missing}' missing"):
        load_trace(path)


def test_a_duplicate_job_id_names_the_field_and_line(tmp_path: Path):
    path = write(tmp_path / "t.csv", "job_id,arrival_s,job_type,num_gpus,total_steps\n7,0,A,1,10\n7,5,A,1,10\n")
    with pytest.raises(TraceError, match=r"t\.csv:3: job_id 7 appears twice"):
        load_trace(path)


def test_a_job_type_not_in_the_table_names_the_field(tmp_path: Path):
    path = write(tmp_path / "t.csv", "job_id,arrival_s,job_type,num_gpus,total_steps\n1,0,A,1,10\n2,0,Z,1,10\n")
    with pytest.raises(TraceError, match=r"t\.csv:3: job_type 'Z' with num_gpus 1 is not in the throughput table"):
        load_trace(path, ONE_RATE)
    # A known type at a size the table lacks is the same error.
    path = write(tmp_path / "u.csv", "job_id,arrival_s,job_type,num_gpus,total_steps\n1,0,A,2,10\n")
    with pytest.raises(TraceError, match="num_gpus 2"):
        load_trace(path, ONE_RATE)
    assert load_trace(path)[0].devices == 2  # without a table, nothing to check against


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("x,0,A,1,10", "job_id 'x' is not a number"),
        ("1,soon,A,1,10", "arrival_s 'soon' is not a number"),
        ("1,0,A,0,10", "num_gpus must be >= 1"),
        ("1,0,A,1,0", "total_steps > 0"),
        ("1,-5,A,1,10", "arrival_s >= 0"),
        ("1,0,A,1,inf", "total_steps 'inf' is not a finite number"),
        ("1,nan,A,1,10", "arrival_s 'nan' is not a finite number"),
        ("1,0,A,1.9,10", "num_gpus '1.9' is not a whole number"),
        ("1,0,A,1e400,10", "num_gpus '1e400' is not a finite number"),
    ],
)
def test_a_bad_trace_value_names_the_field(tmp_path: Path, row: str, message: str):
    path = write(tmp_path / "t.csv", "job_id,arrival_s,job_type,num_gpus,total_steps\n" + row + "\n")
    with pytest.raises(TraceError, match=message):
        load_trace(path)


def test_a_throughput_table_missing_a_column_names_it(tmp_path: Path):
    path = write(tmp_path / "th.csv", "job_type,v100_steps_per_s\nA,1.0\n")
    with pytest.raises(TraceError, match="column 'scale_factor' missing"):
        load_gavel_throughputs(path)
    path = write(tmp_path / "th2.csv", "job_type,scale_factor,v100_steps_per_s\nA,1,fast\n")
    with pytest.raises(TraceError, match="v100_steps_per_s 'fast' is not a number"):
        load_gavel_throughputs(path)
    path = write(tmp_path / "th3.csv", "job_type,scale_factor,v100_steps_per_s\n")
    with pytest.raises(TraceError, match="no throughputs"):
        load_gavel_throughputs(path)
    # Without an unconsolidated column, the packed rate serves for both.
    path = write(tmp_path / "th4.csv", "job_type,scale_factor,v100_steps_per_s\nA,2,3.5\n")
    assert load_gavel_throughputs(path).rates == {("A", "v100", 2, True): 3.5, ("A", "v100", 2, False): 3.5}
