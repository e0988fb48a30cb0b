"""Where a job goes after a failure or a stop: the devices of its next attempt, and when to grow back.

Pure decisions over ``runtime.scheduling.placement.FreeDevice``; the control plane (``jobs.recovery``)
loads the free pool, calls these and persists what they decided.

The order of preference for the next attempt's devices:

1. the survivors: devices of the last attempt that are still healthy (nothing to move, warm caches);
2. free devices of the flavors the job ran on, to replace what failed like for like (the balancer's
   split and the throughput figures stay valid);
3. free devices of the other flavors the spec allows, in the spec's order.

The job takes as many as it asked for; when the pool has fewer it shrinks, down to its
``min_devices``; below that it waits. A shrunk job grows back when enough devices are free again
(``grow_target``) and the faster steps over the rest of its run repay the move (``worth_growing``): it
checkpoints, stops and restarts on the larger set.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from runtime.scheduling.placement import FreeDevice, choose_devices


@dataclass(frozen=True)
class RestartRequest:
    devices: int  # what the spec asks for
    min_devices: int  # the fewest the job accepts
    flavors: tuple[str, ...]  # the flavors the spec allows, in its order of preference
    previous: tuple[FreeDevice, ...]  # the last attempt's devices, in rank order
    failed: frozenset[str] = frozenset()  # device ids that must not be used again


@dataclass(frozen=True)
class RestartPlan:
    devices: tuple[FreeDevice, ...]  # in rank order: survivors first, then the replacements
    kept: int  # survivors among them
    same_flavor: int  # replacements of a flavor the job already ran on
    other_flavor: int  # replacements of another allowed flavor
    shrunk_by: int  # devices fewer than the spec asks for

    def describe(self) -> str:
        parts = [f"{len(self.devices)} device(s): {self.kept} kept"]
        if self.same_flavor:
            parts.append(f"{self.same_flavor} new of the same flavor")
        if self.other_flavor:
            parts.append(f"{self.other_flavor} of another allowed flavor")
        text = ", ".join(parts)
        if self.shrunk_by:
            text += f"; shrunk by {self.shrunk_by} until devices return"
        return text


def _hops(a: str, b: str) -> int:
    return 0 if a == b else 1


def plan_restart(
    request: RestartRequest,
    free: Sequence[FreeDevice],
    *,
    distance: Callable[[str, str], int] | None = None,
) -> RestartPlan | None:
    """The next attempt's devices, or None when fewer than ``min_devices`` are available.

    ``free`` is the pool's free devices; the last attempt's devices count as free only if they
    appear there (healthy, and nothing else took them)."""
    if not 1 <= request.min_devices <= request.devices:
        raise ValueError(f"min_devices must be in 1..devices ({request.devices}), got {request.min_devices}")
    allowed = set(request.flavors)
    usable = [d for d in free if d.flavor in allowed and d.device_id not in request.failed]
    free_ids = {d.device_id for d in usable}
    survivors = [d for d in request.previous if d.device_id in free_ids][: request.devices]
    taken = {d.device_id for d in survivors}
    others = [d for d in usable if d.device_id not in taken]
    want = request.devices - len(survivors)

    ran_on = list(dict.fromkeys(d.flavor for d in request.previous))
    order = ran_on + [f for f in request.flavors if f not in ran_on]
    available = Counter(d.flavor for d in others)
    counts: dict[str, int] = {}
    for flavor in order:
        if want <= 0:
            break
        take = min(want, available.get(flavor, 0))
        if take:
            counts[flavor] = take
            want -= take
    total = len(survivors) + sum(counts.values())
    if total < request.min_devices:
        return None
    chosen = choose_devices(others, counts, distance or _hops) if counts else []
    same = sum(1 for d in chosen if d.flavor in ran_on)
    return RestartPlan(
        devices=(*survivors, *chosen),
        kept=len(survivors),
        same_flavor=same,
        other_flavor=len(chosen) - same,
        shrunk_by=request.devices - total,
    )


def worth_growing(steps_left: int, step_s_now: float, step_s_after: float, move_cost_s: float) -> bool:
    """Whether moving to the larger set finishes sooner: the move's cost (checkpoint, stop, restart,
    restore) paid back by faster steps over the steps left. A step that would not get faster is never
    worth a move; an unknown step time (no telemetry yet) is not judged."""
    if step_s_now <= 0 or step_s_after <= 0:
        return step_s_now <= 0
    return move_cost_s + steps_left * step_s_after < steps_left * step_s_now


def grow_target(current: int, devices: int, allowed_free: int) -> int | None:
    """The size a shrunk job should grow back to now, or None to stay: it grows when the free
    devices of its flavors bring it closer to what it asked for (each move costs a restart)."""
    if current >= devices or allowed_free <= 0:
        return None
    return min(devices, current + allowed_free)
