"""The round simulator: a trace on a described cluster, a virtual clock, and a production policy.

Time advances in rounds (Gavel's mechanism, 6 minutes by default). When the set of jobs changes (an
arrival or a completion), the policy (``runtime.scheduling.policies``, the same objects that production
admission asks) recomputes its allocation; every round, ``runtime.scheduling.rounds.plan_round`` (also
production code) decides who runs where. A job arriving mid-round waits for the next round; a job that
finishes mid-round records its completion at that moment, and its devices idle until the round ends.

Costs that Gavel's simulator leaves out and this one charges: a job that starts in a configuration it
did not run in the round before (its first start, a resume after waiting, a move) loses
``restart_cost_s`` of that round to checkpoint and restart; a job on a mix of flavors runs at the sum of
its devices' throughputs times ``balance_efficiency``.

Rates: a single-flavor gang that fits on one server runs at the table's consolidated rate, otherwise at
the unconsolidated one; each device of a mixed gang contributes its flavor's unconsolidated per-device
rate for the gang's size.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from runtime.scheduling.policies import AllocationProblem, Config, Policy, PolicyJob, configs_for
from runtime.scheduling.rounds import RoundJob, plan_round
from runtime.simulate.admission import water_fill
from runtime.simulate.trace import SimJob, ThroughputTable

__all__ = ["Cluster", "RoundResult", "Summary", "run_rounds", "summarize"]


@dataclass(frozen=True)
class Cluster:
    devices: Mapping[str, int]  # flavor -> devices
    devices_per_server: Mapping[str, int] = field(default_factory=dict)  # flavor -> devices per server (1)

    def server_size(self, flavor: str) -> int:
        return self.devices_per_server.get(flavor, 1)

    @property
    def total(self) -> int:
        return sum(self.devices.values())


@dataclass
class RoundResult:
    policy: str
    arrival_s: dict[int, float] = field(default_factory=dict)
    finish_s: dict[int, float] = field(default_factory=dict)
    busy_device_s: float = 0.0  # device-seconds held by a job
    capacity_device_s: float = 0.0  # device-seconds the cluster offered until the makespan
    held_device_s: dict[int, float] = field(default_factory=lambda: defaultdict(float))  # per tenant
    entitled_device_s: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    rounds: int = 0
    allocations: int = 0  # policy solves
    restarts: int = 0
    mixed_rounds: int = 0  # rounds in which some job ran on a mix of flavors
    decision_s: list[float] = field(default_factory=list)  # policy + plan time per round (wall clock)

    @property
    def jct_s(self) -> dict[int, float]:
        return {job: self.finish_s[job] - self.arrival_s[job] for job in self.finish_s}

    @property
    def makespan_s(self) -> float:
        return max(self.finish_s.values(), default=0.0)


@dataclass(frozen=True)
class Summary:
    jobs: int
    avg_jct_h: float
    p50_jct_h: float
    p99_jct_h: float
    makespan_h: float
    utilization: float
    tenant_share: Mapping[int, tuple[float, float]]  # tenant -> (held device-h, entitled device-h)


def _percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on sorted values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(result: RoundResult) -> Summary:
    jcts = list(result.jct_s.values())
    return Summary(
        jobs=len(jcts),
        avg_jct_h=sum(jcts) / len(jcts) / 3600 if jcts else math.nan,
        p50_jct_h=_percentile(jcts, 0.5) / 3600,
        p99_jct_h=_percentile(jcts, 0.99) / 3600,
        makespan_h=result.makespan_s / 3600,
        utilization=result.busy_device_s / result.capacity_device_s if result.capacity_device_s else 0.0,
        tenant_share={
            tenant: (result.held_device_s.get(tenant, 0.0) / 3600, entitled / 3600)
            for tenant, entitled in sorted(result.entitled_device_s.items())
        },
    )


@dataclass
class _Active:
    job: SimJob
    policy_job: PolicyJob
    configs: list[Config]
    remaining_steps: float
    current: Config | None = None
    received_s: dict[Config, float] = field(default_factory=lambda: defaultdict(float))


class _Rates:
    """Steps per second of a job in a configuration on this cluster, memoized."""

    def __init__(self, table: ThroughputTable, cluster: Cluster, balance_efficiency: float) -> None:
        self.table = table
        self.cluster = cluster
        self.balance_efficiency = balance_efficiency
        self._memo: dict[tuple[str, int, Config], float] = {}

    def __call__(self, job: SimJob, config: Config) -> float:
        key = (job.job_type, job.devices, config)
        rate = self._memo.get(key)
        if rate is None:
            rate = self._compute(job, config)
            self._memo[key] = rate
        return rate

    def _compute(self, job: SimJob, config: Config) -> float:
        if not config.mixed:
            flavor, count = config.counts[0]
            together = count <= self.cluster.server_size(flavor)
            rate = self.table.steps_per_s(job.job_type, flavor, count, consolidated=together)
            if rate is None and together:  # measured only spread over servers: no faster packed
                rate = self.table.steps_per_s(job.job_type, flavor, count, consolidated=False)
            return rate or 0.0
        per_device = 0.0
        for flavor, count in config.counts:
            gang_rate = self.table.steps_per_s(job.job_type, flavor, job.devices, consolidated=False) or 0.0
            per_device += count * gang_rate / job.devices
        return per_device * self.balance_efficiency

    def flavors_for(self, job: SimJob) -> tuple[str, ...]:
        allowed = job.flavors or tuple(self.cluster.devices)
        return tuple(
            f
            for f in allowed
            if self.table.steps_per_s(job.job_type, f, job.devices, consolidated=False) not in (None, 0.0)
        )


def run_rounds(
    trace: Sequence[SimJob],
    cluster: Cluster,
    policy: Policy,
    table: ThroughputTable,
    *,
    round_s: float = 360.0,
    restart_cost_s: float = 0.0,
    balance_efficiency: float = 1.0,
    tenant_weights: Mapping[int, float] | None = None,
    progress: Callable[[int, int, float], None] | None = None,
    clock: Callable[[], float] | None = None,
) -> RoundResult:
    """Replay ``trace`` until every job is done. ``progress(done, total, now_s)`` is called after each round;
    ``clock`` (e.g. ``time.perf_counter``) times each round's decision when given."""
    if round_s <= 0:
        raise ValueError("round_s must be > 0")
    if not 0 <= restart_cost_s < round_s:
        raise ValueError(f"restart_cost_s must be in [0, round_s={round_s:g}); a restart that costs a round never ends")
    if not 0 < balance_efficiency <= 1:
        raise ValueError("balance_efficiency must be in (0, 1]")
    rates = _Rates(table, cluster, balance_efficiency)
    weights = dict(tenant_weights or {})
    capacity = {f: n for f, n in cluster.devices.items() if n > 0}
    result = RoundResult(policy=policy.name)
    arrivals = sorted(trace, key=lambda j: (j.arrival_s, j.job_id))
    for job in arrivals:
        result.arrival_s[job.job_id] = job.arrival_s
        if not rates.flavors_for(job):
            raise ValueError(
                f"job {job.job_id}: no flavor of this cluster can run {job.job_type!r} on {job.devices} devices"
            )
    active: dict[int, _Active] = {}
    by_id: dict[int, SimJob] = {}
    allocation: dict[int, dict[Config, float]] = {}
    changed = True
    now = 0.0
    index = 0

    def rate_of(job_id: int, config: Config) -> float:
        return rates(by_id[job_id], config)

    while index < len(arrivals) or active:
        if not active and arrivals[index].arrival_s > now:
            # Nothing to run: the clock jumps to the next arrival, on the round grid.
            now += math.ceil((arrivals[index].arrival_s - now) / round_s) * round_s
        while index < len(arrivals) and arrivals[index].arrival_s <= now:
            job = arrivals[index]
            index += 1
            policy_job = PolicyJob(
                job_id=job.job_id,
                devices=job.devices,
                flavors=rates.flavors_for(job),
                submitted_at=job.arrival_s,
                tenant_id=job.tenant_id,
                weight=1.0,
                mixable=job.mixable,
            )
            configs = configs_for(policy_job, capacity, mixes=policy.mixes)
            if not configs:
                raise ValueError(f"job {job.job_id}: needs {job.devices} devices; the cluster cannot hold it")
            by_id[job.job_id] = job
            active[job.job_id] = _Active(job, policy_job, configs, job.total_steps)
            changed = True
        if not active:
            continue

        started = clock() if clock else 0.0
        if changed:
            problem = AllocationProblem(
                jobs=[
                    replace(a.policy_job, current=a.current, remaining_steps=a.remaining_steps) for a in active.values()
                ],
                capacity=capacity,
                rate=lambda pj, config: rates(by_id[pj.job_id], config),
            )
            allocation = policy.allocate(problem)
            result.allocations += 1
            changed = False
        plan = plan_round(
            allocation,
            [
                RoundJob(
                    job_id=a.job.job_id,
                    age_s=now - a.job.arrival_s,
                    current=a.current,
                    received_s=a.received_s,
                    configs=a.configs,
                )
                for a in active.values()
            ],
            capacity,
            rate=rate_of,
            round_s=round_s,
            restart_cost_s=restart_cost_s,
        )
        if clock:
            result.decision_s.append(clock() - started)

        demand: dict[int, float] = defaultdict(float)
        for state in active.values():
            demand[state.job.tenant_id] += state.job.devices
        for tenant, entitled in water_fill(float(cluster.total), demand, weights).items():
            result.entitled_device_s[tenant] += entitled * round_s

        if any(config.mixed for config in plan.values()):
            result.mixed_rounds += 1
        for job_id, state in list(active.items()):
            config = plan.get(job_id)
            if config is None:
                state.current = None
                continue
            startup = 0.0
            if state.current != config:
                startup = restart_cost_s
                result.restarts += 1
            state.current = config
            speed = rate_of(job_id, config)
            if speed <= 0:
                raise RuntimeError(f"job {job_id} placed on {config}, where the table gives it no speed")
            useful = max(0.0, round_s - startup)
            held = round_s
            if speed > 0 and state.remaining_steps <= speed * useful:
                held = startup + state.remaining_steps / speed
                result.finish_s[job_id] = now + held
                del active[job_id]
                changed = True
            else:
                state.remaining_steps -= speed * useful
                state.received_s[config] += round_s
            result.busy_device_s += config.devices * held
            result.held_device_s[state.job.tenant_id] += config.devices * held
        result.rounds += 1
        now += round_s
        if progress is not None:
            progress(len(result.finish_s), len(arrivals), now)
    result.capacity_device_s = cluster.total * result.makespan_s
    return result
