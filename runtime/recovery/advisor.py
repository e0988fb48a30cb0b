"""How often to checkpoint: Young's and Daly's optimal interval from the save cost and the failure rate.

Checkpointing too often wastes the time each save stalls training; too rarely, the work redone after
a failure. Young (1974) balanced the two to first order: an interval of ``sqrt(2 * C * M)`` of
compute between saves, for a save costing ``C`` seconds and a mean time between failures ``M``.
Daly (2006) added the higher-order terms that matter once ``C`` is not small next to ``M``::

    tau = sqrt(2 C M) * (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C     for C < 2M
    tau = M                                                          otherwise

Here the cost is what a save stalls the training thread (a background save's snapshot, not its
write), the advice is in steps, and the optimizer state, whose save costs more, gets its own,
longer interval, rounded up to a multiple of the weights interval (every full save is also a
weights save). Torch-free.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

# The longest interval advised, in steps: with no failures on record the optimum is infinite, and
# "never" is not advice a job should take (a bug or a preemption still ends it some day).
MAX_INTERVAL_STEPS = 1_000_000


@dataclass(frozen=True)
class IntervalAdvice:
    """The advised intervals and the numbers behind them (seconds unless the name says steps).

    ``young_s``/``daly_s``: the optimal compute time between weights saves by each formula (inf with
    no failures). ``expected_waste``: the share of wall time lost at the advised steps, to first
    order: ``c / (tau + c) + (tau + c) / (2 M)``, with ``tau`` the advised interval in seconds and
    ``c`` the mean stall per save (a full save every ``optimizer_every / weights_every`` saves),
    capped at 1.
    """

    checkpoint_cost_s: float
    full_cost_s: float
    mtbf_s: float
    step_time_s: float
    young_s: float
    daly_s: float
    weights_every: int
    optimizer_every: int
    expected_waste: float
    reasoning: str

    def to_json(self) -> dict[str, Any]:
        """JSON has no infinity: an infinite MTBF or interval becomes null."""
        return {
            key: None if isinstance(value, float) and math.isinf(value) else value
            for key, value in asdict(self).items()
        }


def _number(name: str, value: float, *, positive: bool, allow_inf: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if math.isinf(value) and not (allow_inf and value > 0):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be greater than 0, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be at least 0, got {value!r}")
    return float(value)


def job_mtbf_s(devices: int, failures_per_device_hour: float) -> float:
    """A job fails when any of its devices does: with independent failures the rates add up, so the
    job's mean time between failures is ``3600 / (devices * rate)`` seconds; inf at rate 0."""
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"devices must be a whole number of at least 1, got {devices!r}")
    rate = _number("failures_per_device_hour", failures_per_device_hour, positive=False)
    if rate == 0:
        return math.inf
    return 3600.0 / (devices * rate)


def young_interval_s(cost_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum: ``sqrt(2 * cost * MTBF)``; inf with no failures, even for a free save."""
    if math.isinf(mtbf_s):
        return math.inf
    return math.sqrt(2.0 * cost_s * mtbf_s)


def daly_interval_s(cost_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum (compute time between saves); the MTBF itself once a save costs
    twice the MTBF or more, where the expansion no longer holds."""
    if math.isinf(mtbf_s):
        return math.inf
    if cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    ratio = cost_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - cost_s


def _steps(interval_s: float, step_time_s: float) -> int:
    if math.isinf(interval_s):
        return MAX_INTERVAL_STEPS
    return max(1, min(MAX_INTERVAL_STEPS, math.floor(interval_s / step_time_s + 0.5)))


def _human(seconds: float) -> str:
    if math.isinf(seconds):
        return "never"
    if seconds < 1.0:
        return f"{seconds * 1000:.3g} ms"
    if seconds < 120.0:
        return f"{seconds:.3g} s"
    if seconds < 2 * 3600.0:
        return f"{seconds / 60:.3g} min"
    if seconds < 72 * 3600.0:
        return f"{seconds / 3600:.3g} h"
    return f"{seconds / 86400:.3g} days"


def advise(
    checkpoint_cost_s: float,
    mtbf_s: float,
    step_time_s: float,
    *,
    full_cost_s: float | None = None,
) -> IntervalAdvice:
    """The intervals for a weights save stalling ``checkpoint_cost_s``, a full save stalling
    ``full_cost_s`` (None: the same), a job MTBF of ``mtbf_s`` (inf: no failures on record) and
    steps of ``step_time_s``."""
    return _advise(checkpoint_cost_s, mtbf_s, step_time_s, full_cost_s, failures=None)


def advise_for_job(
    checkpoint_cost_s: float,
    devices: int,
    failures_per_device_hour: float,
    step_time_s: float,
    *,
    full_cost_s: float | None = None,
) -> IntervalAdvice:
    """``advise`` with the MTBF from the job's size and its devices' failure rate, which the
    reasoning then names."""
    mtbf_s = job_mtbf_s(devices, failures_per_device_hour)
    failures = (
        f"with {devices} device{'s' if devices != 1 else ''} at {failures_per_device_hour:g} failures per device-hour"
    )
    return _advise(checkpoint_cost_s, mtbf_s, step_time_s, full_cost_s, failures=failures)


def _advise(
    checkpoint_cost_s: float,
    mtbf_s: float,
    step_time_s: float,
    full_cost_s: float | None,
    *,
    failures: str | None,
) -> IntervalAdvice:
    cost = _number("checkpoint_cost_s", checkpoint_cost_s, positive=False)
    mtbf = _number("mtbf_s", mtbf_s, positive=True, allow_inf=True)
    step = _number("step_time_s", step_time_s, positive=True)
    full = cost if full_cost_s is None else _number("full_cost_s", full_cost_s, positive=False)

    young = young_interval_s(cost, mtbf)
    daly = daly_interval_s(cost, mtbf)
    daly_full = daly_interval_s(full, mtbf)
    weights_every = _steps(daly, step)
    # In whole steps like the weights interval, then rounded up to a multiple of it: every full save
    # is also a weights save, and the optimizer interval may not fall below its own optimum. The
    # cap keeps it a multiple too.
    full_steps = _steps(daly_full, step)
    multiples = -(-full_steps // weights_every)
    optimizer_every = min(multiples, max(1, MAX_INTERVAL_STEPS // weights_every)) * weights_every

    full_share = weights_every / optimizer_every  # the share of saves that are full
    mean_cost = cost + (full - cost) * full_share
    period = weights_every * step + mean_cost
    waste = mean_cost / period if period > 0 else 0.0
    if not math.isinf(mtbf):
        waste += period / (2.0 * mtbf)
    waste = min(1.0, waste)

    sentences = [
        f"A weights save stalls training {_human(cost)}" + (f", a full save {_human(full)}" if full != cost else "")
    ]
    where = f"{failures} the job" if failures else "the job"
    if math.isinf(mtbf):
        sentences[0] += (
            f"; {where} has no failures on record, so checkpoint rarely: "
            f"the intervals are capped at {MAX_INTERVAL_STEPS:,} steps"
        )
        sentences.append(
            f"Weights every {weights_every:,} steps of {_human(step)}, optimizer state every {optimizer_every:,}"
        )
    else:
        sentences[0] += f"; {where} fails every {_human(mtbf)} on average"
        basis = (
            f"a save costs at least twice the MTBF, so Daly's interval is the MTBF, {_human(daly)}"
            if cost >= 2 * mtbf
            else f"Daly's interval is {_human(daly)} (Young's {_human(young)})"
        )
        sentences.append(f"{basis[0].upper()}{basis[1:]} = {weights_every:,} steps of {_human(step)}")
        sentences.append(
            f"The optimizer state, by Daly's {_human(daly_full)} for a full save rounded up to a multiple of "
            f"{weights_every:,}, goes every {optimizer_every:,} steps"
        )
    share = "under 0.01%" if waste < 1e-4 else f"{waste * 100:.3g}%"
    sentences.append(f"Expected waste: {share} of the time in save stalls and rework after failures")
    return IntervalAdvice(
        checkpoint_cost_s=cost,
        full_cost_s=full,
        mtbf_s=mtbf,
        step_time_s=step,
        young_s=young,
        daly_s=daly,
        weights_every=weights_every,
        optimizer_every=optimizer_every,
        expected_waste=waste,
        reasoning=". ".join(sentences) + ".",
    )
