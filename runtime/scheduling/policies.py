"""Placement policies: how much of its time each job should spend in each way of running it.

One interface, six policies. A policy sees the jobs that want devices, the pool's capacity per flavor
and each job's throughput in each *configuration* (how many devices of each flavor it runs on), and
returns an ``Allocation``: for every job, the fraction of time it should spend in each configuration.
This is Gavel's formulation (Narayanan et al., OSDI 2020); the round mechanism (``runtime.scheduling.
rounds``) turns fractions into concrete placements round by round, and production admission reads the
same fractions to choose where a job starts.

- ``fifo``: arrival order, each job whole on the first configuration with room; blind to speed.
- ``fair``: max-min fairness over device-time, blind to speed (every flavor counts the same).
- ``aware``: max-min fairness over *normalized* throughput, Gavel's heterogeneity-aware policy, solved as a
  linear program with HiGHS.
- ``max_throughput``: the most total normalized throughput, fairness aside.
- ``mixed``: ``aware`` where a job that allows several flavors may also run on a mix of them at once,
  at the throughput the balancer reaches (Gavel never gives one job two device types).
- ``elastic`` (``runtime.scheduling.elastic``): no time-sharing; each round, every job's device count
  (within its elastic range) and flavor(s), for the most fairness-weighted goodput net of restart costs.

Normalization: a job's throughput in a configuration is divided by its throughput on the pool's *average*
device (its single-flavor throughputs weighted by the flavors' shares of the pool), and multiplied by its
device count. A job then scores 1.0 per unit of time it runs, on a typical mix of devices, so scores are
comparable across jobs of different speeds and sizes: an 8-device job needs an eighth of the time that a
1-device job needs to reach the same score, which is what sharing device-time equally means.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Protocol

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import bmat, coo_matrix

__all__ = [
    "POLICIES",
    "Allocation",
    "AllocationProblem",
    "Config",
    "PolicyJob",
    "SolverError",
    "configs_for",
    "fair_floor",
    "get_policy",
    "preferred_flavors",
]


class SolverError(RuntimeError):
    """The LP solver gave no optimal solution (it should not happen: every problem here is feasible)."""


@dataclass(frozen=True, order=True)
class Config:
    """A way to run one job: devices per flavor, as (flavor, count) pairs sorted by flavor."""

    counts: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, **counts: int) -> Config:
        return cls.from_mapping(counts)

    @classmethod
    def from_mapping(cls, counts: Mapping[str, int]) -> Config:
        return cls(tuple(sorted((f, n) for f, n in counts.items() if n > 0)))

    @property
    def devices(self) -> int:
        return sum(n for _, n in self.counts)

    @property
    def mixed(self) -> bool:
        return len(self.counts) > 1

    def count(self, flavor: str) -> int:
        return dict(self.counts).get(flavor, 0)

    def fits(self, left: Mapping[str, int]) -> bool:
        """Are there enough devices ``left`` (per flavor) for this configuration?"""
        return all(left.get(f, 0) >= n for f, n in self.counts)

    def take_from(self, left: dict[str, int]) -> None:
        """Count this configuration's devices out of ``left``."""
        for f, n in self.counts:
            left[f] -= n

    def __str__(self) -> str:
        return "+".join(f"{n}x{flavor}" for flavor, n in self.counts)


@dataclass(frozen=True)
class PolicyJob:
    job_id: int
    devices: int
    flavors: tuple[str, ...]  # allowed, in the job's order of preference
    submitted_at: float
    tenant_id: int = 0
    weight: float = 1.0  # a larger weight asks for a larger share
    mixable: bool = False  # the job accepts devices of several flavors at once
    current: Config | None = None  # the configuration it holds now, if it is running
    remaining_steps: float | None = None  # work left, in the unit of the rates (None: unknown)


# A job's throughput (steps per second, any unit consistent per job) in a configuration.
RateFn = Callable[[PolicyJob, Config], float]


@dataclass(frozen=True)
class AllocationProblem:
    jobs: Sequence[PolicyJob]
    capacity: Mapping[str, int]  # devices per flavor
    rate: RateFn


# job id -> configuration -> fraction of time (each job's fractions sum to at most 1).
Allocation = dict[int, dict[Config, float]]


class Policy(Protocol):
    name: str
    aware: bool  # uses throughputs
    mixes: bool  # may give one job several flavors at once

    def allocate(self, problem: AllocationProblem) -> Allocation: ...


# Mixed configurations per job: splits of its devices over at most MAX_MIX_FLAVORS flavors, in steps of
# a quarter of the gang rounded up (whole devices up to 4), so that a job has at most a dozen mixes
# whatever its size: an LP over 10,000 jobs stays small enough to solve within a scheduling round.
MIX_STEPS = 4
MAX_MIX_FLAVORS = 3


def configs_for(job: PolicyJob, capacity: Mapping[str, int], *, mixes: bool) -> list[Config]:
    """The configurations a job may run in: each allowed flavor alone with enough devices in the pool,
    and, when ``mixes`` and the job is mixable, the splits of its devices over several allowed flavors
    that the pool could hold (see ``MIX_STEPS``)."""
    allowed = [f for f in job.flavors if capacity.get(f, 0) > 0]
    configs = [Config(((f, job.devices),)) for f in allowed if capacity[f] >= job.devices]
    if mixes and job.mixable and job.devices > 1 and len(allowed) > 1:
        for group in range(2, min(MAX_MIX_FLAVORS, len(allowed), job.devices) + 1):
            for flavors in combinations(sorted(allowed), group):
                for split in _splits(job.devices, group, step=-(-job.devices // MIX_STEPS)):
                    counts = dict(zip(flavors, split, strict=True))
                    if all(counts[f] <= capacity[f] for f in flavors):
                        configs.append(Config.from_mapping(counts))
    return configs


def _splits(total: int, parts: int, step: int = 1) -> list[tuple[int, ...]]:
    """Ordered splits of ``total`` into ``parts`` positive integers, each but the last a multiple of ``step``."""
    if parts == 1:
        return [(total,)] if total > 0 else []
    return [
        (first, *rest)
        for first in range(step, total - (parts - 1) + 1, step)
        for rest in _splits(total - first, parts - 1, step)
    ]


# --------------------------------------------------------------------------------------------------
# Speed-blind policies


class FifoPolicy:
    """Arrival order; each job runs whole on the first configuration with room, or waits.

    Blind to speed: among the job's flavors it takes the one with the most devices left (an agnostic
    scheduler spreads load), never the fastest. Later jobs may use room that an earlier, larger job cannot.
    A running job keeps what it holds: FIFO never preempts.
    """

    name = "fifo"
    aware = False
    mixes = False

    def allocate(self, problem: AllocationProblem) -> Allocation:
        left = dict(problem.capacity)
        allocation: Allocation = {}
        for job in problem.jobs:
            if job.current is not None and job.current.fits(left):
                job.current.take_from(left)
                allocation[job.job_id] = {job.current: 1.0}
        for job in sorted(problem.jobs, key=lambda j: (j.submitted_at, j.job_id)):
            if job.job_id in allocation:
                continue
            fitting = [c for c in configs_for(job, problem.capacity, mixes=False) if c.fits(left)]
            allocation[job.job_id] = {}
            if fitting:
                config = max(fitting, key=lambda c: left[c.counts[0][0]])  # stable: first of equals
                config.take_from(left)
                allocation[job.job_id] = {config: 1.0}
        return allocation


# --------------------------------------------------------------------------------------------------
# Linear programs


@dataclass
class _Program:
    """The shared shape of the LPs: x[j, c] time fractions, one row per job (sum <= 1) and per flavor
    (devices used on average <= capacity)."""

    jobs: list[PolicyJob]
    configs: list[list[Config]]
    flavors: list[str]
    capacity: np.ndarray
    score: list[np.ndarray]  # per job, the normalized score per unit of time in each configuration
    remaining_s: np.ndarray  # per job, seconds of work left on the pool's average device (nan: unknown)
    columns: list[tuple[int, Config]]  # flat variable index -> (job index, configuration)


def _build(problem: AllocationProblem, *, aware: bool, mixes: bool) -> _Program:
    flavors = sorted(f for f, n in problem.capacity.items() if n > 0)
    jobs = list(problem.jobs)
    configs: list[list[Config]] = []
    scores: list[np.ndarray] = []
    columns: list[tuple[int, Config]] = []
    remaining = np.full(len(jobs), np.nan)
    for index, job in enumerate(jobs):
        job_configs = configs_for(job, problem.capacity, mixes=mixes)
        configs.append(job_configs)
        columns.extend((index, c) for c in job_configs)
        if not aware:
            # Speed-blind: a unit of time is worth the same anywhere.
            scores.append(np.full(len(job_configs), float(job.devices)))
            continue
        rates = np.array([problem.rate(job, c) for c in job_configs], dtype=float)
        # The job's rate on the pool's average device: every allowed flavor the pool has, weighted by its
        # share of the pool, whether or not that flavor alone could hold the whole gang.
        singles = {f: problem.rate(job, Config(((f, job.devices),))) for f in job.flavors if f in flavors}
        shares = sum(problem.capacity[f] for f in singles)
        average = sum(r * problem.capacity[f] for f, r in singles.items()) / shares if shares else 0.0
        if average <= 0:
            average = float(rates.max()) if len(rates) and rates.max() > 0 else 1.0
        scores.append(rates / average * job.devices)
        if job.remaining_steps is not None:
            remaining[index] = job.remaining_steps / average
    capacity = np.array([float(problem.capacity[f]) for f in flavors])
    return _Program(jobs, configs, flavors, capacity, scores, remaining, columns)


def _constraint_rows(program: _Program) -> tuple[coo_matrix, np.ndarray]:
    """Rows: one per job (sum of its fractions <= 1), then one per flavor (capacity)."""
    n_jobs, n_cols = len(program.jobs), len(program.columns)
    flavor_row = {f: n_jobs + i for i, f in enumerate(program.flavors)}
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    for col, (j, config) in enumerate(program.columns):
        rows.append(j)
        cols.append(col)
        vals.append(1.0)
        for flavor, count in config.counts:
            rows.append(flavor_row[flavor])
            cols.append(col)
            vals.append(float(count))
    matrix = coo_matrix((vals, (rows, cols)), shape=(n_jobs + len(program.flavors), n_cols))
    bounds = np.concatenate([np.ones(n_jobs), program.capacity])
    return matrix, bounds


def _solve(c: np.ndarray, a_ub: coo_matrix, b_ub: np.ndarray, upper: np.ndarray) -> np.ndarray:
    result = linprog(
        c, A_ub=a_ub.tocsr(), b_ub=b_ub, bounds=np.column_stack([np.zeros_like(upper), upper]), method="highs-ipm"
    )
    if result.status != 0:
        raise SolverError(f"HiGHS: {result.message}")
    return np.asarray(result.x)


def _to_allocation(program: _Program, x: np.ndarray) -> Allocation:
    allocation: Allocation = {job.job_id: {} for job in program.jobs}
    for col, (j, config) in enumerate(program.columns):
        if x[col] > 1e-7:
            allocation[program.jobs[j].job_id][config] = min(1.0, float(x[col]))
    return allocation


def _flat_scores(program: _Program) -> np.ndarray:
    return np.concatenate(program.score) if program.score else np.zeros(0)


# How the capacity above the max-min floor is spent: None leaves the interior-point solver's choice
# (the centre of the optimal face); "throughput" maximizes the total score; "shortest" maximizes the
# score weighted by 1 / work left, so that surplus finishes jobs sooner (Smith's rule).
SURPLUS_RULES = (None, "throughput", "shortest")


def fair_floor(problem: AllocationProblem, *, mixes: bool) -> float:
    """The heterogeneity-aware max-min optimum: the normalized score every job can be given at once
    (stage 1 of ``aware``, or of ``mixed`` with ``mixes``). For reports: how much mixing raises it."""
    return _max_min(problem, aware=True, mixes=mixes, surplus=None)[1]


def _max_min(
    problem: AllocationProblem, *, aware: bool, mixes: bool, surplus: str | None = None
) -> tuple[Allocation, float]:
    """Stage 1 is Gavel's LP: maximize t with every job's weighted score >= t. Its optimum is not unique
    above the floor: an interior-point solver returns the centre of the optimal face, which spreads time
    over slow configurations as readily as fast ones. Stage 2 (``surplus``) keeps every job at the floor
    and chooses a point of that face by a second objective."""
    program = _build(problem, aware=aware, mixes=mixes)
    n_jobs, n_cols = len(program.jobs), len(program.columns)
    if n_cols == 0:
        return {job.job_id: {} for job in program.jobs}, 0.0
    base, base_bounds = _constraint_rows(program)
    scores = _flat_scores(program)
    weights = np.array([job.weight for job in program.jobs])
    runnable = np.array([len(c) > 0 for c in program.configs])

    # Fairness rows: t * w_j - sum_c score_jc x_jc <= 0, for jobs that can run at all.
    job_of_col = np.array([j for j, _ in program.columns])
    fair_rows = coo_matrix((-scores, (job_of_col, np.arange(n_cols))), shape=(n_jobs, n_cols)).tocsr()[runnable]
    a_ub = bmat([[base, None], [fair_rows, coo_matrix(weights[runnable].reshape(-1, 1))]], format="csr")
    b_ub = np.concatenate([base_bounds, np.zeros(int(runnable.sum()))])
    objective = np.zeros(n_cols + 1)
    objective[-1] = -1.0  # maximize t
    stage1 = _solve(objective, a_ub, b_ub, np.concatenate([np.ones(n_cols), [np.inf]]))
    floor = float(stage1[-1])
    if surplus is None:
        return _to_allocation(program, stage1[:-1]), floor
    value = scores
    if surplus == "shortest":
        remaining = program.remaining_s
        known = remaining[~np.isnan(remaining)]
        fill = float(np.median(known)) if len(known) else 1.0
        remaining = np.where(np.isnan(remaining), fill, np.maximum(remaining, 1.0))
        value = scores / remaining[job_of_col] * float(np.median(remaining))

    # A hair under the floor, so that the solver's tolerance never makes stage 2 infeasible.
    floor_rows = bmat([[base], [fair_rows]], format="csr")
    floor_bounds = np.concatenate([base_bounds, -floor * (1 - 1e-6) * weights[runnable]])
    x = _solve(-value, floor_rows, floor_bounds, np.ones(n_cols))
    return _to_allocation(program, x), floor


class FairSharePolicy:
    """Max-min fairness over device-time, blind to speed (Gavel's agnostic max-min)."""

    name = "fair"
    aware = False
    mixes = False

    def allocate(self, problem: AllocationProblem) -> Allocation:
        return _max_min(problem, aware=False, mixes=False)[0]


class MaxMinAwarePolicy:
    """Max-min fairness over normalized throughput (Gavel's heterogeneity-aware max-min), with the
    surplus above the fair floor going to the jobs with the least work left (``surplus="shortest"``);
    ``surplus=None`` is Gavel's LP alone."""

    name = "aware"
    aware = True
    mixes = False

    def __init__(self, surplus: str | None = "shortest") -> None:
        if surplus not in SURPLUS_RULES:
            raise ValueError(f"surplus {surplus!r}: choose one of {', '.join(map(str, SURPLUS_RULES))}")
        self.surplus = surplus

    def allocate(self, problem: AllocationProblem) -> Allocation:
        return _max_min(problem, aware=True, mixes=self.mixes, surplus=self.surplus)[0]


class MixedGangPolicy(MaxMinAwarePolicy):
    """``aware``, plus configurations that mix flavors within one job."""

    name = "mixed"
    mixes = True


class MaxThroughputPolicy:
    """The most total normalized throughput, whoever gets it."""

    name = "max_throughput"
    aware = True
    mixes = False

    def allocate(self, problem: AllocationProblem) -> Allocation:
        program = _build(problem, aware=True, mixes=False)
        if not program.columns:
            return {job.job_id: {} for job in program.jobs}
        a_ub, b_ub = _constraint_rows(program)
        tiebreak = 1e-6 * np.array([1.0 / (1 + j) for j, _ in program.columns])
        x = _solve(-(_flat_scores(program) + tiebreak), a_ub, b_ub, np.ones(len(program.columns)))
        return _to_allocation(program, x)


def _elastic_policy() -> Policy:
    """``elastic`` (``runtime.scheduling.elastic``): it builds on this module, so it is imported when asked for."""
    from runtime.scheduling.elastic import ElasticPolicy

    return ElasticPolicy()


# Name -> a policy with its default settings (a class, or a function where the class lives elsewhere).
POLICIES: dict[str, Callable[[], Policy]] = {
    **{
        policy.name: policy
        for policy in (FifoPolicy, FairSharePolicy, MaxMinAwarePolicy, MaxThroughputPolicy, MixedGangPolicy)
    },
    "elastic": _elastic_policy,
}


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"policy {name!r}: choose one of {', '.join(POLICIES)}") from None


def normalized_score(job: PolicyJob, config: Config, rate: RateFn, capacity: Mapping[str, int]) -> float:
    """A job's score per unit of time in ``config`` (see the module docstring); for reports and tests."""
    program = _build(AllocationProblem([job], capacity, rate), aware=True, mixes=True)
    for c, s in zip(program.configs[0], program.score[0], strict=True):
        if c == config:
            return float(s)
    return math.nan


def preferred_flavors(
    policy: Policy,
    pending: Sequence[PolicyJob],
    running: Sequence[PolicyJob],
    capacity: Mapping[str, int],
    rate: RateFn,
) -> dict[int, tuple[str, ...]]:
    """Each pending job's allowed flavors, reordered by the time the policy's allocation gives it on
    each (most first; the job's own order breaks ties and places flavors it got no time on).

    This is how production admission, which starts jobs rather than time-sharing them in rounds, follows
    a policy: the admission cycle tries a job's flavors in this order. Running jobs enter the problem
    with their current configuration, so that the policy sees the whole pool's demand.
    """
    if not pending:
        return {}
    allocation = policy.allocate(AllocationProblem([*running, *pending], capacity, rate))
    order: dict[int, tuple[str, ...]] = {}
    for job in pending:
        time_on: dict[str, float] = {}
        for config, fraction in allocation.get(job.job_id, {}).items():
            for flavor, count in config.counts:
                time_on[flavor] = time_on.get(flavor, 0.0) + fraction * count / job.devices
        order[job.job_id] = tuple(
            sorted(job.flavors, key=lambda f: (-round(time_on.get(f, 0.0), 6), job.flavors.index(f)))
        )
    return order
