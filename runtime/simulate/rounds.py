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

Elastic jobs (``SimJob.device_range``): every policy sees an elastic job at its requested count, except
one that chooses counts (``policy.elastic``, ``runtime.scheduling.elastic``), which sees its range. Such
a policy is asked every round (``policy.every_round``) with the clock, the round's length and the restart
cost (an ``ElasticProblem``), and its answer (one configuration per job) is the round's plan: it does not
time-share, so ``plan_round`` has nothing to add. On a count other than the one it asked for, a job's rate
follows its batch rule (``JobRates``): ``fixed`` splits the same global batch over more or fewer devices
(compute scales, the table's communication overhead for that gang does not), ``scales`` keeps each
device's batch and pays the larger batch's statistical efficiency. A resize is a change of configuration,
charged ``restart_cost_s`` like any other.

Device layout (optional): a ``Cluster`` built with ``Cluster.laid_out(nodes, fabric)`` (or
``Cluster.from_pool``) has nodes with coordinates in a topology, and the simulator then tracks which
devices each running job holds. A job that runs on in the configuration it ran in keeps its devices;
every other placement takes devices from those not held by a continuing job, chosen by
``device_choice``: ``"topology"`` (``runtime.scheduling.FreePool`` with the fabric's hop distance: one
node if one has room, else the nearest nodes), ``"pack"`` (fullest node first, topology-blind, as
production without a fabric) or ``"random"`` (seeded, a topology-blind baseline). Larger gangs choose
first. A placed job runs at its table rate on one node (consolidated), divided by the step-time
model's factor for its devices' nodes (``runtime.inventory.step_time_factor`` with ``comm_fraction``,
the share of an ideally placed step spent communicating, and ``link``); the factor's baseline is one
node, so a spread gang pays for its spread once, not again through the table's spread rate. The
policy and the round plan still see the configuration's rates (server size: the largest node of the
flavor), so the device choice changes only how fast placed jobs run. Without a layout none of this
happens and the figures are as before.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from runtime.inventory import Fabric, LinkModel, NodeSpec, Pool, step_time_factor
from runtime.scheduling.elastic import ElasticPolicyJob, ElasticProblem
from runtime.scheduling.placement import FreeDevice, FreePool
from runtime.scheduling.policies import Allocation, AllocationProblem, Config, Policy, PolicyJob, configs_for
from runtime.scheduling.rounds import RoundJob, plan_round
from runtime.simulate.admission import water_fill
from runtime.simulate.trace import SimJob, ThroughputTable

__all__ = [
    "DEVICE_CHOICES",
    "Cluster",
    "GangPlacement",
    "JobRates",
    "RoundResult",
    "Summary",
    "run_rounds",
    "summarize",
]

DeviceChoice = Literal["topology", "pack", "random"]
DEVICE_CHOICES: tuple[DeviceChoice, ...] = ("topology", "pack", "random")


@dataclass(frozen=True)
class Cluster:
    devices: Mapping[str, int]  # flavor -> devices
    devices_per_server: Mapping[str, int] = field(default_factory=dict)  # flavor -> devices per server (1)
    # The optional device layout: nodes (name, flavor, devices) and their places in a topology.
    nodes: tuple[NodeSpec, ...] = ()
    fabric: Fabric | None = None

    def __post_init__(self) -> None:
        if self.fabric is None:
            if self.nodes:
                raise ValueError("nodes need a fabric (their topology and coordinates); use Cluster.laid_out")
            return
        counts: dict[str, int] = defaultdict(int)
        for node in self.nodes:
            if node.name not in self.fabric.coords:
                raise ValueError(f"node {node.name!r}: the fabric gives it no coordinates")
            counts[node.flavor] += node.devices
        if dict(counts) != {f: n for f, n in self.devices.items() if n > 0}:
            raise ValueError(f"the nodes hold {dict(counts)} devices, the cluster says {dict(self.devices)}")

    @classmethod
    def laid_out(cls, nodes: Sequence[NodeSpec], fabric: Fabric) -> Cluster:
        """A cluster of ``nodes`` (name, flavor, devices) placed by ``fabric``; a flavor's server size is
        its largest node, for the policy's view of consolidated rates."""
        devices: dict[str, int] = defaultdict(int)
        largest: dict[str, int] = defaultdict(int)
        for node in nodes:
            devices[node.flavor] += node.devices
            largest[node.flavor] = max(largest[node.flavor], node.devices)
        return cls(dict(devices), dict(largest), tuple(nodes), fabric)

    @classmethod
    def from_pool(cls, pool: Pool) -> Cluster:
        """A pool file's nodes in its fabric (a fat tree from racks when it names no topology)."""
        return cls.laid_out(pool.nodes, pool.fabric())

    def server_size(self, flavor: str) -> int:
        return self.devices_per_server.get(flavor, 1)

    @property
    def total(self) -> int:
        return sum(self.devices.values())


@dataclass(frozen=True)
class GangPlacement:
    """Where a job was placed (with a device layout): from ``start_s`` until it next moved, waited or
    finished. ``nodes`` has one entry per device, in ``devices``' order."""

    start_s: float
    config: Config
    devices: tuple[str, ...]
    nodes: tuple[str, ...]
    factor: float  # the step-time model's factor for these nodes (1.0: as fast as on one node)
    steps_per_s: float  # the job's speed there: table rate / factor

    @property
    def consolidated(self) -> bool:
        return len(set(self.nodes)) == 1


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
    # With a device layout: each job's placements in order (a continuing job keeps its entry).
    placements: dict[int, list[GangPlacement]] = field(default_factory=lambda: defaultdict(list))
    gang_s: float = 0.0  # seconds run by gangs of 2+ devices (with a layout)
    gang_factor_s: float = 0.0  # the same seconds, each times its gang's step-time factor

    @property
    def mean_gang_factor(self) -> float:
        """The step-time factor of gangs of 2+ devices, weighted by the time they ran (nan: none ran)."""
        return self.gang_factor_s / self.gang_s if self.gang_s else math.nan

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
    devices: tuple[FreeDevice, ...] = ()  # with a device layout: the devices it holds
    placement: GangPlacement | None = None  # with a device layout: its current placement


class JobRates:
    """Steps per second of a job in a configuration on this cluster, memoized."""

    def __init__(self, table: ThroughputTable, cluster: Cluster, balance_efficiency: float) -> None:
        self.table = table
        self.cluster = cluster
        self.balance_efficiency = balance_efficiency
        self._memo: dict[tuple[str, int, str, float | None, Config], float] = {}

    def __call__(self, job: SimJob, config: Config) -> float:
        key = (job.job_type, job.devices, job.batch, job.noise_scale, config)
        rate = self._memo.get(key)
        if rate is None:
            rate = self._rate(job, config, one_node=False)
            self._memo[key] = rate
        return rate

    def on_one_node(self, job: SimJob, config: Config) -> float:
        """The table's rate as if every device of the gang shared one node (the consolidated rate; a mix at
        each flavor's consolidated per-device rate). With a layout, the step-time factor then charges the
        gang for how it is actually spread, so the table's own spread penalty is not paid twice."""
        return self._rate(job, config, one_node=True)

    def _rate(self, job: SimJob, config: Config, *, one_node: bool) -> float:
        rate = self._gang_rate(job.job_type, config, one_node=one_node)
        if config.devices == job.devices or rate <= 0:
            return rate
        return self._resized(job, config, rate)

    def _gang_rate(self, job_type: str, config: Config, *, one_node: bool) -> float:
        """The table's steps per second for a gang of ``config``'s devices, each with a device-sized batch."""
        gang = config.devices
        if not config.mixed:
            flavor, count = config.counts[0]
            packed = one_node or count <= self.cluster.server_size(flavor)
            return self._table_rate(job_type, flavor, count, packed=packed)
        per_device = sum(
            count * self._table_rate(job_type, flavor, gang, packed=one_node) / gang for flavor, count in config.counts
        )
        return per_device * self.balance_efficiency

    def _resized(self, job: SimJob, config: Config, gang_rate: float) -> float:
        """An elastic job's progress (in its own steps) on a count other than the one it asked for.

        ``scales``: each device keeps its batch, so the table's gang rate holds, times the statistical
        efficiency of the larger (or smaller) global batch. ``fixed``: the global batch of ``job.devices``
        device-batches is split over ``config``'s devices. A step's time is then its compute, which shrinks
        with each device's share of the batch (the devices' one-device rates, without communication), plus
        the communication overhead that the table shows for this gang (its step time less that compute),
        which does not depend on the batch (the gradient is the same size)."""
        scale = config.devices / job.devices
        if job.batch == "scales":
            noise = job.noise_scale or 0.0
            return gang_rate * (noise + 1) / (noise + scale)
        solo = [self._table_rate(job.job_type, flavor, 1, packed=True) for flavor, _ in config.counts]
        if min(solo) <= 0:
            return 0.0  # no one-device rate to split the compute by: the table cannot say, so the job cannot run so
        compute_rate = sum(count * rate for (_, count), rate in zip(config.counts, solo, strict=True))
        overhead_s = max(0.0, config.devices / gang_rate - config.devices / compute_rate)  # per step of the gang
        return job.devices / (job.devices / compute_rate + overhead_s)

    def _table_rate(self, job_type: str, flavor: str, count: int, *, packed: bool) -> float:
        rate = self.table.steps_per_s(job_type, flavor, count, consolidated=packed)
        if rate is None and packed:  # measured only spread over servers: no faster packed
            rate = self.table.steps_per_s(job_type, flavor, count, consolidated=False)
        return rate or 0.0

    def flavors_for(self, job: SimJob) -> tuple[str, ...]:
        allowed = job.flavors or tuple(self.cluster.devices)
        return tuple(
            f
            for f in allowed
            if self.table.steps_per_s(job.job_type, f, job.devices, consolidated=False) not in (None, 0.0)
        )


def _chosen_plan(allocation: Allocation, capacity: Mapping[str, int]) -> dict[int, Config]:
    """The plan of a policy that chooses one configuration per job (all of its time), checked against the pool."""
    plan: dict[int, Config] = {}
    left = dict(capacity)
    for job_id, configs in sorted(allocation.items()):
        if not configs:
            continue
        if len(configs) != 1 or next(iter(configs.values())) < 1.0 - 1e-9:
            raise RuntimeError(f"job {job_id}: a count-choosing policy must give one configuration all the time")
        config = next(iter(configs))
        if not config.fits(left):
            raise RuntimeError(f"job {job_id}: {config} does not fit in what the policy left, {left}")
        config.take_from(left)
        plan[job_id] = config
    return plan


class _RandomFree:
    """Free devices handed out at random (seeded): the topology-blind baseline."""

    def __init__(self, devices: Sequence[FreeDevice], seed: int) -> None:
        self.rng = random.Random(seed)
        self.free: dict[str, dict[str, FreeDevice]] = defaultdict(dict)  # flavor -> id -> device
        self.put(devices)

    def put(self, devices: Sequence[FreeDevice]) -> None:
        for device in devices:
            self.free[device.flavor][device.device_id] = device

    def take_many(self, counts: Mapping[str, int]) -> list[FreeDevice]:
        chosen: list[FreeDevice] = []
        for flavor, k in counts.items():
            free = self.free[flavor]
            picked = self.rng.sample(sorted(free), k)
            chosen.extend(free.pop(device_id) for device_id in picked)
        return chosen


class _Placer:
    """Chooses devices for placements and prices them in the step-time model (a cluster with a layout)."""

    def __init__(
        self,
        cluster: Cluster,
        fabric: Fabric,
        rates: JobRates,
        device_choice: DeviceChoice,
        comm_fraction: float,
        link: LinkModel | None,
        seed: int,
    ) -> None:
        self.fabric = fabric
        self.rates = rates
        self.comm_fraction = comm_fraction
        self.link = link or LinkModel()
        devices = [
            FreeDevice(device_id=f"{node.name}/{i}", node=node.name, flavor=node.flavor)
            for node in cluster.nodes
            for i in range(node.devices)
        ]
        self.free: FreePool | _RandomFree
        if device_choice == "random":
            self.free = _RandomFree(devices, seed)
        else:
            self.free = FreePool(devices, distance=self.fabric if device_choice == "topology" else None)
        self._factors: dict[tuple[tuple[int, ...], ...], float] = {}

    def release(self, state: _Active) -> None:
        self.free.put(state.devices)
        state.devices, state.placement = (), None

    def place(self, state: _Active, config: Config, now: float) -> GangPlacement:
        devices = tuple(self.free.take_many(dict(config.counts)))
        nodes = tuple(d.node for d in devices)
        layout = tuple(sorted(self.fabric.coords[node] for node in nodes))
        factor = self._factors.get(layout)
        if factor is None:
            factor = step_time_factor(layout, self.fabric.topology, self.comm_fraction, self.link)
            self._factors[layout] = factor
        rate = self.rates.on_one_node(state.job, config)
        placement = GangPlacement(now, config, tuple(d.device_id for d in devices), nodes, factor, rate / factor)
        state.devices, state.placement = devices, placement
        return placement


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
    device_choice: DeviceChoice = "topology",
    comm_fraction: float = 0.3,
    link: LinkModel | None = None,
    seed: int = 0,
) -> RoundResult:
    """Replay ``trace`` until every job is done. ``progress(done, total, now_s)`` is called after each round;
    ``clock`` (e.g. ``time.perf_counter``) times each round's decision when given.

    With a device layout (``cluster.fabric``): ``device_choice`` picks the devices of each placement
    (``"topology"``, ``"pack"`` or ``"random"`` seeded by ``seed``); ``comm_fraction`` (the share of an
    ideally placed step spent communicating, in [0, 1]) and ``link`` set the step-time model. Without a
    layout these four are ignored."""
    if round_s <= 0:
        raise ValueError("round_s must be > 0")
    if not 0 <= restart_cost_s < round_s:
        raise ValueError(f"restart_cost_s must be in [0, round_s={round_s:g}); a restart that costs a round never ends")
    if not 0 < balance_efficiency <= 1:
        raise ValueError("balance_efficiency must be in (0, 1]")
    if device_choice not in DEVICE_CHOICES:
        raise ValueError(f"device_choice must be one of {', '.join(DEVICE_CHOICES)}, got {device_choice!r}")
    if not 0.0 <= comm_fraction <= 1.0:
        raise ValueError(f"comm_fraction must be in [0, 1], got {comm_fraction!r}")
    rates = JobRates(table, cluster, balance_efficiency)
    placer = None
    if cluster.fabric is not None:
        placer = _Placer(cluster, cluster.fabric, rates, device_choice, comm_fraction, link, seed)
    weights = dict(tenant_weights or {})
    capacity = {f: n for f, n in cluster.devices.items() if n > 0}
    chooses_counts = bool(getattr(policy, "elastic", False))
    every_round = bool(getattr(policy, "every_round", False))
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

    # One function for the whole run, so that a policy may memoize rates by it.
    def policy_rate(policy_job: PolicyJob, config: Config) -> float:
        return rates(by_id[policy_job.job_id], config)

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
            if chooses_counts and job.elastic:
                low, high = job.device_range
                policy_job = ElasticPolicyJob(**vars(policy_job), min_devices=low, max_devices=high)
            configs = configs_for(policy_job, capacity, mixes=policy.mixes)
            if not configs:
                raise ValueError(f"job {job.job_id}: needs {job.devices} devices; the cluster cannot hold it")
            by_id[job.job_id] = job
            active[job.job_id] = _Active(job, policy_job, configs, job.total_steps)
            changed = True
        if not active:
            continue

        started = clock() if clock else 0.0
        if changed or every_round:
            policy_jobs = [
                replace(a.policy_job, current=a.current, remaining_steps=a.remaining_steps) for a in active.values()
            ]
            problem = (
                ElasticProblem(
                    policy_jobs, capacity, policy_rate, now=now, round_s=round_s, restart_cost_s=restart_cost_s
                )
                if chooses_counts
                else AllocationProblem(jobs=policy_jobs, capacity=capacity, rate=policy_rate)
            )
            allocation = policy.allocate(problem)
            result.allocations += 1
            changed = False
        if chooses_counts:
            plan = _chosen_plan(allocation, capacity)
        else:
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
        if placer is not None:
            # Jobs that stop or change configuration give their devices back before anyone chooses.
            for job_id, state in active.items():
                if state.devices and plan.get(job_id) != state.current:
                    placer.release(state)
            for job_id in sorted(plan, key=lambda j: (-plan[j].devices, j)):
                state = active[job_id]
                if not state.devices:
                    result.placements[job_id].append(placer.place(state, plan[job_id], now))
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
            placement = state.placement
            speed = rate_of(job_id, config) if placement is None else placement.steps_per_s
            if speed <= 0:
                raise RuntimeError(f"job {job_id} placed on {config}, where the table gives it no speed")
            useful = max(0.0, round_s - startup)
            held = round_s
            if speed > 0 and state.remaining_steps <= speed * useful:
                held = startup + state.remaining_steps / speed
                result.finish_s[job_id] = now + held
                if placer is not None:
                    placer.release(state)
                del active[job_id]
                changed = True
            else:
                state.remaining_steps -= speed * useful
                state.received_s[config] += round_s
            if placement is not None and config.devices > 1:
                result.gang_s += held
                result.gang_factor_s += placement.factor * held
            result.busy_device_s += config.devices * held
            result.held_device_s[state.job.tenant_id] += config.devices * held
        result.rounds += 1
        now += round_s
        if progress is not None:
            progress(len(result.finish_s), len(arrivals), now)
    result.capacity_device_s = cluster.total * result.makespan_s
    return result
