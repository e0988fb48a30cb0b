"""When waiting jobs would start: the live queue played forward on a virtual clock.

``forecast_starts`` takes the snapshot an admission cycle decides on (quotas, the queue, the jobs that
hold devices and the free devices) and replays it with the production ``runtime.scheduling.schedule``:
a cycle now, then one at every moment a job is expected to end, until the jobs asked about have
started. A holding job ends at the time the caller estimates for it (its steps left at its measured
speed); a waiting job, once the replay admits it, runs for its samples at the speed of the devices it
got (``Work``). What the replay cannot know is left out, and the estimate is no better than that:

- jobs submitted later, failures, cancellations and operators' changes;
- a job with no end estimate keeps its devices for the whole replay (its devices never come back);
- a job preempted in the replay leaves it (its return to the queue is not played);
- the tenants' decayed usage (fair share) stays as it was at the snapshot.

Teardown takes no time here, so a cycle that evicts is followed by another at the same moment, as the
control plane's next cycle would admit the job that made room.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from runtime.scheduling import AdmittedJob, FreeDevice, PendingJob, Snapshot, schedule
from runtime.scheduling.policies import Policy

__all__ = ["DEFAULT_HORIZON_S", "Forecast", "Work", "forecast_starts"]

# Thirty days of virtual time: an estimate further out than that says nothing useful.
DEFAULT_HORIZON_S = 30 * 86400.0
# Evictions at one instant settle in a cycle or two (``runtime.simulate.admission`` has the same bound).
MAX_CYCLES_PER_INSTANT = 20
# An answer at submit time must come in a second or two, however deep the queue: the replay stops
# after this many scheduling cycles or this much wall time and says so (``Forecast.cut_short``).
MAX_CYCLES = 5000
DEFAULT_BUDGET_S = 2.0


@dataclass(frozen=True)
class Work:
    """What a waiting job has to do once it starts: ``samples`` to train, at ``per_device`` samples per
    second on one device of each flavor. A gang's speed is the sum of its devices' (what the balancer's
    proportional split approaches); on a flavor it has no figure for, its run has no end estimate."""

    samples: float
    per_device: Mapping[str, float] = field(default_factory=dict)

    def seconds_on(self, devices: Sequence[FreeDevice]) -> float | None:
        if any(self.per_device.get(device.flavor, 0.0) <= 0 for device in devices):
            return None
        return self.samples / sum(self.per_device[device.flavor] for device in devices)


@dataclass(frozen=True)
class Forecast:
    """``starts``: when each watched job would be admitted (the snapshot's clock), and ``placements``
    its devices then; a watched job missing from both did not start within the replay. ``endless``:
    holding jobs, and jobs admitted in the replay, whose end could not be estimated. ``ended`` and
    ``admitted``: how many jobs the replay saw end and start before it stopped, at ``until``."""

    starts: Mapping[int, float]
    placements: Mapping[int, tuple[FreeDevice, ...]]
    endless: frozenset[int]
    ended: int
    admitted: int
    cycles: int
    until: float
    cut_short: bool = False  # the cycle or time budget ran out before the watched jobs started


def forecast_starts(
    snapshot: Snapshot,
    *,
    ends_at: Mapping[int, float | None],
    work: Mapping[int, Work],
    watch: Collection[int],
    blend: float = 0.5,
    policy: Policy | None = None,
    horizon_s: float = DEFAULT_HORIZON_S,
    max_cycles: int = MAX_CYCLES,
    budget_s: float = DEFAULT_BUDGET_S,
) -> Forecast:
    """Replay ``snapshot`` until every job in ``watch`` has started, no job is left to end, or
    ``horizon_s`` has passed, or ``max_cycles`` cycles or ``budget_s`` seconds of wall time are spent
    (``cut_short``). ``ends_at``: when each holding job ends (None or missing: unknown);
    ``work``: each waiting job's (missing: it runs without an end estimate once admitted)."""
    now = snapshot.now
    pending: dict[int, PendingJob] = {job.job_id: job for job in snapshot.pending}
    running: dict[int, AdmittedJob] = {job.job_id: job for job in snapshot.admitted}
    ends: dict[int, float] = {
        job_id: end for job_id in running if (end := ends_at.get(job_id)) is not None and math.isfinite(end)
    }
    # Devices being released are free within seconds: the replay has them free from the start.
    free: dict[str, FreeDevice] = {device.device_id: device for device in (*snapshot.free, *snapshot.releasing)}
    waiting_for = set(watch) & set(pending)
    starts: dict[int, float] = {}
    placements: dict[int, tuple[FreeDevice, ...]] = {}
    endless = {job_id for job_id in running if job_id not in ends}
    cycles = ended = admitted = 0
    deadline = time.perf_counter() + budget_s
    cut_short = False

    while True:
        for _ in range(MAX_CYCLES_PER_INSTANT):
            result = schedule(
                replace(
                    snapshot,
                    now=now,
                    pending=sorted(pending.values(), key=lambda job: job.job_id),
                    admitted=list(running.values()),
                    free=sorted(free.values(), key=lambda device: device.device_id),
                    releasing=(),
                ),
                blend=blend,
                policy=policy,
            )
            cycles += 1
            for preemption in result.preemptions:
                victim = running.pop(preemption.job_id, None)
                if victim is None:
                    continue
                keep = preemption.keep or 0  # an elastic victim shrinks onto its first devices and runs on
                free.update((device.device_id, device) for device in victim.devices[keep:])
                if keep:
                    # Its end stays as estimated: on fewer devices it would end a little later.
                    running[victim.job_id] = victim.shrunk(keep)
                    continue
                ends.pop(victim.job_id, None)
                endless.discard(victim.job_id)
            for admission in result.admissions:
                if admission.preempts:
                    continue  # evicted now, admitted by the next cycle (as the control plane does)
                job = pending.pop(admission.job_id)
                for device in admission.devices:
                    del free[device.device_id]
                running[job.job_id] = AdmittedJob(
                    job_id=job.job_id,
                    tenant_id=job.tenant_id,
                    priority=job.priority,
                    admitted_at=now,
                    devices=admission.devices,
                    demand=admission.demand,
                    borrowing=admission.borrowing,
                )
                admitted += 1
                seconds = work[job.job_id].seconds_on(admission.devices) if job.job_id in work else None
                if seconds is None:
                    endless.add(job.job_id)
                else:
                    ends[job.job_id] = now + seconds
                if job.job_id in waiting_for:
                    starts[job.job_id] = now
                    placements[job.job_id] = admission.devices
                    waiting_for.discard(job.job_id)
            if not result.preemptions:
                break
        if not waiting_for or not ends:
            break
        if cycles >= max_cycles or time.perf_counter() > deadline:
            cut_short = True
            break
        now = min(ends.values())
        if now > snapshot.now + horizon_s:
            break
        for job_id in [job_id for job_id, end in ends.items() if end <= now]:
            del ends[job_id]
            free.update((device.device_id, device) for device in running.pop(job_id).devices)
            ended += 1
    return Forecast(
        starts=starts,
        placements=placements,
        endless=frozenset(endless),
        ended=ended,
        admitted=admitted,
        cycles=cycles,
        until=now,
        cut_short=cut_short,
    )
