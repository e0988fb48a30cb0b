"""Fair sharing: dominant share with exponentially decayed historical usage. Pure; the clock is an argument.

``decayed_usage`` turns usage intervals into an "average amount in use" in which older use counts less:
the integral of the amount weighted by exp(-lambda * age), times lambda = ln 2 / half_life. Constant use of
``u`` for a long time gives ``u``; use that stopped one half-life ago counts half.

``dominant_share`` blends the usage now with that history and divides by nominal quota, taking the largest
resource (dominant resource fairness), then divides by the tenant's weight.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from runtime.scheduling.model import MILLI, NAU, Limit

__all__ = ["UsageInterval", "decayed_usage", "dominant_share"]


class UsageInterval(NamedTuple):
    start: float  # seconds
    end: float | None  # None: still in use
    amount: float  # amount in use during the interval


def decayed_usage(intervals: Iterable[tuple[float, float | None, float]], now: float, half_life_s: float) -> float:
    """Exponentially decayed average usage at ``now`` (closed form; the part of an interval after now is ignored)."""
    if not half_life_s > 0:
        raise ValueError(f"half_life_s must be positive, got {half_life_s!r}")
    rate = math.log(2) / half_life_s
    total = 0.0
    for start, end, amount in intervals:
        stop = now if end is None else min(end, now)
        if stop <= start or not amount:
            continue
        # lambda * integral_start^stop amount * exp(-lambda (now - s)) ds
        total += amount * (math.exp(-rate * (now - stop)) - math.exp(-rate * (now - start)))
    return total


def dominant_share(
    limits: Mapping[str, Limit],
    usage_now: Mapping[str, float],
    history: Mapping[str, float],
    weight: float,
    blend: float = 0.5,
) -> float:
    """max over resources of ((1 - blend) * now + blend * history) / nominal, over weight (a nominal of 0
    counts as one unit)."""
    share = 0.0
    for resource, limit in limits.items():
        used = (1.0 - blend) * usage_now.get(resource, 0) + blend * history.get(resource, 0.0)
        # A tenant with no nominal share of what it uses ranks as if its nominal were one unit (a
        # device, or one NAU): otherwise a pure borrower would keep a share of 0 and win every time.
        nominal = limit.nominal if limit.nominal > 0 else (MILLI if resource == NAU else 1)
        share = max(share, used / nominal)
    if weight <= 0:
        return math.inf if share > 0 else 0.0
    return share / weight
