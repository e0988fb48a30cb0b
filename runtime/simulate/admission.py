"""A trace-driven cluster simulator that runs the production scheduling code on a virtual clock.

``simulate`` replays a job trace on a described pool: at every arrival and completion it builds a
``Snapshot`` exactly as the control plane does and calls ``runtime.scheduling.schedule``, the same
function that admits real jobs; then it applies the admissions and preemptions. A preempted job goes
back to the queue and, without a checkpoint, starts its work again.

Besides job completion times it keeps the fairness ledger: between events, each tenant's demand
(devices asked for by its waiting and running jobs) gives its entitlement by weighted max-min
water-filling of the pool, and what it actually held is summed beside it.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from runtime.scheduling import (
    AdmittedJob,
    FreeDevice,
    PendingJob,
    Snapshot,
    TenantQuota,
    decayed_usage,
    schedule,
)

# Evictions at one instant settle in a cycle or two; more means jobs preempt each other in a loop.
MAX_CYCLES_PER_INSTANT = 20


@dataclass(frozen=True)
class TraceJob:
    job_id: int
    tenant_id: int
    submit_s: float
    devices: int
    flavors: tuple[str, ...]
    duration_s: float  # wall time on the devices it gets, once admitted
    priority: int = 0
    job_class: str = "synthetic-mlp"


@dataclass
class SimResult:
    jct_s: dict[int, float] = field(default_factory=dict)  # job -> completion minus submission
    device_seconds: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    entitled_seconds: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    preemptions: int = 0
    cycles: int = 0
    end_s: float = 0.0

    def share_error(self, tenant_id: int) -> float:
        """|device-seconds held - device-seconds entitled| / entitled."""
        entitled = self.entitled_seconds.get(tenant_id, 0.0)
        return abs(self.device_seconds.get(tenant_id, 0.0) - entitled) / entitled if entitled else 0.0


def water_fill(capacity: float, demand: Mapping[int, float], weight: Mapping[int, float]) -> dict[int, float]:
    """Weighted max-min fair split of ``capacity``: nobody gets more than it asks for, and what
    the satisfied leave over is split among the rest by weight."""
    share = {tenant: 0.0 for tenant in demand}
    active = {tenant for tenant, wanted in demand.items() if wanted > 0}
    left = capacity
    while active and left > 1e-9:
        total_weight = sum(weight.get(t, 1.0) for t in active)
        per_weight = left / total_weight
        satisfied = {t for t in active if demand[t] - share[t] <= per_weight * weight.get(t, 1.0) + 1e-9}
        if not satisfied:
            for t in active:
                share[t] += per_weight * weight.get(t, 1.0)
            break
        for t in satisfied:
            left -= demand[t] - share[t]
            share[t] = demand[t]
        active -= satisfied
    return share


@dataclass
class _Span:
    start: float
    end: float | None
    amount: float


@dataclass
class _Running:
    job: TraceJob
    admission_devices: tuple[FreeDevice, ...]
    demand: Mapping[str, int]
    borrowing: bool
    started_s: float
    version: int


def simulate(
    trace: Sequence[TraceJob],
    pool: Sequence[FreeDevice],
    tenants: Mapping[int, TenantQuota],
    nau_rates: Mapping[tuple[str, str], int],
    *,
    half_life_s: float,
    blend: float = 0.5,
    until_s: float | None = None,
    progress: Callable[[float], None] | None = None,
) -> SimResult:
    result = SimResult()
    arrivals = sorted(trace, key=lambda j: (j.submit_s, j.job_id))
    pending: dict[int, TraceJob] = {}
    running: dict[int, _Running] = {}
    versions: dict[int, int] = defaultdict(int)
    free: dict[str, FreeDevice] = {d.device_id: d for d in pool}
    # Usage intervals per (tenant, resource) for the decayed history: (start, end or None, amount).
    intervals: dict[tuple[int, str], list[_Span]] = defaultdict(list)
    open_intervals: dict[int, list[_Span]] = defaultdict(list)
    completions: list[tuple[float, int, int]] = []  # (time, job, version)
    weights = {t.tenant_id: t.weight for t in tenants.values()}
    capacity = float(len(pool))
    now = 0.0
    next_arrival = 0
    horizon = until_s if until_s is not None else float("inf")

    def account(until: float) -> None:
        span = until - now
        if span <= 0:
            return
        demand: dict[int, float] = defaultdict(float)
        for job in pending.values():
            demand[job.tenant_id] += job.devices
        for run in running.values():
            demand[run.job.tenant_id] += run.job.devices
            result.device_seconds[run.job.tenant_id] += len(run.admission_devices) * span
        for tenant, entitled in water_fill(capacity, demand, weights).items():
            result.entitled_seconds[tenant] += entitled * span

    def history() -> dict[int, dict[str, float]]:
        out: dict[int, dict[str, float]] = defaultdict(dict)
        cutoff = now - 6 * half_life_s
        for (tenant, resource), spans in intervals.items():
            spans[:] = [s for s in spans if s.end is None or s.end >= cutoff]
            if spans:
                out[tenant][resource] = decayed_usage(((s.start, s.end, s.amount) for s in spans), now, half_life_s)
        return out

    def stop(job_id: int) -> _Running:
        run = running.pop(job_id)
        for device in run.admission_devices:
            free[device.device_id] = device
        for span in open_intervals.pop(job_id, []):
            span.end = now
        return run

    while True:
        next_times = []
        if next_arrival < len(arrivals):
            next_times.append(arrivals[next_arrival].submit_s)
        while completions and completions[0][2] != versions[completions[0][1]]:
            heapq.heappop(completions)  # a preempted run's completion that will never come
        if completions:
            next_times.append(completions[0][0])
        if not next_times:
            break
        when = min(next_times)
        if when > horizon:
            account(horizon)
            now = horizon
            break
        account(when)
        now = when
        while completions and completions[0][0] <= now:
            _, job_id, version = heapq.heappop(completions)
            if version == versions[job_id] and job_id in running:
                run = stop(job_id)
                result.jct_s[job_id] = now - run.job.submit_s
        while next_arrival < len(arrivals) and arrivals[next_arrival].submit_s <= now:
            job = arrivals[next_arrival]
            pending[job.job_id] = job
            next_arrival += 1

        # Teardown is instant here, so the cycle that follows an eviction runs at the same moment.
        for repeat in range(MAX_CYCLES_PER_INSTANT + 1):
            if repeat == MAX_CYCLES_PER_INSTANT:
                raise RuntimeError(f"at t={now:.0f} s the scheduler kept preempting: a preemption loop")
            snapshot = Snapshot(
                now=now,
                tenants=tenants,
                pending=[
                    PendingJob(
                        job_id=j.job_id,
                        tenant_id=j.tenant_id,
                        priority=j.priority,
                        submitted_at=j.submit_s,
                        devices=j.devices,
                        flavors=j.flavors,
                        job_class=j.job_class,
                    )
                    for j in pending.values()
                ],
                admitted=[
                    AdmittedJob(
                        job_id=r.job.job_id,
                        tenant_id=r.job.tenant_id,
                        priority=r.job.priority,
                        admitted_at=r.started_s,
                        devices=r.admission_devices,
                        demand=r.demand,
                        borrowing=r.borrowing,
                    )
                    for r in running.values()
                ],
                free=sorted(free.values(), key=lambda d: d.device_id),
                nau_rates=nau_rates,
                history=history(),
            )
            decision = schedule(snapshot, blend=blend)
            result.cycles += 1
            for preemption in decision.preemptions:
                # Trace jobs are rigid (no min_devices): a victim never shrinks here (keep is None).
                run = stop(preemption.job_id)
                versions[preemption.job_id] += 1
                pending[preemption.job_id] = run.job  # no checkpoint: its work starts again
                result.preemptions += 1
            for admission in decision.admissions:
                if admission.preempts:
                    continue  # as in production: evict now, admit in the next cycle
                job = pending.pop(admission.job_id)
                for device in admission.devices:
                    del free[device.device_id]
                versions[job.job_id] += 1
                running[job.job_id] = _Running(
                    job, admission.devices, admission.demand, admission.borrowing, now, versions[job.job_id]
                )
                for resource, amount in admission.demand.items():
                    span = _Span(now, None, float(amount))
                    intervals[(job.tenant_id, resource)].append(span)
                    open_intervals[job.job_id].append(span)
                heapq.heappush(completions, (now + job.duration_s, job.job_id, versions[job.job_id]))
            if not decision.preemptions:
                break
        if progress is not None:
            progress(now)
    result.end_s = now
    return result


__all__ = ["SimResult", "TraceJob", "simulate", "water_fill"]
