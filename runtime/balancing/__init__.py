"""How one job's global batch is split across unequal devices, and when to split it again.

Pure decisions (no torch, no I/O, no clock): the worker measures, this module decides.

- ``Split``: which samples of the global batch each rank trains on in each accumulation micro-step.
  Ranks take consecutive slices, so every sample of a global batch is seen exactly once per step,
  whatever the split.
- ``proportional_split``: micro-batches in proportion to weights (largest-remainder rounding), each rank
  at least one sample, none above its memory cap; when the caps together hold less than the global
  batch, the batch is processed in several accumulation micro-steps.
- ``max_micro_batch``: the memory model behind the caps.
- ``Balancer``: the weights w_i = a * score_i + (1 - a) * predicted_i (each as a share of its total),
  ``predicted`` being an exponentially weighted estimate of each rank's measured samples per second;
  it re-splits when the split those weights give would run faster than the current one, on the
  predicted speeds, by more than a threshold for several checks in a row (hysteresis, so it does not
  flap), or by a smaller margin for many checks in a row (a lasting small loss is worth a re-split),
  and reports a rank that stays far slower than its score promises (a straggler). A rank whose
  measurements leave its estimate by more than ``shift`` on ``shift_patience`` checks in a row, all
  the same way, changed speed (a throttled chip, a noisy neighbour): its estimate jumps to what it
  now measures (the EWMA would take several steps to follow, each of them slow) and the split follows
  at once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "BLENDS",
    "MODES",
    "Balancer",
    "BalancerConfig",
    "BalancingError",
    "Decision",
    "Split",
    "balance_efficiency",
    "equal_split",
    "max_micro_batch",
    "proportional_split",
]

MODES = ("dynamic", "static", "equal")
BLENDS = ("fixed", "trust")


class BalancingError(ValueError):
    """Input that cannot be balanced; the message names the field and the fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class Split:
    global_batch: int
    chunks: tuple[tuple[int, ...], ...]  # chunks[a][rank]: samples of rank in accumulation micro-step a

    def __post_init__(self) -> None:
        if not self.chunks or not self.chunks[0]:
            raise BalancingError("split", "needs at least one chunk of at least one rank")
        width = len(self.chunks[0])
        if any(len(chunk) != width for chunk in self.chunks):
            raise BalancingError("split", "every chunk needs one entry per rank")
        if any(b < 0 for chunk in self.chunks for b in chunk):
            raise BalancingError("split", "micro-batches must be >= 0")
        if sum(map(sum, self.chunks)) != self.global_batch:
            raise BalancingError(
                "split", f"covers {sum(map(sum, self.chunks))} samples; it must cover the global batch"
            )

    @property
    def world_size(self) -> int:
        return len(self.chunks[0])

    @property
    def accumulation(self) -> int:
        return len(self.chunks)

    def per_rank(self) -> tuple[int, ...]:
        """Samples per optimizer step for each rank."""
        return tuple(sum(chunk[rank] for chunk in self.chunks) for rank in range(self.world_size))

    def slices(self, rank: int) -> list[tuple[int, int]]:
        """The [lo, hi) ranges of the global batch that ``rank`` trains on, one per chunk.

        Chunk after chunk, rank after rank: disjoint, and together exactly 0..global_batch."""
        if not 0 <= rank < self.world_size:
            raise BalancingError("rank", f"{rank} is outside 0..{self.world_size - 1}")
        out: list[tuple[int, int]] = []
        start = 0
        for chunk in self.chunks:
            lo = start + sum(chunk[:rank])
            out.append((lo, lo + chunk[rank]))
            start += sum(chunk)
        return out

    def to_json(self) -> list[list[int]]:
        return [list(chunk) for chunk in self.chunks]

    @classmethod
    def from_json(cls, global_batch: int, data: Any) -> Split:
        if not isinstance(data, list) or not all(
            isinstance(chunk, list) and all(isinstance(b, int) and not isinstance(b, bool) for b in chunk)
            for chunk in data
        ):
            raise BalancingError("split", "expected a list of chunks, each a list of whole numbers per rank")
        return cls(global_batch, tuple(tuple(chunk) for chunk in data))


def _apportion(total: int, weights: Sequence[float], caps: Sequence[int], floor: int) -> list[int]:
    """``total`` whole samples in proportion to ``weights`` (largest remainder), each between ``floor`` and
    its cap. Ranks that hit their cap keep it; what they leave goes to the others, again by weight."""
    n = len(weights)
    share = [0] * n
    fixed = [False] * n
    left = total
    while True:
        open_ranks = [i for i in range(n) if not fixed[i]]
        if not open_ranks:
            break
        weight = sum(weights[i] for i in open_ranks)
        exact = {i: left * weights[i] / weight if weight > 0 else left / len(open_ranks) for i in open_ranks}
        over = [i for i in open_ranks if exact[i] > caps[i]]
        if not over:
            base = {i: max(floor, math.floor(exact[i])) for i in open_ranks}
            remainder = left - sum(base.values())
            # Largest remainders first; ties to the lower rank, so every rank computes the same split.
            order = sorted(open_ranks, key=lambda i: (-(exact[i] - math.floor(exact[i])), i))
            k = 0
            while remainder > 0:
                i = order[k % len(order)]
                if base[i] < caps[i]:
                    base[i] += 1
                    remainder -= 1
                k += 1
            while remainder < 0:  # the floor took more than the rounding left: take back from the largest
                i = max((j for j in open_ranks if base[j] > floor), key=lambda j: (base[j] - exact[j], -j))
                base[i] -= 1
                remainder += 1
            for i in open_ranks:
                share[i] = base[i]
            break
        for i in over:
            share[i] = caps[i]
            fixed[i] = True
            left -= caps[i]
    return share


def proportional_split(global_batch: int, weights: Sequence[float], caps: Sequence[int | None] | None = None) -> Split:
    """Micro-batches in proportion to ``weights``; every rank gets at least one sample per micro-step when
    the batch allows, and no rank more than its cap. When the caps together hold less than the batch, it
    is processed in as few accumulation micro-steps as fit, as evenly sized as possible."""
    n = len(weights)
    if n == 0:
        raise BalancingError("weights", "needs one weight per rank")
    if global_batch < 1:
        raise BalancingError("global_batch", f"must be >= 1, got {global_batch}")
    if any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
        raise BalancingError("weights", f"must be finite, >= 0 and not all 0, got {list(weights)}")
    limits = [global_batch if c is None else c for c in (caps or [None] * n)]
    if len(limits) != n:
        raise BalancingError("caps", f"has {len(limits)} entries; give one per rank ({n})")
    if any(c < 1 for c in limits):
        raise BalancingError("caps", "a rank that cannot hold one sample cannot train; raise its memory budget")
    accumulation = math.ceil(global_batch / sum(limits))
    base, extra = divmod(global_batch, accumulation)
    chunks = []
    for a in range(accumulation):
        size = base + (1 if a < extra else 0)
        floor = 1 if size >= n else 0
        chunks.append(tuple(_apportion(size, weights, limits, floor)))
    return Split(global_batch, tuple(chunks))


def equal_split(global_batch: int, world_size: int, caps: Sequence[int | None] | None = None) -> Split:
    return proportional_split(global_batch, [1.0] * world_size, caps)


def max_micro_batch(
    memory_bytes: float,
    *,
    param_count: int,
    activation_bytes_per_sample: float,
    budget: float = 0.7,
    state_bytes_per_param: int = 16,
) -> int:
    """The largest micro-batch that fits: ``budget`` of device memory, less the model's resident state
    (weights, gradients and optimizer state: ``state_bytes_per_param`` per parameter, 16 for fp32 Adam),
    over the activations one sample keeps for the backward pass."""
    if not 0 < budget <= 1:
        raise BalancingError("budget", f"must be in (0, 1], got {budget}")
    if activation_bytes_per_sample <= 0:
        raise BalancingError("activation_bytes_per_sample", "must be > 0")
    free = memory_bytes * budget - param_count * state_bytes_per_param
    if free < activation_bytes_per_sample:
        raise BalancingError(
            "memory",
            f"the model's state alone ({param_count * state_bytes_per_param} bytes) leaves no room "
            f"for one sample in {budget:.0%} of {memory_bytes:.0f} bytes; use a device with more memory",
        )
    return int(free // activation_bytes_per_sample)


def balance_efficiency(per_rank: Sequence[int], speeds: Sequence[float]) -> float:
    """Throughput of a split over the sum of the ranks' speeds: a synchronous step lasts as long as its
    slowest rank, ``max(b_i / s_i)``, and processes ``sum(b_i)`` samples."""
    if not speeds or any(s <= 0 for s in speeds):
        return 0.0
    slowest = max(b / s for b, s in zip(per_rank, speeds, strict=True))
    return sum(per_rank) / slowest / sum(speeds) if slowest > 0 else 0.0


@dataclass(frozen=True)
class BalancerConfig:
    mode: str = "dynamic"  # dynamic | static (by scores, once) | equal
    blend: str = "trust"  # trust: measurements weigh more as they accumulate; fixed: score_weight throughout
    score_weight: float = 0.6  # a in w = a * score + (1 - a) * predicted
    trust_steps: int = 3  # blend "trust": a decays as score_weight * trust_steps / (trust_steps + observations)
    threshold: float = 0.05  # re-split when the target split would be this much faster on the predicted speeds ...
    patience: int = 3  # ... for this many checks in a row
    # A smaller gain is taken too once it has lasted: a split left a couple of percent short after a
    # drift costs that much on every step for the rest of the run, and one re-split costs one step's
    # reshuffle. Noise does not last this long above it (the predicted speeds are smoothed).
    small_threshold: float = 0.015
    small_patience: int = 25
    # A change of level: measurements this far from a rank's estimate (as a ratio), and 3x further than
    # the rank's usual deviation, on this many checks in a row, the same way. A chip that halves its
    # speed is 50% off on every check, and each step at the old split waits for it; a rank whose own
    # compute competes for a busy host's cores is 20-50% off now and then, so its bar is higher.
    shift: float = 0.2
    shift_patience: int = 3
    ewma: float = 0.5  # weight of the newest measurement in ``predicted``
    straggler_ratio: float = 0.5  # slower than this share of what its score promises ...
    straggler_patience: int = 10  # ... for this many checks in a row: reported

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise BalancingError("balancing.mode", f"{self.mode!r} is not one of {', '.join(MODES)}")
        if self.blend not in BLENDS:
            raise BalancingError("balancing.blend", f"{self.blend!r} is not one of {', '.join(BLENDS)}")
        for name in ("score_weight", "ewma", "straggler_ratio"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise BalancingError(f"balancing.{name}", f"must be between 0 and 1, got {value}")
        if not 0 < self.threshold < 1:
            raise BalancingError("balancing.threshold", f"must be between 0 and 1, got {self.threshold}")
        if not 0 < self.small_threshold <= self.threshold:
            raise BalancingError(
                "balancing.small_threshold", f"must be above 0 and at most threshold ({self.threshold})"
            )
        if not 0 < self.shift < 1:
            raise BalancingError("balancing.shift", f"must be between 0 and 1, got {self.shift}")
        for name in ("patience", "small_patience", "shift_patience", "straggler_patience", "trust_steps"):
            if getattr(self, name) < 1:
                raise BalancingError(f"balancing.{name}", "must be >= 1")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> BalancerConfig:
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise BalancingError("balancing", "expected a mapping such as {mode: dynamic}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise BalancingError(f"balancing.{unknown[0]}", f"unknown; use {', '.join(sorted(known))}")
        return cls(**data)


@dataclass(frozen=True)
class Decision:
    split: Split  # the split to use from the next step
    changed: bool
    reason: str
    stragglers: tuple[int, ...] = ()
    predicted: tuple[float, ...] = ()  # per-rank predicted samples/s (empty before any measurement)
    efficiency: float = 0.0  # of the split in force during the step just measured, on predicted speeds
    drifting: int = 0  # checks in a row on which a re-split would have paid (0 once balanced or re-split)


@dataclass
class Balancer:
    config: BalancerConfig
    global_batch: int
    scores: Sequence[float]
    caps: Sequence[int | None] | None = None
    _split: Split = field(init=False)
    _predicted: list[float] = field(init=False, default_factory=list)
    _observations: int = field(init=False, default=0)
    _drifting: int = field(init=False, default=0)
    _lingering: int = field(init=False, default=0)  # checks in a row with a gain above small_threshold
    _slow: list[int] = field(init=False, default_factory=list)
    _shifting: list[list[float]] = field(init=False, default_factory=list)  # per rank: measurements off its estimate
    _noise: list[float] = field(init=False, default_factory=list)  # per rank: its usual |measured / estimate - 1|

    def __post_init__(self) -> None:
        if any(not math.isfinite(s) or s <= 0 for s in self.scores):
            raise BalancingError("scores", f"must be > 0 per rank, got {list(self.scores)}")
        n = len(self.scores)
        self._slow = [0] * n
        self._shifting = [[] for _ in range(n)]
        self._noise = [0.0] * n
        if self.config.mode == "equal":
            self._split = equal_split(self.global_batch, n, self.caps)
        else:
            self._split = proportional_split(self.global_batch, self.scores, self.caps)

    @property
    def split(self) -> Split:
        return self._split

    @property
    def predicted(self) -> tuple[float, ...]:
        return tuple(self._predicted)

    def weights(self) -> list[float]:
        """w_i = a * score share + (1 - a) * predicted share."""
        score_total = sum(self.scores)
        scores = [s / score_total for s in self.scores]
        if not self._predicted:
            return scores
        predicted_total = sum(self._predicted)
        predicted = [p / predicted_total for p in self._predicted]
        a = self.config.score_weight
        if self.config.blend == "trust":
            a *= self.config.trust_steps / (self.config.trust_steps + self._observations)
        return [a * s + (1 - a) * p for s, p in zip(scores, predicted, strict=True)]

    def observe(self, step: int, samples_per_s: Sequence[float]) -> Decision:
        """Take the step's measured samples/s per rank (a rank with no samples reports 0: ignored) and say
        which split the next step uses."""
        n = len(self.scores)
        if len(samples_per_s) != n:
            raise BalancingError("samples_per_s", f"has {len(samples_per_s)} entries; give one per rank ({n})")
        if not self._predicted:
            fallback = [s / sum(self.scores) for s in self.scores]
            measured = [m for m in samples_per_s if m > 0]
            scale = (
                sum(measured) / sum(f for f, m in zip(fallback, samples_per_s, strict=True) if m > 0)
                if measured
                else 1.0
            )
            self._predicted = [m if m > 0 else f * scale for m, f in zip(samples_per_s, fallback, strict=True)]
            shifted = False
        else:
            shifted = self._follow(samples_per_s)
        self._observations += 1
        efficiency = balance_efficiency(self._split.per_rank(), self._predicted)
        stragglers = self._stragglers()
        if self.config.mode != "dynamic":
            return Decision(self._split, False, f"{self.config.mode} split", stragglers, self.predicted, efficiency)

        target = proportional_split(self.global_batch, self.weights(), self.caps)
        gain = balance_efficiency(target.per_rank(), self._predicted) / efficiency - 1 if efficiency > 0 else 0.0
        if shifted and gain > self.config.threshold:
            # The shift has already lasted shift_patience checks: waiting for patience more would
            # only run more steps at a split made for the old speed.
            self._drifting = self._lingering = 0
            self._split = target
            reason = f"re-split at step {step}: a rank changed speed; {gain:.1%} faster on the measured speeds"
            return Decision(target, True, reason, stragglers, self.predicted, efficiency)
        if gain <= self.config.threshold:
            self._drifting = 0
            self._lingering = self._lingering + 1 if gain > self.config.small_threshold else 0
            if self._lingering >= self.config.small_patience:
                self._lingering = 0
                self._split = target
                reason = (
                    f"re-split at step {step}: {gain:.1%} faster on the measured speeds, "
                    f"{self.config.small_patience} checks in a row"
                )
                return Decision(target, True, reason, stragglers, self.predicted, efficiency)
            return Decision(
                self._split,
                False,
                f"balanced (a re-split would gain {gain:.1%})",
                stragglers,
                self.predicted,
                efficiency,
            )
        self._drifting += 1
        if self._drifting < self.config.patience:
            reason = f"a re-split would gain {gain:.1%}: {self._drifting} of {self.config.patience} checks"
            return Decision(self._split, False, reason, stragglers, self.predicted, efficiency, self._drifting)
        self._drifting = self._lingering = 0
        self._split = target
        reason = (
            f"re-split at step {step}: {gain:.1%} faster on the measured speeds, {self.config.patience} checks in a row"
        )
        return Decision(target, True, reason, stragglers, self.predicted, efficiency)

    def _follow(self, samples_per_s: Sequence[float]) -> bool:
        """Update the estimates with a step's measurements; True when a rank's speed changed level.

        A measurement off its rank's estimate by more than ``shift`` and by more than 3x the rank's
        usual deviation is held back from the EWMA (an outlier does not move the estimate);
        ``shift_patience`` of them in a row, the same way, are the rank's new level, which the
        estimate takes at once."""
        alpha, shifted = self.config.ewma, False
        for rank, (m, p) in enumerate(zip(samples_per_s, self._predicted, strict=True)):
            if m <= 0:
                continue
            held = self._shifting[rank]
            off = m / p - 1 if p > 0 else 0.0
            shift = max(self.config.shift, 3 * self._noise[rank])
            self._noise[rank] = 0.9 * self._noise[rank] + 0.1 * min(1.0, abs(off))
            if abs(off) <= shift or (held and (held[-1] > p) != (m > p)):
                held.clear()
            if abs(off) > shift:
                held.append(m)
                if len(held) >= self.config.shift_patience:
                    self._predicted[rank] = sum(held) / len(held)
                    held.clear()
                    shifted = True
                continue
            self._predicted[rank] = alpha * m + (1 - alpha) * p
        return shifted

    def promised(self, rank: int) -> float:
        """What ``rank``'s score promises: its share of the scores times the gang's predicted total."""
        return sum(self._predicted) * self.scores[rank] / sum(self.scores)

    def _stragglers(self) -> tuple[int, ...]:
        """Ranks whose measured speed stays below ``straggler_ratio`` of what their score promises, the
        promise scaled to the gang's measured total (a uniformly slow gang has no straggler)."""
        out = []
        for rank, predicted in enumerate(self._predicted):
            if predicted < self.config.straggler_ratio * self.promised(rank):
                self._slow[rank] += 1
            else:
                self._slow[rank] = 0
            if self._slow[rank] >= self.config.straggler_patience:
                out.append(rank)
        return tuple(out)
