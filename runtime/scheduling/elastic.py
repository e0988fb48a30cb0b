"""An elastic, heterogeneity-aware policy: each round, every job's device count and flavor(s), chosen.

Sia's idea (Jayaram Subramanya et al., SOSP 2023), our own formulation. The policies of ``policies`` take
each job's device count as given and share time; an elastic job instead states a range of counts
(``ElasticPolicyJob``), and this policy chooses, round by round, one configuration per job (a count on one
flavor, or on a mix of flavors where the job allows it) or none, so as to maximize the round's value:

    maximize  sum_j V_j(c_j)   subject to   sum_j devices_f(c_j) <= capacity_f   for every flavor f,

with ``V_j(c) = fairness_j * min(R_j, rate_j(c) * useful_s(c)) / rate_j``: the seconds of remaining work
(at the job's requested count on the pool's average device, ``rate_j``) that a round in ``c`` gets done, and
no more than the ``R_j`` seconds left (a nearly done job gains nothing from devices it cannot use), weighted
for fairness. ``useful_s(c)`` is the whole round when ``c`` is the configuration the job ran in last round,
and the round less ``restart_cost_s`` otherwise (a start, a resume or a resize costs a checkpoint and a
restart, as the simulator charges): a change is made only when what it gains over the rest of the round
beats what it costs, for this job or for the jobs that the devices it frees serve.

Fairness: ``fairness_j = weight_j * (1 + age_j / R_j) * R_j ** -size_exponent`` (times in rounds). The first
factor is the job's response ratio, which grows while it waits, so that no job starves. The second
favours jobs with little work left: with ``size_exponent = 1`` the objective is Smith's rule (the share of
each job's remaining work done, shortest first), the order that minimizes average completion time for
rigid jobs; with 0 it is goodput alone, as Sia values it. For jobs whose speed-up is sub-linear the
optimum lies between (heSRPT, Berg et al., SIGMETRICS 2020: shorter jobs get more devices, but not all of
them); the default 0.25 is the best of 0, 0.25, 0.5, 0.75 and 1 on Gavel's two traces made elastic (avg and
p99 JCT both; the gap between 0 and 0.5 was a few percent). A job whose remaining work is unknown is valued
by its normalized goodput alone.

Solving. The problem is a multiple-choice knapsack over one resource per flavor (NP-hard), solved here by
Lagrangian relaxation: flavor prices ``lambda_f`` make jobs independent (each takes the configuration of
most ``V - lambda . devices``), and a few price iterations (raising the price of an over-asked flavor,
lowering an idle one) find prices near the dual optimum. From each of a few price vectors a feasible
choice is built greedily (jobs in order of surplus, each its best configuration that still fits) and then
improved (left devices go to the upgrade of most value per device); the best is kept. ``solver="exact"``
solves the same integer program with HiGHS (``scipy.optimize.milp``), for measuring the greedy's gap on
small instances (``bench/placement.py`` and the unit tests do). Configurations per job are its allowed
counts at the range's ends, its requested count and the powers of two between, on each flavor and (when
``mixes`` and the job is mixable) the mixes of ``policies.configs_for``: a few dozen at most, so that a
round over 2,048 jobs decides in well under a second.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from runtime.scheduling.policies import (
    Allocation,
    AllocationProblem,
    Config,
    PolicyJob,
    SolverError,
    configs_for,
)

__all__ = [
    "ElasticPolicy",
    "ElasticPolicyJob",
    "ElasticProblem",
    "RoundChoice",
    "device_counts",
    "elastic_configs",
]

SOLVERS = ("greedy", "exact")


@dataclass(frozen=True)
class ElasticPolicyJob(PolicyJob):
    """A job that runs on any count in ``[min_devices, max_devices]`` (None: its requested ``devices``)."""

    min_devices: int | None = None
    max_devices: int | None = None

    def __post_init__(self) -> None:
        low, high = device_range(self)
        if not 1 <= low <= self.devices <= high:
            raise ValueError(
                f"job {self.job_id}: device range [{low}, {high}] must hold its requested {self.devices} devices "
                "and start at 1 or more"
            )


@dataclass(frozen=True)
class ElasticProblem(AllocationProblem):
    """An allocation problem with the round it decides: the clock, the round's length and the cost of a
    (re)start that the round will charge. A plain ``AllocationProblem`` is decided with the policy's own
    ``round_s`` and ``restart_cost_s`` and every job's age taken as 0."""

    now: float | None = None
    round_s: float = 360.0
    restart_cost_s: float = 0.0


def device_range(job: PolicyJob) -> tuple[int, int]:
    """(min, max) devices of a job: its elastic range, or its requested count alone."""
    if isinstance(job, ElasticPolicyJob):
        low = job.devices if job.min_devices is None else job.min_devices
        high = job.devices if job.max_devices is None else job.max_devices
        return low, high
    return job.devices, job.devices


def device_counts(job: PolicyJob) -> list[int]:
    """The counts the policy considers for a job: its range's ends, its requested count and the powers of
    two in between (a gang's rates are measured at powers of two; other counts gain little and would
    multiply the configurations)."""
    low, high = device_range(job)
    counts = {low, job.devices, high}
    power = 1
    while power <= high:
        if power >= low:
            counts.add(power)
        power *= 2
    return sorted(counts)


def elastic_configs(job: PolicyJob, capacity: Mapping[str, int], *, mixes: bool) -> list[Config]:
    """Every configuration the policy considers for ``job`` (see ``device_counts``), and its current one."""
    configs: list[Config] = []
    for count in device_counts(job):
        configs.extend(configs_for(replace(job, devices=count), capacity, mixes=mixes))
    if job.current is not None and job.current not in configs and job.current.fits(capacity):
        configs.append(job.current)
    return list(dict.fromkeys(configs))  # unique, in order


@dataclass(frozen=True)
class RoundChoice:
    """What the policy chose for one round: a configuration per job (None: it waits) and the objective it
    reached (for reports and gap measurements)."""

    configs: Mapping[int, Config | None]
    value: float


@dataclass
class _Round:
    """The round's integer program: per job, its configurations, their values and their devices per flavor."""

    jobs: list[PolicyJob]
    configs: list[list[Config]]
    values: list[np.ndarray]  # per job: value of each configuration
    usage: list[np.ndarray]  # per job: (configurations x flavors) devices
    flavors: list[str]
    capacity: np.ndarray


class ElasticPolicy:
    """Chooses every job's configuration each round to maximize fairness-weighted goodput, charging each
    change of configuration the restart cost (see the module docstring)."""

    name = "elastic"
    aware = True
    mixes = True
    elastic = True  # chooses device counts: the simulator gives it every elastic job's range
    every_round = True  # re-decides each round (ages and remaining work change), not only on arrivals

    def __init__(
        self,
        *,
        solver: str = "greedy",
        round_s: float = 360.0,
        restart_cost_s: float = 0.0,
        price_iterations: int = 30,
        size_exponent: float = 0.25,
    ) -> None:
        if solver not in SOLVERS:
            raise ValueError(f"solver {solver!r}: choose one of {', '.join(SOLVERS)}")
        if round_s <= 0 or not 0 <= restart_cost_s < round_s:
            raise ValueError("need round_s > 0 and 0 <= restart_cost_s < round_s")
        self.solver = solver
        self.round_s = round_s
        self.restart_cost_s = restart_cost_s
        self.price_iterations = price_iterations
        if not 0.0 <= size_exponent <= 1.0:
            raise ValueError(f"size_exponent must be in [0, 1], got {size_exponent!r}")
        self.size_exponent = size_exponent
        # Per job: its configurations and their rates, which do not change while the rate function and
        # the pool stay the same; the simulator asks every round, and these are most of a round's work.
        self._owner: tuple[object, tuple[tuple[str, int], ...]] | None = None
        self._rates: dict[tuple[int, int, int, Config | None], tuple[list[Config], np.ndarray, float]] = {}

    def allocate(self, problem: AllocationProblem) -> Allocation:
        choice = self.choose(problem)
        return {job_id: ({config: 1.0} if config is not None else {}) for job_id, config in choice.configs.items()}

    def choose(self, problem: AllocationProblem) -> RoundChoice:
        """One configuration (or none) per job for the next round."""
        program = self._program(problem)
        picks = _solve_exact(program) if self.solver == "exact" else _solve_greedy(program, self.price_iterations)
        return _choice(program, picks)

    def round_program_value(self, problem: AllocationProblem, configs: Mapping[int, Config | None]) -> float:
        """The objective of a given choice, valued as ``choose`` values it (for gap measurements)."""
        program = self._program(problem)
        total = 0.0
        for j, job in enumerate(program.jobs):
            config = configs.get(job.job_id)
            if config is not None:
                total += float(program.values[j][program.configs[j].index(config)])
        return total

    # ----------------------------------------------------------------------------------------------

    def _program(self, problem: AllocationProblem) -> _Round:
        flavors = sorted(f for f, n in problem.capacity.items() if n > 0)
        capacity = {f: int(problem.capacity[f]) for f in flavors}
        owner = (problem.rate, tuple(sorted(capacity.items())))
        if owner != self._owner:
            self._owner, self._rates = owner, {}
        if isinstance(problem, ElasticProblem):
            round_s, restart_s = problem.round_s, problem.restart_cost_s
            now = problem.now
        else:
            round_s, restart_s, now = self.round_s, self.restart_cost_s, None
        if now is None:
            now = max((job.submitted_at for job in problem.jobs), default=0.0)
        shares = {f: capacity[f] / sum(capacity.values()) for f in flavors} if flavors else {}

        jobs = list(problem.jobs)
        all_configs: list[list[Config]] = []
        values: list[np.ndarray] = []
        usage: list[np.ndarray] = []
        for job in jobs:
            configs, rates, base = self._job_rates(job, problem, capacity, shares)
            usable = rates > 0
            if not usable.all():
                configs = [c for c, ok in zip(configs, usable, strict=True) if ok]
                rates = rates[usable]
            useful = np.array([round_s if c == job.current else round_s - restart_s for c in configs])
            progress = rates * useful  # steps this round
            if job.remaining_steps is not None and job.remaining_steps > 0:
                remaining_s = job.remaining_steps / base  # at the requested count on an average device
                age = max(0.0, now - job.submitted_at)
                # The remaining time is floored at a round: work left within one round is all "now".
                left_s = max(remaining_s, round_s)
                fairness = job.weight * (1.0 + age / left_s) * (left_s / round_s) ** -self.size_exponent
                done = progress / job.remaining_steps
                value = fairness * np.minimum(1.0, done) * (left_s / round_s)
                # Among configurations that finish the job this round, the sooner the better (its completion
                # time counts to the moment it finishes): a tie-break worth at most a thousandth of the value.
                finishing = done >= 1.0
                if finishing.any():
                    spare = 1.0 - (job.remaining_steps / np.maximum(rates, 1e-12) + round_s - useful) / round_s
                    value = value + np.where(finishing, 1e-3 * fairness * np.clip(spare, 0.0, 1.0), 0.0)
            else:
                value = job.weight * progress / (base * round_s)
            all_configs.append(configs)
            values.append(value)
            devices = np.zeros((len(configs), len(flavors)))
            for row, config in enumerate(configs):
                for flavor, count in config.counts:
                    devices[row, flavors.index(flavor)] = count
            usage.append(devices)
        return _Round(jobs, all_configs, values, usage, flavors, np.array([capacity[f] for f in flavors], float))

    def _job_rates(
        self, job: PolicyJob, problem: AllocationProblem, capacity: Mapping[str, int], shares: Mapping[str, float]
    ) -> tuple[list[Config], np.ndarray, float]:
        """The job's configurations, its rate in each, and its rate at the requested count on the pool's
        average device (the normalization of ``policies``), memoized per job."""
        low, high = device_range(job)
        key = (job.job_id, low, high, job.current)
        cached = self._rates.get(key)
        if cached is not None:
            return cached
        configs = elastic_configs(job, capacity, mixes=self.mixes and job.mixable)
        rates = np.array([problem.rate(job, c) for c in configs], dtype=float)
        singles = {f: problem.rate(job, Config(((f, job.devices),))) for f in job.flavors if f in shares}
        weight = sum(shares[f] for f in singles)
        base = sum(r * shares[f] for f, r in singles.items()) / weight if weight else 0.0
        if base <= 0:
            base = float(rates.max()) if len(rates) and rates.max() > 0 else 1.0
        self._rates[key] = (configs, rates, base)
        return configs, rates, base


def _choice(program: _Round, picks: Sequence[int]) -> RoundChoice:
    configs: dict[int, Config | None] = {}
    total = 0.0
    for j, job in enumerate(program.jobs):
        pick = picks[j]
        configs[job.job_id] = program.configs[j][pick] if pick >= 0 else None
        if pick >= 0:
            total += float(program.values[j][pick])
    return RoundChoice(configs, total)


# --------------------------------------------------------------------------------------------------
# Solvers: both return, per job, the index of its chosen configuration or -1 (it waits).


def _solve_greedy(program: _Round, iterations: int) -> list[int]:
    n_jobs, n_flavors = len(program.jobs), len(program.flavors)
    if n_jobs == 0 or n_flavors == 0:
        return [-1] * n_jobs
    width = max((len(v) for v in program.values), default=0)
    if width == 0:
        return [-1] * n_jobs
    # Padded arrays: a missing configuration is worth -inf and uses nothing.
    values = np.full((n_jobs, width), -np.inf)
    usage = np.zeros((n_jobs, width, n_flavors))
    for j, (v, u) in enumerate(zip(program.values, program.usage, strict=True)):
        values[j, : len(v)] = v
        usage[j, : len(v)] = u
    capacity = program.capacity
    # A price's scale: the most value a device could bring (every job's best value per device it uses).
    per_device = np.where(np.isfinite(values), values / np.maximum(usage.sum(axis=2), 1.0), 0.0)
    scale = float(per_device.max()) if per_device.size else 1.0
    prices = np.zeros(n_flavors)
    candidates = [prices.copy()]
    best_gap, best_prices = math.inf, prices.copy()
    for k in range(iterations):
        picks = _best_responses(values, usage, prices)
        demand = _demand(usage, picks, n_flavors)
        over = (demand - capacity) / capacity
        gap = float(np.abs(np.maximum(over, -1.0)).sum())
        if np.all(demand <= capacity) and gap < best_gap:
            best_gap, best_prices = gap, prices.copy()
        # Subgradient step on the dual: raise an over-asked flavor's price, lower an idle one's (not below 0).
        prices = np.maximum(0.0, prices + scale * over / math.sqrt(k + 1))
    candidates.extend([prices, best_prices])
    best: list[int] = [-1] * n_jobs
    best_value = 0.0
    for candidate in candidates:
        picks_list = _improve(values, usage, capacity, _construct(values, usage, capacity, candidate), candidate)
        total = sum(values[j, p] for j, p in enumerate(picks_list) if p >= 0)
        if total > best_value + 1e-12:
            best, best_value = picks_list, total
    return best


def _best_responses(values: np.ndarray, usage: np.ndarray, prices: np.ndarray) -> np.ndarray:
    """Each job's configuration of most value less the price of its devices, or -1 when none is positive."""
    net = values - usage @ prices
    picks = np.argmax(net, axis=1)
    return np.where(net[np.arange(len(picks)), picks] > 0, picks, -1)


def _demand(usage: np.ndarray, picks: np.ndarray, n_flavors: int) -> np.ndarray:
    chosen = picks >= 0
    if not chosen.any():
        return np.zeros(n_flavors)
    total: np.ndarray = usage[np.nonzero(chosen)[0], picks[chosen]].sum(axis=0)
    return total


def _construct(values: np.ndarray, usage: np.ndarray, capacity: np.ndarray, prices: np.ndarray) -> list[int]:
    """A feasible choice: jobs in order of their best surplus at ``prices``, each taking its configuration
    of most surplus that still fits (or none when no fitting one has a positive surplus)."""
    net = values - usage @ prices
    order = np.lexsort((np.arange(len(values)), -net.max(axis=1)))
    left = capacity.astype(float).copy()
    picks = [-1] * len(values)
    for j in order:
        fits = np.all(usage[j] <= left + 1e-9, axis=1) & np.isfinite(values[j])
        if not fits.any():
            continue
        row = np.where(fits, net[j], -np.inf)
        pick = int(np.argmax(row))
        if row[pick] <= 0 and prices.any():
            # Priced out: take it only if no one else wants these devices; ``_improve`` decides that.
            continue
        if values[j, pick] <= 0:
            continue
        picks[j] = pick
        left -= usage[j, pick]
    return picks


def _improve(
    values: np.ndarray, usage: np.ndarray, capacity: np.ndarray, picks: list[int], prices: np.ndarray
) -> list[int]:
    """Spend the devices left: repeatedly, the upgrade (a start, a larger configuration, another flavor)
    of most added value per added device that fits, until none adds value."""
    left = capacity.astype(float) - sum((usage[j, p] for j, p in enumerate(picks) if p >= 0), np.zeros_like(capacity))
    n_jobs = len(values)
    # Device weights for "per device": the flavors' prices where there are any, else every device alike.
    weights = prices / prices.max() if prices.max() > 0 else np.ones_like(prices)
    weights = np.maximum(weights, 1e-3)
    for _ in range(8):  # passes; each applies many upgrades, and they stop as soon as one pass changes nothing
        current_value = np.array([values[j, p] if p >= 0 else 0.0 for j, p in enumerate(picks)])
        current_use = np.array([usage[j, p] if p >= 0 else np.zeros(usage.shape[2]) for j, p in enumerate(picks)])
        extra = usage - current_use[:, None, :]  # (jobs, configs, flavors)
        gain = values - current_value[:, None]
        possible = np.all(extra <= left + 1e-9, axis=2) & (gain > 1e-12) & np.isfinite(values)
        if not possible.any():
            break
        cost = np.maximum((np.maximum(extra, 0.0) * weights).sum(axis=2), 1e-3)
        density = np.where(possible, gain / cost, -np.inf)
        best = np.argmax(density, axis=1)
        best_density = density[np.arange(n_jobs), best]
        changed = False
        for j in np.lexsort((np.arange(n_jobs), -best_density)):
            if not np.isfinite(best_density[j]):
                break
            c = int(best[j])
            need = usage[j, c] - (usage[j, picks[j]] if picks[j] >= 0 else 0.0)
            if np.all(need <= left + 1e-9):
                left -= need
                picks[j] = c
                changed = True
        if not changed:
            break
    return picks


def _solve_exact(program: _Round) -> list[int]:
    """The integer program solved to optimality by HiGHS: binary x per (job, configuration)."""
    columns = [(j, c) for j, v in enumerate(program.values) for c in range(len(v))]
    n_jobs = len(program.jobs)
    if not columns:
        return [-1] * n_jobs
    value = np.array([program.values[j][c] for j, c in columns])
    one_per_job = np.zeros((n_jobs, len(columns)))
    devices = np.zeros((len(program.flavors), len(columns)))
    for col, (j, c) in enumerate(columns):
        one_per_job[j, col] = 1.0
        devices[:, col] = program.usage[j][c]
    result = milp(
        -value,
        constraints=[
            LinearConstraint(one_per_job, -np.inf, 1.0),
            LinearConstraint(devices, -np.inf, program.capacity),
        ],
        integrality=np.ones(len(columns)),
        bounds=Bounds(0, 1),
    )
    if result.status != 0 or result.x is None:
        raise SolverError(f"HiGHS (milp): {result.message}")
    picks = [-1] * n_jobs
    for col, (j, c) in enumerate(columns):
        if result.x[col] > 0.5:
            picks[j] = c
    return picks
