"""The elastic policy (``runtime.scheduling.elastic``): counts within each job's range, never more devices than
the pool has, resizes only when they pay for their restart, and the greedy solver against the exact one.

Rates are built per device with a sub-linear gang: a job's rate on ``m`` devices of a flavor is
``m * speed[flavor] / (1 + overhead * (m - 1))``, so that more devices always help, by less and less.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

import pytest

from runtime.scheduling.elastic import (
    ElasticPolicy,
    ElasticPolicyJob,
    ElasticProblem,
    device_counts,
    elastic_configs,
)
from runtime.scheduling.policies import POLICIES, Config, PolicyJob, get_policy

SPEED = {"v100": 3.0, "p100": 2.0, "k80": 1.0}


def gang_rate(overhead: float = 0.05, speed: Mapping[str, float] = SPEED):
    def rate(job: PolicyJob, config: Config) -> float:
        m = config.devices
        return sum(n * speed[f] for f, n in config.counts) / (1 + overhead * (m - 1))

    return rate


def job(
    job_id: int,
    devices: int,
    low: int | None = None,
    high: int | None = None,
    *,
    flavors: tuple[str, ...] = ("v100", "p100", "k80"),
    steps: float = 1e5,
    current: Config | None = None,
    at: float = 0.0,
    mixable: bool = False,
) -> ElasticPolicyJob:
    return ElasticPolicyJob(
        job_id,
        devices,
        flavors,
        at,
        mixable=mixable,
        current=current,
        remaining_steps=steps,
        min_devices=low,
        max_devices=high,
    )


def problem(jobs, capacity, *, restart_cost_s=0.0, round_s=360.0, rate=None, now=0.0) -> ElasticProblem:
    return ElasticProblem(jobs, capacity, rate or gang_rate(), now=now, round_s=round_s, restart_cost_s=restart_cost_s)


def used(configs: Mapping[int, Config | None]) -> dict[str, int]:
    total: dict[str, int] = {}
    for config in configs.values():
        for flavor, n in config.counts if config else ():
            total[flavor] = total.get(flavor, 0) + n
    return total


# --------------------------------------------------------------------------------------------------
# Counts, ranges and the pool


@pytest.mark.parametrize(
    ("devices", "low", "high", "counts"),
    [
        (1, None, None, [1]),
        (1, 1, 2, [1, 2]),
        (2, 1, 4, [1, 2, 4]),
        (3, 2, 6, [2, 3, 4, 6]),
        (8, 4, 16, [4, 8, 16]),
    ],
)
def test_device_counts_are_the_range_ends_the_request_and_powers_of_two(devices, low, high, counts):
    assert device_counts(job(0, devices, low, high)) == counts


def test_a_range_that_misses_the_request_is_refused():
    with pytest.raises(ValueError, match="device range"):
        job(0, 4, 5, 8)
    with pytest.raises(ValueError, match="device range"):
        job(0, 1, 0, 2)


def test_configs_stay_on_allowed_flavors_and_fit_the_pool():
    configs = elastic_configs(job(0, 4, 2, 8, flavors=("v100", "p100")), {"v100": 4, "p100": 8, "k80": 8}, mixes=False)
    assert {str(c) for c in configs} == {"2xv100", "2xp100", "4xv100", "4xp100", "8xp100"}


CASES = [
    # (capacity, jobs): many jobs, few devices; one job, many devices; mixed sizes and flavor limits.
    ({"v100": 4}, [job(i, 1, 1, 2) for i in range(10)]),
    ({"v100": 16, "p100": 8}, [job(0, 4, 2, 8)]),
    ({"v100": 3, "p100": 5, "k80": 7}, [job(i, 1 + i % 4, None, 2 * (1 + i % 4)) for i in range(9)]),
    ({"v100": 8, "k80": 8}, [job(i, 2, 1, 4, flavors=("k80",)) for i in range(3)] + [job(9, 8, 4, 16)]),
    ({"v100": 4, "p100": 4}, [job(i, 2, 1, 4, mixable=True) for i in range(5)]),
]


@pytest.mark.parametrize("solver", ["greedy", "exact"])
@pytest.mark.parametrize(("capacity", "jobs"), CASES)
def test_every_choice_is_in_range_on_allowed_flavors_and_within_the_pool(capacity, jobs, solver):
    choice = ElasticPolicy(solver=solver).choose(problem(jobs, capacity, restart_cost_s=20.0))
    by_id = {j.job_id: j for j in jobs}
    assert set(choice.configs) == set(by_id)
    for job_id, config in choice.configs.items():
        if config is None:
            continue
        pj = by_id[job_id]
        low, high = pj.min_devices or pj.devices, pj.max_devices or pj.devices
        assert low <= config.devices <= high
        assert {f for f, _ in config.counts} <= set(pj.flavors)
    assert all(n <= capacity.get(f, 0) for f, n in used(choice.configs).items())


def test_the_allocation_gives_each_chosen_job_all_its_time_in_one_configuration():
    jobs = [job(i, 2, 1, 4) for i in range(4)]
    allocation = ElasticPolicy().allocate(problem(jobs, {"v100": 4}))
    assert set(allocation) == {0, 1, 2, 3}
    assert all(list(configs.values()) in ([], [1.0]) for configs in allocation.values())


def test_a_job_alone_grows_to_its_maximum_and_idle_devices_go_to_the_fastest_flavor():
    (config,) = ElasticPolicy().choose(problem([job(0, 2, 1, 4)], {"v100": 8, "k80": 8})).configs.values()
    assert config == Config.of(v100=4)


def test_a_crowded_pool_runs_more_jobs_on_fewer_devices_each():
    # Four 2-device jobs that may shrink to 1 on four devices: all run, one device each, rather than two of them on two.
    choice = ElasticPolicy().choose(problem([job(i, 2, 1, 4) for i in range(4)], {"v100": 4}))
    assert [c.devices if c else 0 for c in choice.configs.values()] == [1, 1, 1, 1]


# --------------------------------------------------------------------------------------------------
# Resizes pay for themselves


@pytest.mark.parametrize(
    ("overhead", "restart_cost_s", "expected"),
    [
        # Linear scaling: 4 devices do twice the work; losing 60 s of 360 to the restart still pays.
        (0.0, 60.0, Config.of(v100=4)),
        # Doubling gains 1.43x (overhead 0.25): 300 s at 1.43x = 429 > 360 s: it pays.
        (0.25, 60.0, Config.of(v100=4)),
        # Doubling gains 1.14x (overhead 0.6): 300 s at 1.14x = 343 < 360 s: it stays.
        (0.6, 60.0, Config.of(v100=2)),
        # The same gain with a cheap restart, 350 s at 1.14x = 400 > 360 s, pays.
        (0.6, 10.0, Config.of(v100=4)),
    ],
)
def test_a_running_job_resizes_only_when_the_gain_over_the_round_beats_the_restart(overhead, restart_cost_s, expected):
    running = job(0, 2, 1, 4, current=Config.of(v100=2), steps=1e9)
    rate = gang_rate(overhead)
    gain = rate(running, Config.of(v100=4)) * (360 - restart_cost_s) / (rate(running, Config.of(v100=2)) * 360)
    assert (gain > 1) == (expected == Config.of(v100=4))  # the table's arithmetic, checked
    for solver in ("greedy", "exact"):
        choice = ElasticPolicy(solver=solver).choose(
            problem([running], {"v100": 4}, restart_cost_s=restart_cost_s, rate=rate)
        )
        assert choice.configs[0] == expected


def test_a_running_job_is_not_moved_to_an_equally_fast_flavor():
    running = job(0, 1, 1, 1, current=Config.of(p100=1))
    equal = gang_rate(speed={"v100": 2.0, "p100": 2.0, "k80": 1.0})
    choice = ElasticPolicy().choose(problem([running], {"v100": 1, "p100": 1}, restart_cost_s=30.0, rate=equal))
    assert choice.configs[0] == Config.of(p100=1)


def test_a_plain_problem_uses_the_policy_s_own_round_and_restart_cost():
    running = job(0, 2, 1, 4, current=Config.of(v100=2), steps=1e9)
    rate = gang_rate(0.6)
    plain = ElasticProblem([running], {"v100": 4}, rate)  # defaults: no restart cost
    assert ElasticPolicy().choose(plain).configs[0] == Config.of(v100=4)
    costly = ElasticPolicy(restart_cost_s=60.0)
    from runtime.scheduling.policies import AllocationProblem

    assert costly.choose(AllocationProblem([running], {"v100": 4}, rate)).configs[0] == Config.of(v100=2)


# --------------------------------------------------------------------------------------------------
# The greedy solver against the exact one


def random_round(seed: int) -> ElasticProblem:
    rng = random.Random(seed)
    capacity = {"v100": rng.randint(2, 8), "p100": rng.randint(2, 8), "k80": rng.randint(0, 8)}
    jobs = []
    for i in range(rng.randint(3, 10)):
        devices = rng.choice([1, 2, 4])
        current = Config(((rng.choice(["v100", "p100"]), devices),)) if rng.random() < 0.3 else None
        jobs.append(
            job(
                i,
                devices,
                max(1, devices // 2),
                2 * devices,
                steps=rng.uniform(1e3, 1e6),
                current=current,
                at=rng.uniform(0, 3600),
                mixable=rng.random() < 0.5,
            )
        )
    return problem(jobs, capacity, restart_cost_s=30.0, rate=gang_rate(rng.uniform(0.0, 0.3)), now=3600.0)


@pytest.mark.parametrize("seed", range(12))
def test_the_greedy_solver_is_within_ten_percent_of_the_exact_optimum(seed: int):
    round_problem = random_round(seed)
    greedy = ElasticPolicy().choose(round_problem)
    exact = ElasticPolicy(solver="exact").choose(round_problem)
    assert exact.value >= greedy.value - 1e-9
    assert greedy.value >= 0.9 * exact.value
    assert ElasticPolicy().round_program_value(round_problem, greedy.configs) == pytest.approx(greedy.value)


def test_the_policy_is_registered_and_rejects_bad_settings():
    assert "elastic" in POLICIES
    policy = get_policy("elastic")
    assert policy.name == "elastic" and policy.aware and policy.mixes
    with pytest.raises(ValueError, match="solver"):
        ElasticPolicy(solver="lp")
    with pytest.raises(ValueError, match="restart_cost_s"):
        ElasticPolicy(round_s=60.0, restart_cost_s=60.0)
    with pytest.raises(ValueError, match="size_exponent"):
        ElasticPolicy(size_exponent=2.0)
