"""``compression: auto``: the least lossy policy whose cross-group traffic fits a time budget.

The inputs are measured or exact: the cross-group bandwidth (a probe exchange between the group
leaders when the job starts, ``runtime.comm.session``), the model's parameter count and the share
of it in matrices that low rank compresses. The rule, in order of what each policy gives up:

1. ``none`` when the dense exchange fits the budget: the link is fast enough, compression would only
   cost compute;
2. ``fp16`` when half the bytes fit (its loss is indistinguishable from dense);
3. ``powersgd`` at the spec's rank (4 by default) when most of the model is in matrices and its P
   and Q fit;
4. ``topk`` at the density that fits, between 1% and 10% (the spec's ``density`` is not used: auto
   chooses it).

The budget is what one step may spend on the slow link; 10 ms by default, small beside a training
step on an accelerator.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "DEFAULT_BUDGET_S",
    "AutoChoice",
    "choose_policy",
    "exchange_members",
    "lowrank_factors",
    "lowrank_numbers",
    "ring_bytes",
]

DEFAULT_BUDGET_S = 0.010
MIN_DENSITY = 0.01
POWERSGD_RANK = 4
# PowerSGD is chosen only when this share of the parameters is in compressible matrices: the rest
# travels dense beside P and Q.
POWERSGD_MIN_MATRIX_SHARE = 0.9
# Top-k bytes per entry sent: an fp16 value and, at these densities, a 16-bit gap (the header is noise).
TOPK_BYTES_PER_ENTRY = 4


@dataclass(frozen=True)
class AutoChoice:
    compression: str
    density: float
    rank: int
    reason: str


def ring_bytes(payload_bytes: float, members: int) -> float:
    """Bytes each member sends in a ring all-reduce of ``payload_bytes``."""
    return 0.0 if members < 2 else 2 * (members - 1) / members * payload_bytes


def lowrank_factors(shape: Sequence[int], rank: int) -> tuple[int, int, int]:
    """(n, m, r): a gradient of any shape as an n x m matrix (the first dimension by the rest), and the
    rank r of its PowerSGD factors P (n x r) and Q (m x r). Torch-free, so that the control plane can
    size a model it never builds; ``codecs.PowerSGDCodec`` uses the same rule."""
    n = shape[0] if len(shape) else 1
    m = max(1, math.prod(shape) // max(1, n))
    return n, m, min(rank, n, m)


def lowrank_numbers(shapes: Iterable[Sequence[int]], rank: int) -> tuple[int, int]:
    """(matrix_params, lowrank_params) of ``choose_policy`` for parameters of these shapes: the numbers in
    tensors that PowerSGD compresses (P and Q smaller than the matrix), and what PowerSGD sends, P and Q
    of those plus every other tensor dense."""
    matrix = lowrank = 0
    for shape in shapes:
        n, m, r = lowrank_factors(shape, rank)
        if r * (n + m) < n * m:
            matrix += n * m
            lowrank += r * (n + m)
        else:
            lowrank += math.prod(shape)
    return matrix, lowrank


def exchange_members(vendor_groups: Sequence[int], hierarchical: bool) -> int:
    """How many ranks take part in the cross-group exchange, as ``reducer.Layout.of`` lays them out: each
    vendor group's leader when the hierarchy is used (several groups, one of them with several ranks),
    else every rank."""
    sizes = [vendor_groups.count(group) for group in set(vendor_groups)]
    if hierarchical and len(sizes) > 1 and any(size > 1 for size in sizes):
        return len(sizes)
    return len(vendor_groups)


def choose_policy(
    link_bytes_per_s: float,
    param_count: int,
    *,
    matrix_params: int,
    lowrank_params: int,
    members: int,
    budget_s: float = DEFAULT_BUDGET_S,
    density: float = 0.1,
    rank: int = POWERSGD_RANK,
    link_source: str = "measured",
) -> AutoChoice:
    """``lowrank_params``: how many numbers rank-``rank`` P and Q (plus the dense rest) amount to;
    ``link_source``: where the link's speed comes from, for the reason (the worker measures it)."""
    if members < 2:
        return AutoChoice("none", density, rank, "one group: there is no cross-group link to spare")
    gbit = link_bytes_per_s * 8 / 1e9
    dense_s = ring_bytes(4 * param_count, members) / link_bytes_per_s
    head = (
        f"cross-group link {link_source} at {gbit:.2f} Gbit/s; the dense exchange of {param_count:,} parameters "
        f"takes {dense_s * 1e3:.1f} ms a step (budget {budget_s * 1e3:.0f} ms)"
    )
    if dense_s <= budget_s:
        return AutoChoice("none", density, rank, f"{head}: fast enough, no compression")
    if dense_s / 2 <= budget_s:
        return AutoChoice("fp16", density, rank, f"{head}: fp16 halves it to {dense_s / 2 * 1e3:.1f} ms")
    matrix_share = matrix_params / param_count if param_count else 0.0
    lowrank_s = ring_bytes(4 * lowrank_params, members) / link_bytes_per_s
    if matrix_share >= POWERSGD_MIN_MATRIX_SHARE and lowrank_s <= budget_s:
        return AutoChoice(
            "powersgd",
            density,
            rank,
            f"{head}: {matrix_share:.0%} of the model is in matrices; PowerSGD rank {rank} sends "
            f"{lowrank_params / param_count:.1%} of it, {lowrank_s * 1e3:.1f} ms",
        )
    # Top-k is all-gathered: each leader sends (members - 1) payloads.
    per_entry_s = (members - 1) * TOPK_BYTES_PER_ENTRY / link_bytes_per_s
    fitted = budget_s / (per_entry_s * param_count)
    chosen = max(MIN_DENSITY, min(0.1, fitted))
    note = "" if fitted >= MIN_DENSITY else f" (the budget would need {fitted:.2%}; {MIN_DENSITY:.0%} is the floor)"
    topk_s = per_entry_s * param_count * chosen
    return AutoChoice(
        "topk",
        chosen,
        rank,
        f"{head}: top-k at density {chosen:.3g} sends about {topk_s * 1e3:.1f} ms{note}",
    )
