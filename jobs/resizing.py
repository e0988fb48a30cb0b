"""The elastic round: every few minutes, each running elastic job's device count, chosen again.

The elastic policy (``runtime.scheduling.elastic``, Sia's idea) chooses a configuration for every
running elastic job and every queued job at once, to maximize the pool's fairness-weighted goodput over
the next round, and charges each change the measured cost of a move (``recovery.move_cost_s``): a change
is made only when it gains more over the round than it costs. Its choices for the running elastic jobs
are carried out through the move that every job already has (a full checkpoint, a stop at a step, the
next attempt placed on the new count, restored, re-split):

- a job the policy gives fewer devices shrinks, and the devices it frees go to the queue through the next
  admission cycle (the queued job the policy had in mind, or one the admission order puts first);
- a job it gives more grows into devices free now and within its tenant's quota (a grow that would break
  a quota is cut to what the quota has room for, and not made when nothing is left of it).

- a job it gives other chips (another flavor of its spec, or a mix) moves to them when every device it
  adds is free now and within quota; the next attempt is placed on those flavors (the restart planner
  keeps what the job holds of them), or on any of its flavors if they were taken meanwhile.

Deliberately left out: it never evicts (a running job that the policy would stop runs on its minimum instead;
eviction is admission's, with its priorities and reclaim); a queued job counts only when its tenant's
quota has room to start it (shrinking for a job that may not start would free devices for nobody); and
non-elastic jobs are left as they are.
"""

from __future__ import annotations

import logging
import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from django.conf import settings
from django.utils import timezone

from jobs import throughput
from jobs.models import Allocation, TrainingJob
from jobs.moving import request_move
from jobs.pool import free_devices
from jobs.recovery import move_cost_s, quota_ledger, running_not_moving
from jobs.snapshot import pending_jobs
from runtime.jobspec import JobSpec
from runtime.scheduling import QuotaLedger
from runtime.scheduling.elastic import ElasticPolicy, ElasticPolicyJob, ElasticProblem
from runtime.scheduling.placement import FreeDevice
from runtime.scheduling.policies import Config, PolicyJob

log = logging.getLogger(__name__)

# The queued jobs a round weighs, first in queue order: the devices a shrink frees go to the head of the
# queue, and the round must decide in well under a second.
QUEUE_HEADS = 256


@dataclass(frozen=True)
class Resize:
    """One running elastic job's new device count for the round (and the flavors it moves to, when the
    round moves it to other chips), and why."""

    job_id: int
    current: int
    target: int
    reason: str
    flavors: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Running:
    job: TrainingJob
    spec: JobSpec
    held: Config


def plan_round() -> list[Resize]:
    """The round's resizes, decided from the database as it is now; nothing is changed."""
    running = _running_elastic()
    if not running:
        return []
    pool_free = [d for d in free_devices() if not d.degraded]
    queued = pending_jobs()
    ledger, _ = quota_ledger({r.job.job_class for r in running.values()} | {p.job_class for p in queued})
    startable = [p for p in queued if _quota_could_start(ledger, p.tenant_id, p.flavors, p.min_devices or p.devices)]
    startable.sort(key=lambda p: (-p.priority, p.submitted_at, p.job_id))
    heads = startable[:QUEUE_HEADS]
    queued_rows = TrainingJob.objects.filter(pk__in=[p.job_id for p in heads]).only(
        "pk", "spec", "total_steps", "job_class"
    )
    specs = {job.pk: (job.job_spec, job.job_class) for job in queued_rows}
    specs.update({job_id: (r.spec, r.job.job_class) for job_id, r in running.items()})
    steps = {job.pk: job.total_steps for job in queued_rows}

    capacity: Counter[str] = Counter(d.flavor for d in pool_free)
    for r in running.values():
        capacity.update(dict(r.held.counts))
    table = throughput.table()

    def rate(job: PolicyJob, config: Config) -> float:
        # Steps per second: the gang's samples per second (a mix runs at the sum of its parts, as the
        # balancer splits the batch) over the global batch at that count.
        spec, job_class = specs[job.job_id]
        try:
            samples = sum(table.lookup(job_class, flavor, n).samples_per_s for flavor, n in config.counts)
        except LookupError:
            return 0.0
        return samples / spec.workload_on(config.devices).global_batch

    jobs: list[PolicyJob] = [_policy_job(r) for r in running.values()]
    for p in heads:
        if p.job_id in specs:
            jobs.append(
                ElasticPolicyJob(
                    p.job_id,
                    p.devices,
                    tuple(p.flavors),
                    p.submitted_at,
                    p.tenant_id,
                    mixable=len(p.flavors) > 1,
                    remaining_steps=float(steps[p.job_id]) if steps[p.job_id] else None,
                    min_devices=p.min_devices or p.devices,  # the snapshot sets it for elastic jobs only
                    max_devices=p.devices,
                )
            )
    round_s = settings.POLYCHIP_ELASTIC_ROUND_S
    costs = [move_cost_s(job_class) for job_class in {r.job.job_class for r in running.values()}]
    cost_s = min(statistics.median(costs), 0.9 * round_s)
    problem = ElasticProblem(
        jobs, dict(capacity), rate, now=timezone.now().timestamp(), round_s=round_s, restart_cost_s=cost_s
    )
    choice = ElasticPolicy(round_s=round_s, restart_cost_s=cost_s).choose(problem)
    served = [p.job_id for p in heads if choice.configs.get(p.job_id) is not None]
    return _resizes(running, choice.configs, served, pool_free, ledger, cost_s)


def elastic_round() -> list[Resize]:
    """Plan the round and ask each job it resizes to move; returns the resizes asked for."""
    asked = []
    for resize in plan_round():
        if request_move(resize.job_id, resize.reason, resize_to=resize.target, resize_flavors=resize.flavors):
            asked.append(resize)
            log.info("job %s: %s", resize.job_id, resize.reason)
    return asked


def _running_elastic() -> dict[int, _Running]:
    """Running elastic jobs not already moving, with the configuration they hold."""
    candidates = {job.pk: job for job in running_not_moving() if job.job_spec.elastic}
    held: dict[int, list[str]] = defaultdict(list)
    # Flavor names only: a device row carries its hour of health readings, which a count needs none of.
    open_allocations = Allocation.objects.filter(job_id__in=list(candidates), ended_at__isnull=True)
    for job_id, flavor in open_allocations.values_list("job_id", "device__flavor__name"):
        held[job_id].append(flavor)
    return {
        job_id: _Running(job, job.job_spec, Config.from_mapping(Counter(held[job_id])))
        for job_id, job in candidates.items()
        if held[job_id]
    }


def _policy_job(r: _Running) -> ElasticPolicyJob:
    spec = r.spec
    low = spec.min_devices or spec.devices
    left = max(0, r.job.total_steps - r.job.steps_done) if r.job.total_steps else None
    return ElasticPolicyJob(
        r.job.pk,
        spec.devices,
        tuple(spec.flavors),
        r.job.created_at.timestamp(),
        r.job.tenant_id,
        mixable=len(spec.flavors) > 1,
        current=r.held,
        remaining_steps=float(left) if left else None,
        min_devices=min(low, r.held.devices),
        max_devices=max(spec.devices, r.held.devices),
    )


def _quota_could_start(ledger: QuotaLedger, tenant_id: int, flavors: Sequence[str], count: int) -> bool:
    for flavor in flavors:
        room = ledger.headroom(tenant_id, flavor)
        if room is None or room >= count:
            return True
    return False


def _resizes(
    running: Mapping[int, _Running],
    chosen: Mapping[int, Config | None],
    served: Sequence[int],
    pool_free: Sequence[FreeDevice],
    ledger: QuotaLedger,
    cost_s: float,
) -> list[Resize]:
    """The policy's counts for the running jobs, within each job's range; grows cut to what is free and
    within quota, the free devices and each tenant's room handed out in job order."""
    free = Counter(d.flavor for d in pool_free)
    granted: Counter[tuple[int, str]] = Counter()  # (tenant, flavor) -> devices the round's grows took
    out: list[Resize] = []
    for job_id, r in sorted(running.items()):
        spec, current = r.spec, r.held.devices
        low = spec.min_devices or spec.devices
        config = chosen.get(job_id)
        target = max(low, min(spec.devices, config.devices if config is not None else low))
        if target < current:
            # Only for the queue: this round's grows take devices free now, never those a shrink frees
            # (they are free only once the job has moved), so a shrink that served no queued job would
            # leave its devices idle.
            if served:
                reason = (
                    f"elastic round: shrinking from {current} to {target} devices; the {current - target} it "
                    f"frees serve queued job {', '.join(map(str, served[:3]))} better this round (a move costs "
                    f"{cost_s:.0f} s)"
                )
                out.append(Resize(job_id, current, target, reason))
            continue
        tenant_id, grown = r.job.tenant_id, current
        if config is not None and config.devices >= current and _moves_flavors(r.held, config):
            moved = _move(job_id, r, config, free, granted, ledger, cost_s)
            if moved is not None:
                out.append(moved)
                continue
        for flavor in spec.flavors:
            take = max(0, min(_room(flavor, tenant_id, free, granted, ledger), target - grown))
            free[flavor] -= take
            granted[(tenant_id, flavor)] += take
            grown += take
        if grown > current:
            reason = (
                f"elastic round: growing from {current} to {grown} devices, free and within quota; the faster "
                f"steps repay the {cost_s:.0f} s move within the round"
            )
            out.append(Resize(job_id, current, grown, reason))
    return out


def _room(
    flavor: str, tenant_id: int, free: Counter[str], granted: Counter[tuple[int, str]], ledger: QuotaLedger
) -> int:
    """The devices of ``flavor`` free now that the tenant's quota still has room for this round."""
    headroom = ledger.headroom(tenant_id, flavor)
    return free[flavor] if headroom is None else min(free[flavor], headroom - granted[(tenant_id, flavor)])


def _moves_flavors(held: Config, config: Config) -> bool:
    """Whether ``config`` puts the job on other flavors and keeps each flavor it holds whole or leaves it:
    the next attempt keeps every device it holds of a flavor it may use (``plan_restart``), so a move
    that kept part of a flavor would land back where it was, and be proposed again every round."""
    target = dict(config.counts)
    if set(target) == {flavor for flavor, _ in held.counts}:
        return False
    return all(target.get(flavor, 0) == 0 or target[flavor] >= n for flavor, n in held.counts)


def _move(
    job_id: int,
    r: _Running,
    config: Config,
    free: Counter[str],
    granted: Counter[tuple[int, str]],
    ledger: QuotaLedger,
    cost_s: float,
) -> Resize | None:
    """The job moved to the policy's chips (``config``: another flavor, or a mix), when every device it
    adds is free now and within its tenant's quota; it keeps those it holds of the same flavors. None
    when one is missing (the count alone may still grow). Takes what it adds from ``free`` and ``granted``."""
    held = dict(r.held.counts)
    adds = {flavor: n - held.get(flavor, 0) for flavor, n in config.counts if n > held.get(flavor, 0)}
    tenant_id = r.job.tenant_id
    for flavor, n in adds.items():
        if flavor not in r.spec.flavors or _room(flavor, tenant_id, free, granted, ledger) < n:
            return None
    for flavor, n in adds.items():
        free[flavor] -= n
        granted[(tenant_id, flavor)] += n
    before = " + ".join(f"{n} {flavor}" for flavor, n in r.held.counts)
    after = " + ".join(f"{n} {flavor}" for flavor, n in config.counts)
    reason = (
        f"elastic round: moving from {before} to {after}, free and within quota; the faster steps repay the "
        f"{cost_s:.0f} s move within the round"
    )
    return Resize(job_id, r.held.devices, config.devices, reason, tuple(flavor for flavor, _ in config.counts))
