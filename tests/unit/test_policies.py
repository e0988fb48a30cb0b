"""Placement policies: capacity is respected by every policy, and small cases agree with hand-solved LPs.

Rates in these tests come from a per-device table: a job's rate in a configuration is the sum over its
devices of that job's per-device rate on each flavor (so a mixed configuration's rate is the sum of its
devices' rates). Normalized scores are what ``_build`` computes: rate / (the job's single-flavor rates
averaged with the pool's capacity per flavor as weights) * the job's device count.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from runtime.scheduling import policies as policies_module
from runtime.scheduling.policies import (
    POLICIES,
    Allocation,
    AllocationProblem,
    Config,
    MaxMinAwarePolicy,
    MixedGangPolicy,
    Policy,
    PolicyJob,
    SolverError,
    configs_for,
    get_policy,
    normalized_score,
    preferred_flavors,
)

TOL = 1e-6

# --------------------------------------------------------------------------------------------------
# Builders


def job(
    job_id: int,
    devices: int = 1,
    flavors: tuple[str, ...] = ("v100",),
    *,
    at: float | None = None,
    **kwargs,
) -> PolicyJob:
    """A job that arrived at ``at`` (default: its id, so ids are arrival order)."""
    return PolicyJob(
        job_id=job_id, devices=devices, flavors=flavors, submitted_at=float(job_id if at is None else at), **kwargs
    )


def per_device(table: Mapping[tuple[int, str], float]):
    """Rate function: the sum over a configuration's devices of the job's per-device rate on that flavor."""

    def rate(policy_job: PolicyJob, config: Config) -> float:
        return sum(count * table.get((policy_job.job_id, flavor), 1.0) for flavor, count in config.counts)

    return rate


def problem(jobs: list[PolicyJob], capacity: Mapping[str, int], table: Mapping[tuple[int, str], float] | None = None):
    return AllocationProblem(jobs=jobs, capacity=capacity, rate=per_device(table or {}))


def all_policies() -> list[Policy]:
    return [
        *(get_policy(name) for name in POLICIES),
        MaxMinAwarePolicy(surplus=None),
        MaxMinAwarePolicy(surplus="throughput"),
        MixedGangPolicy(surplus=None),
    ]


def policy_id(policy: Policy) -> str:
    return f"{policy.name}-{getattr(policy, 'surplus', '')}"


def score(alloc: Allocation, p: AllocationProblem, job_id: int) -> float:
    """A job's normalized score per unit of time under ``alloc``."""
    (pj,) = [j for j in p.jobs if j.job_id == job_id]
    return sum(x * normalized_score(pj, c, p.rate, p.capacity) for c, x in alloc[job_id].items())


# Two 1-device jobs, each 4x / 2x faster on v100 than on k80 (the hand-solved case (a)).
SPEEDUPS = {(1, "v100"): 4.0, (1, "k80"): 1.0, (2, "v100"): 2.0, (2, "k80"): 1.0}
BOTH = ("v100", "k80")

PROBLEMS = {
    "speedups-1+1": problem([job(1, flavors=BOTH), job(2, flavors=BOTH)], {"v100": 1, "k80": 1}, SPEEDUPS),
    "speedups-1+2": problem([job(1, flavors=BOTH), job(2, flavors=BOTH)], {"v100": 1, "k80": 2}, SPEEDUPS),
    "three-on-two": problem([job(1), job(2), job(3)], {"v100": 2}),
    "zero-capacity-flavor": problem([job(1, flavors=("k80",)), job(2), job(3)], {"v100": 2, "k80": 0}),
    "unknown-flavor": problem([job(1, flavors=("tpu",)), job(2)], {"v100": 1}),
    "nothing-runs": problem([job(1, 4), job(2, 3)], {"v100": 2}),
    "two-and-one": problem([job(1, 2), job(2, 1)], {"v100": 2}),
    "mixable-4-on-2+2": problem(
        [job(1, 4, BOTH, mixable=True), job(2, 1, BOTH)],
        {"v100": 2, "k80": 2},
        {(1, "v100"): 3.0, (1, "k80"): 1.0, (2, "v100"): 2.0, (2, "k80"): 1.5},
    ),
    "oversubscribed": problem(
        [job(i, 2, ("a", "b"), mixable=i % 2 == 0) for i in range(1, 6)],
        {"a": 3, "b": 2},
        {(i, f): r for i in range(1, 6) for f, r in (("a", 1.0 + i), ("b", 1.0))},
    ),
    "assorted": problem(
        [
            job(1, 1, ("v100", "p100", "k80"), weight=2.0, remaining_steps=100.0),
            job(2, 2, ("p100", "v100"), tenant_id=1, mixable=True, remaining_steps=5000.0),
            job(3, 4, ("v100", "p100", "k80"), mixable=True, current=Config.of(v100=4)),
            job(4, 1, ("k80",), current=Config.of(k80=1)),
            job(5, 8, ("v100", "p100", "k80"), mixable=True),
            job(6, 2, ("k80", "p100"), weight=0.5),
        ],
        {"v100": 4, "p100": 3, "k80": 4},
        {
            (j, f): r
            for j, speed in ((1, 3.0), (2, 1.5), (3, 2.5), (4, 1.0), (5, 2.0), (6, 1.2))
            for f, r in (("v100", speed), ("p100", (speed + 1) / 2), ("k80", 1.0))
        },
    ),
}


# --------------------------------------------------------------------------------------------------
# Invariants, every policy on every problem


@pytest.mark.parametrize("policy", all_policies(), ids=policy_id)
@pytest.mark.parametrize("name", list(PROBLEMS))
def test_allocations_respect_job_and_flavor_capacity(policy: Policy, name: str):
    p = PROBLEMS[name]
    alloc = policy.allocate(p)
    assert set(alloc) == {j.job_id for j in p.jobs}
    for pj in p.jobs:
        fractions = alloc[pj.job_id]
        assert all(x >= 0 for x in fractions.values())
        assert sum(fractions.values()) <= 1 + TOL, (pj.job_id, fractions)
        # Only configurations the job may run in, on this pool, mixing only when the policy mixes.
        assert set(fractions) <= set(configs_for(pj, p.capacity, mixes=policy.mixes))
    for flavor, capacity in p.capacity.items():
        used = sum(x * c.count(flavor) for fractions in alloc.values() for c, x in fractions.items())
        assert used <= capacity + TOL, (flavor, used)


@pytest.mark.parametrize("policy", all_policies(), ids=policy_id)
@pytest.mark.parametrize("name", list(PROBLEMS))
def test_same_problem_twice_gives_the_same_allocation(policy: Policy, name: str):
    assert policy.allocate(PROBLEMS[name]) == policy.allocate(PROBLEMS[name])


# --------------------------------------------------------------------------------------------------
# (a) Heterogeneity-aware max-min, solved by hand


def test_normalized_scores_match_the_hand_computation():
    # Pool: 1 v100 + 1 k80. Job 1 runs at 4 (v100) and 1 (k80): its average device does (4*1 + 1*1) / 2
    # = 2.5, so it scores 4 / 2.5 = 1.6 on v100 and 1 / 2.5 = 0.4 on k80. Job 2 (2 and 1): average 1.5,
    # scores 4/3 and 2/3.
    p = PROBLEMS["speedups-1+1"]
    j1, j2 = p.jobs
    v100, k80 = Config.of(v100=1), Config.of(k80=1)
    assert normalized_score(j1, v100, p.rate, p.capacity) == pytest.approx(1.6)
    assert normalized_score(j1, k80, p.rate, p.capacity) == pytest.approx(0.4)
    assert normalized_score(j2, v100, p.rate, p.capacity) == pytest.approx(4 / 3)
    assert normalized_score(j2, k80, p.rate, p.capacity) == pytest.approx(2 / 3)
    # Device count multiplies: a 2-device gang on 2 v100 at twice the per-device rate scores the same per
    # device as a 1-device job, i.e. 2 * (2 * 4) / (2 * 4) = 2 when its pool is v100 only.
    big = job(9, 2)
    assert normalized_score(big, Config.of(v100=2), per_device({(9, "v100"): 4.0}), {"v100": 2}) == pytest.approx(2.0)


@pytest.mark.parametrize("policy", [MaxMinAwarePolicy(), MaxMinAwarePolicy(surplus=None), get_policy("mixed")])
def test_aware_max_min_on_one_v100_and_one_k80(policy: Policy):
    # Let a = job 1's v100 time. At the optimum both devices are busy and each job runs all the time,
    # so job 1 has k80 for 1 - a, job 2 has v100 for 1 - a and k80 for a:
    #   score1 = 1.6 a + 0.4 (1 - a) = 0.4 + 1.2 a
    #   score2 = 4/3 (1 - a) + 2/3 a = 4/3 - 2/3 a
    # score1 rises and score2 falls in a, so the max-min is where they meet: 1.8667 a = 0.9333, a = 1/2,
    # min score = 1.0. Unique: any other point lowers one of the two.
    p = PROBLEMS["speedups-1+1"]
    alloc = policy.allocate(p)
    assert min(score(alloc, p, 1), score(alloc, p, 2)) == pytest.approx(1.0, abs=1e-4)
    v100, k80 = Config.of(v100=1), Config.of(k80=1)
    assert alloc[1][v100] == pytest.approx(0.5, abs=1e-4)
    assert alloc[1][k80] == pytest.approx(0.5, abs=1e-4)
    assert alloc[2][v100] == pytest.approx(0.5, abs=1e-4)
    assert alloc[2][k80] == pytest.approx(0.5, abs=1e-4)


@pytest.mark.parametrize("policy", [MaxMinAwarePolicy(), MaxMinAwarePolicy(surplus=None)])
def test_aware_max_min_on_one_v100_and_two_k80(policy: Policy):
    # With 2 k80 the averages shift: job 1 (4, 1): (4*1 + 1*2) / 3 = 2 -> scores 2 (v100), 0.5 (k80);
    # job 2 (2, 1): (2 + 2) / 3 = 4/3 -> scores 1.5, 0.75. The v100 is the only scarce device (each job
    # needs at most one k80), so with a = job 1's v100 time, job 2 gets 1 - a of it and both run full time:
    #   score1 = 2 a + 0.5 (1 - a) = 0.5 + 1.5 a
    #   score2 = 1.5 (1 - a) + 0.75 a = 1.5 - 0.75 a
    # Equal at 2.25 a = 1: a = 4/9, min score = 0.5 + 1.5 * 4/9 = 7/6. The job with the larger speedup gets
    # less of the v100 than half, yet the same normalized score.
    p = PROBLEMS["speedups-1+2"]
    alloc = policy.allocate(p)
    assert min(score(alloc, p, 1), score(alloc, p, 2)) == pytest.approx(7 / 6, abs=1e-4)
    v100, k80 = Config.of(v100=1), Config.of(k80=1)
    assert alloc[1][v100] == pytest.approx(4 / 9, abs=1e-4)
    assert alloc[1][k80] == pytest.approx(5 / 9, abs=1e-4)
    assert alloc[2][v100] == pytest.approx(5 / 9, abs=1e-4)
    assert alloc[2][k80] == pytest.approx(4 / 9, abs=1e-4)


# --------------------------------------------------------------------------------------------------
# (b), (c), (d) Speed-blind max-min


def test_fair_three_single_device_jobs_on_two_devices():
    # Speed-blind: each job scores 1 per unit of time on one device. Max t with x_i >= t and
    # x_1 + x_2 + x_3 <= 2: t = 2/3, and each x_i must then be exactly 2/3.
    alloc = get_policy("fair").allocate(PROBLEMS["three-on-two"])
    for job_id in (1, 2, 3):
        assert alloc[job_id] == {Config.of(v100=1): pytest.approx(2 / 3, abs=1e-6)}


@pytest.mark.parametrize("policy", all_policies(), ids=policy_id)
def test_a_job_whose_only_flavor_has_no_capacity_gets_nothing(policy: Policy):
    # Job 1 can only use k80, of which there are none; jobs 2 and 3 share the 2 v100 as if it were absent.
    p = PROBLEMS["zero-capacity-flavor"]
    assert configs_for(p.jobs[0], p.capacity, mixes=True) == []
    alloc = policy.allocate(p)
    assert alloc[1] == {}
    assert alloc[2] == {Config.of(v100=1): pytest.approx(1.0, abs=1e-6)}
    assert alloc[3] == {Config.of(v100=1): pytest.approx(1.0, abs=1e-6)}


@pytest.mark.parametrize("policy", all_policies(), ids=policy_id)
def test_no_job_can_run_gives_empty_allocations(policy: Policy):
    assert policy.allocate(PROBLEMS["nothing-runs"]) == {1: {}, 2: {}}


def test_fair_weights_device_time_by_gang_size():
    # Job 1 has 2 devices (scores 2 per unit of time), job 2 has 1 (scores 1), pool of 2 devices:
    #   max t: 2 x1 >= t, x2 >= t, 2 x1 + x2 <= 2, x2 <= 1.
    # 2 x1 = x2 = t and 2 x1 + x2 = 2 give t = 1: x2 = 1 (job 2 runs all the time) and x1 = 1/2 (job 1
    # half the time): each holds 1 device-time unit. Unique, because x2 <= 1 forces t <= 1.
    alloc = get_policy("fair").allocate(PROBLEMS["two-and-one"])
    assert alloc[1] == {Config.of(v100=2): pytest.approx(0.5, abs=1e-6)}
    assert alloc[2] == {Config.of(v100=1): pytest.approx(1.0, abs=1e-6)}


def test_fair_weight_asks_for_a_larger_share():
    # Weighted: x1 >= 2 t, x2 >= t, x1 + x2 <= 1 (one device): t = 1/3, x1 = 2/3, x2 = 1/3.
    p = problem([job(1, weight=2.0), job(2)], {"v100": 1})
    alloc = get_policy("fair").allocate(p)
    assert alloc[1][Config.of(v100=1)] == pytest.approx(2 / 3, abs=1e-6)
    assert alloc[2][Config.of(v100=1)] == pytest.approx(1 / 3, abs=1e-6)


# --------------------------------------------------------------------------------------------------
# (e) Max throughput


def test_max_throughput_puts_the_larger_speedup_on_the_fast_flavor():
    # Scores (see above): job 1 1.6 / 0.4, job 2 4/3 / 2/3. Total with a = job 1's v100 time, both busy:
    #   0.4 + 1.2 a + 4/3 - 2/3 a = 1.733 + 0.533 a, largest at a = 1: job 1 on v100, job 2 on k80
    # (total 2.267, against 1.733 the other way round).
    alloc = get_policy("max_throughput").allocate(PROBLEMS["speedups-1+1"])
    assert alloc[1] == {Config.of(v100=1): pytest.approx(1.0, abs=1e-6)}
    assert alloc[2] == {Config.of(k80=1): pytest.approx(1.0, abs=1e-6)}


# --------------------------------------------------------------------------------------------------
# (f) Mixed gangs


def test_configs_for_enumerates_mixes():
    four = job(1, 4, ("v100", "k80"), mixable=True)
    # 2 v100 + 2 k80: no single flavor holds 4; the splits of 4 over (k80, v100) are 1+3, 2+2, 3+1, and
    # only 2+2 fits.
    assert configs_for(four, {"v100": 2, "k80": 2}, mixes=True) == [Config.of(v100=2, k80=2)]
    assert configs_for(four, {"v100": 2, "k80": 2}, mixes=False) == []
    # Ample pool of 3 flavors: 3 single-flavor + 3 pairs * 3 splits + 1 triple * C(3, 2) = 3 splits = 15.
    ample = {"v100": 8, "p100": 8, "k80": 8}
    every = job(2, 4, ("v100", "p100", "k80"), mixable=True)
    configs = configs_for(every, ample, mixes=True)
    assert len(configs) == 15 == len(set(configs))
    assert all(c.devices == 4 for c in configs)
    assert configs[:3] == [Config.of(v100=4), Config.of(p100=4), Config.of(k80=4)]  # the job's order first
    assert sum(c.mixed for c in configs) == 12
    # 8 devices over 3 flavors, in steps of 2 (a quarter of the gang): 3 singles + 3 pairs * (2+6, 4+4, 6+2)
    # + 1 triple * (2+2+4, 2+4+2, 4+2+2) = 15; any larger gang has the same 12 mixes at most.
    assert len(configs_for(job(3, 8, ("v100", "p100", "k80"), mixable=True), ample, mixes=True)) == 15
    huge = {"v100": 64, "p100": 64, "k80": 64}
    assert len(configs_for(job(7, 64, ("v100", "p100", "k80"), mixable=True), huge, mixes=True)) == 15
    # Not mixable, or one device, or one allowed flavor: singles only.
    assert len(configs_for(job(4, 4, ("v100", "p100", "k80")), ample, mixes=True)) == 3
    assert len(configs_for(job(5, 1, ("v100", "p100", "k80"), mixable=True), ample, mixes=True)) == 3
    assert configs_for(job(6, 4, ("v100",), mixable=True), ample, mixes=True) == [Config.of(v100=4)]


def test_mixed_runs_a_gang_that_only_fits_as_a_mix_and_aware_does_not():
    # A mixable 4-device job on 2 v100 + 2 k80 has one configuration, 2 v100 + 2 k80, at the rate
    # 2 * 3 + 2 * 1 = 8 (the rate function sums per-device rates). Alone, max-min gives it all the time.
    jobs = [job(1, 4, BOTH, mixable=True)]
    p = problem(jobs, {"v100": 2, "k80": 2}, {(1, "v100"): 3.0, (1, "k80"): 1.0})
    assert p.rate(jobs[0], Config.of(v100=2, k80=2)) == 8.0
    alloc = get_policy("mixed").allocate(p)
    assert alloc == {1: {Config.of(v100=2, k80=2): pytest.approx(1.0, abs=1e-6)}}
    assert get_policy("aware").allocate(p) == {1: {}}
    assert get_policy("fair").allocate(p) == {1: {}}
    assert get_policy("fifo").allocate(p) == {1: {}}


def test_mixed_shares_with_a_single_flavor_job():
    # Job 1: the mixable 4-device gang, one configuration (2 v100 + 2 k80, rate 2*3 + 2*1 = 8); no
    # single-flavor rate to average, so it is normalized by its best rate: score 8 / 8 * 4 = 4.
    # Job 2 (1 device, 2 on v100, 1.5 on k80): average (2*2 + 1.5*2) / 4 = 1.75, scores 8/7 and 6/7.
    # Capacity rows are time averages: v100 2 x1 + y_v <= 2, k80 2 x1 + y_k <= 2; and y_v + y_k <= 1.
    # Job 2's best is 8/7 (v100 all the time), which leaves x1 <= 1/2, i.e. 4 x1 <= 2 >= 8/7: the max-min
    # floor is 8/7 with y_v = 1 and x1 anywhere in [2/7, 1/2]. Stage 2 (surplus "shortest", no work left
    # known, so plain score) pushes x1 to 1/2. Note what the LP's averages allow: the mix runs half the
    # time while job 2 holds a v100 all the time, which no single round can do at once; the rounds
    # mechanism approximates it.
    p = PROBLEMS["mixable-4-on-2+2"]
    mixed = get_policy("mixed").allocate(p)
    assert mixed[1] == {Config.of(v100=2, k80=2): pytest.approx(0.5, abs=1e-4)}
    assert mixed[2][Config.of(v100=1)] == pytest.approx(1.0, abs=1e-4)
    assert mixed[2].get(Config.of(k80=1), 0.0) == pytest.approx(0.0, abs=1e-4)
    assert min(score(mixed, p, 1), score(mixed, p, 2)) == pytest.approx(8 / 7, abs=1e-4)
    # Without stage 2 the floor is the same; x1 is only known to lie in [2/7, 1/2].
    plain = MixedGangPolicy(surplus=None).allocate(p)
    assert min(score(plain, p, 1), score(plain, p, 2)) == pytest.approx(8 / 7, abs=1e-4)
    assert 2 / 7 - 1e-4 <= plain[1][Config.of(v100=2, k80=2)] <= 1 / 2 + 1e-4
    # aware cannot mix: the gang gets nothing and job 2 runs all the time.
    aware = get_policy("aware").allocate(p)
    assert aware[1] == {}
    assert sum(aware[2].values()) == pytest.approx(1.0, abs=1e-6)


# --------------------------------------------------------------------------------------------------
# (g) FIFO


def test_fifo_runs_in_arrival_order_not_list_order():
    p = problem([job(2, at=5.0), job(1, at=10.0)], {"v100": 1})
    assert get_policy("fifo").allocate(p) == {2: {Config.of(v100=1): 1.0}, 1: {}}
    # Equal arrival times: the smaller id first.
    p = problem([job(7, at=0.0), job(3, at=0.0)], {"v100": 1})
    assert get_policy("fifo").allocate(p) == {3: {Config.of(v100=1): 1.0}, 7: {}}


def test_fifo_keeps_a_running_job_in_its_configuration():
    # Job 2 arrived later but runs on the only v100; FIFO never preempts, so job 1 waits. Job 3 runs on
    # k80 and keeps it, though k80 is job 3's second choice.
    jobs = [
        job(1, flavors=BOTH),
        job(2, flavors=BOTH, current=Config.of(v100=1)),
        job(3, flavors=BOTH, current=Config.of(k80=1)),
    ]
    alloc = get_policy("fifo").allocate(problem(jobs, {"v100": 1, "k80": 1}))
    assert alloc == {2: {Config.of(v100=1): 1.0}, 3: {Config.of(k80=1): 1.0}, 1: {}}


def test_fifo_backfills_around_a_job_that_does_not_fit():
    # 2 devices: job 1 takes one; job 2 needs 2 and waits; job 3 (later, 1 device) takes the other.
    p = problem([job(1), job(2, 2), job(3)], {"v100": 2})
    assert get_policy("fifo").allocate(p) == {1: {Config.of(v100=1): 1.0}, 2: {}, 3: {Config.of(v100=1): 1.0}}


def test_fifo_is_blind_to_speed_and_spreads_load():
    # The flavor with the most devices left, ties by the job's own order of flavors; never the fastest.
    jobs = [job(1, flavors=("v100", "k80")), job(2, flavors=("k80", "v100")), job(3, flavors=("v100", "k80"))]
    table = {(j, "v100"): 10.0 for j in (1, 2, 3)}
    alloc = get_policy("fifo").allocate(problem(jobs, {"v100": 2, "k80": 3}, table))
    # left v100 2, k80 3: job 1 -> k80 (3 > 2); left 2/2: job 2 ties, its first is k80; left 2/1: job 3 v100.
    assert alloc == {1: {Config.of(k80=1): 1.0}, 2: {Config.of(k80=1): 1.0}, 3: {Config.of(v100=1): 1.0}}


# --------------------------------------------------------------------------------------------------
# preferred_flavors (how admission follows a policy)


def test_preferred_flavors_orders_by_allocated_time():
    # max_throughput puts job 1 on v100 and job 2 on k80 (see above); aware on 1 v100 + 2 k80 gives job 1
    # 4/9 v100 and 5/9 k80, so k80 comes first for it, and job 2 (5/9 v100) v100 first.
    p = PROBLEMS["speedups-1+1"]
    pending = list(p.jobs)
    assert preferred_flavors(get_policy("max_throughput"), pending, [], p.capacity, p.rate) == {
        1: ("v100", "k80"),
        2: ("k80", "v100"),
    }
    p2 = PROBLEMS["speedups-1+2"]
    assert preferred_flavors(get_policy("aware"), pending, [], p2.capacity, p2.rate) == {
        1: ("k80", "v100"),
        2: ("v100", "k80"),
    }
    # A running job holds the only v100 under FIFO: the pending job is told k80 first.
    running = [job(3, flavors=BOTH, at=-1.0, current=Config.of(v100=1))]
    assert preferred_flavors(get_policy("fifo"), [job(4, flavors=BOTH)], running, p.capacity, p.rate) == {
        4: ("k80", "v100")
    }
    assert preferred_flavors(get_policy("fifo"), [], running, p.capacity, p.rate) == {}


# --------------------------------------------------------------------------------------------------
# Errors and small API


def test_get_policy_names_every_policy_and_rejects_others():
    assert set(POLICIES) == {"fifo", "fair", "aware", "max_throughput", "mixed", "elastic"}
    for name in POLICIES:
        assert get_policy(name).name == name
    assert get_policy("mixed").mixes and not get_policy("aware").mixes
    assert not get_policy("fair").aware and get_policy("max_throughput").aware
    with pytest.raises(ValueError, match="policy 'gavel'"):
        get_policy("gavel")
    with pytest.raises(ValueError, match="surplus 'fastest'"):
        MaxMinAwarePolicy(surplus="fastest")


def test_solver_failure_raises_solver_error(monkeypatch: pytest.MonkeyPatch):
    class Failed:
        status = 2
        message = "The problem is infeasible."
        x = None

    monkeypatch.setattr(policies_module, "linprog", lambda *args, **kwargs: Failed())
    with pytest.raises(SolverError, match="infeasible"):
        get_policy("aware").allocate(PROBLEMS["three-on-two"])
    with pytest.raises(SolverError):
        get_policy("max_throughput").allocate(PROBLEMS["three-on-two"])


def test_config_is_canonical():
    assert Config.of(v100=2, k80=1) == Config.from_mapping({"k80": 1, "v100": 2, "p100": 0})
    assert Config.of(v100=2, k80=1).counts == (("k80", 1), ("v100", 2))
    assert Config.of(v100=2, k80=1).devices == 3
    assert Config.of(v100=2, k80=1).mixed and not Config.of(v100=2).mixed
    assert Config.of(v100=2).count("k80") == 0
    assert str(Config.of(v100=2, k80=1)) == "1xk80+2xv100"
