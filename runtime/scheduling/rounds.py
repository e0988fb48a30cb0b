"""The round mechanism: which job runs in which configuration for the next round.

A policy's ``Allocation`` says what fraction of its time each job should spend in each configuration;
rounds make it so (Gavel, section 5). Each round, a (job, configuration) pair's priority is its allocated
fraction over the fraction of its life it has actually spent there, so a job that has had less than its
share comes first. Pairs are taken greedily in priority order while the configuration fits the devices
left; each job runs at most once per round.

Two rules of our own:

- *Re-placement must pay for itself.* A running job is moved to another configuration only when the
  move gains more work within the round than the checkpoint and restart cost it: a job that stops to
  move loses ``restart_cost_s`` of the round, so the new configuration must be that much faster.
  Otherwise that configuration is not a candidate for the job this round. (Time-sharing still preempts:
  another job may win the device the job holds, and the displaced job then waits or fills in elsewhere.)
- *Work conserving* (on by default): devices the priorities leave idle go to jobs that did not get a
  turn, first in configurations the policy gave them time in, then in any configuration that fits, the
  fastest first. Gavel leaves them idle; an idle device finishes no one's work.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from runtime.scheduling.policies import Allocation, Config

__all__ = ["RoundJob", "plan_round", "worth_moving"]


@dataclass(frozen=True)
class RoundJob:
    job_id: int
    age_s: float  # seconds since it arrived
    current: Config | None = None  # its configuration in the round that just ended, if it ran
    received_s: Mapping[Config, float] = field(default_factory=dict)  # seconds run in each configuration
    configs: Sequence[Config] = ()  # every configuration it may run in, for the work-conserving fill


def worth_moving(current_rate: float, new_rate: float, *, round_s: float, restart_cost_s: float) -> bool:
    """Does moving to a configuration of ``new_rate`` finish more work this round than staying?"""
    return new_rate * max(0.0, round_s - restart_cost_s) > current_rate * round_s


def plan_round(
    allocation: Allocation,
    jobs: Sequence[RoundJob],
    capacity: Mapping[str, int],
    *,
    rate: Callable[[int, Config], float],
    round_s: float,
    restart_cost_s: float = 0.0,
    work_conserving: bool = True,
) -> dict[int, Config]:
    """Job id -> configuration for the next round; jobs not in the answer wait. Deterministic."""
    candidates: list[tuple[float, float, int, Config]] = []
    for job in jobs:
        for config, fraction in allocation.get(job.job_id, {}).items():
            if fraction <= 0:
                continue
            if job.current is not None and config != job.current:
                moving_pays = worth_moving(
                    rate(job.job_id, job.current),
                    rate(job.job_id, config),
                    round_s=round_s,
                    restart_cost_s=restart_cost_s,
                )
                if not moving_pays:
                    continue  # not moved there this round; it may stay, wait, or fill in where it is displaced
            received = job.received_s.get(config, 0.0)
            priority = math.inf if received <= 0 or job.age_s <= 0 else fraction / (received / job.age_s)
            candidates.append((priority, fraction, job.job_id, config))
    # Highest priority first; then the larger allocated fraction; then the older job id; then the
    # configuration's own order: a total order, so the plan never depends on dict order.
    candidates.sort(key=lambda c: (-c[0], -c[1], c[2], c[3]))

    left = dict(capacity)
    plan: dict[int, Config] = {}
    for _, _, job_id, config in candidates:
        if job_id not in plan and config.fits(left):
            config.take_from(left)
            plan[job_id] = config
    if work_conserving:
        _fill(plan, allocation, jobs, left, rate)
    return plan


def _fill(
    plan: dict[int, Config],
    allocation: Allocation,
    jobs: Sequence[RoundJob],
    left: dict[str, int],
    rate: Callable[[int, Config], float],
) -> None:
    # Jobs that waited longest for a turn first: the least run relative to their age.
    waiting = sorted(
        (job for job in jobs if job.job_id not in plan),
        key=lambda j: (sum(j.received_s.values()) / j.age_s if j.age_s > 0 else 0.0, j.job_id),
    )
    for job in waiting:
        if not any(left.values()):
            return
        preferred = sorted(allocation.get(job.job_id, {}).items(), key=lambda item: (-item[1], item[0]))
        choices = [c for c, _ in preferred] + sorted(job.configs, key=lambda c: (-rate(job.job_id, c), c))
        if job.current is not None:
            choices.insert(0, job.current)  # staying costs no restart
        for config in choices:
            if config.fits(left):
                config.take_from(left)
                plan[job.job_id] = config
                break
