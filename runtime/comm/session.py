"""Setting up a job's gradient exchange on one rank: the link, the layout, and ``auto`` resolved.

``open_exchange`` is called by every rank once the process group exists. Resolving ``auto`` measures
the cross-group link with a probe exchange between the group leaders, and every rank reaches the same
decision from the same all-reduced figure.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from runtime.comm.auto import choose_policy, lowrank_numbers
from runtime.comm.collectives import ring_allreduce
from runtime.comm.link import LinkEmulation
from runtime.comm.reducer import GradientReducer, Layout
from runtime.comm.transport import LinkThrottle, Transport
from runtime.jobspec import CommSpec

__all__ = ["Exchange", "measure_link", "open_exchange"]

PROBE_BYTES = 1 << 20


@dataclass
class Exchange:
    reducer: GradientReducer
    transport: Transport
    plan: CommSpec  # the job's spec with auto resolved
    reason: str
    link_gbit_measured: float | None

    def all_ranks(self) -> list[int]:
        return list(range(len(self.transport.vendor_groups)))


def measure_link(transport: Transport, layout: Layout) -> float:
    """Bytes/s of the cross-group link, as every rank agrees: the leaders time a probe ring
    all-reduce (after one unmeasured round that opens the connections), then all ranks average the
    leaders' figures. Infinite when there is one group."""
    leaders = list(layout.leaders)
    world = list(range(len(transport.vendor_groups)))
    rate = 0.0
    if transport.rank in leaders and len(leaders) > 1:
        probe = torch.zeros(PROBE_BYTES // 4)
        ring_allreduce(transport, leaders, probe[:1024])
        before = transport.counters.snapshot()
        started = time.monotonic()
        ring_allreduce(transport, leaders, probe)
        elapsed = time.monotonic() - started
        moved = transport.counters.since(before)  # what this rank really sent, whichever path it took
        rate = (moved.intra_bytes + moved.cross_bytes) / elapsed
    agreed = ring_allreduce(transport, world, torch.tensor([rate, 1.0 if rate > 0 else 0.0]))
    measured, count = float(agreed[0]), float(agreed[1])
    return measured / count if count else float("inf")


def open_exchange(
    params: Sequence[nn.Parameter],
    spec: CommSpec,
    *,
    rank: int,
    vendor_groups: Sequence[int],
    link: LinkEmulation | None = None,
    seed: int = 0,
    extras: int = 0,
) -> Exchange:
    """``extras``: fp32 values per step summed over the ranks with the gradients (``GradientReducer``)."""
    throttle = LinkThrottle(link.gbit * 1e9) if link is not None and link.mode == "token_bucket" else None
    transport = Transport(rank, vendor_groups, throttle)
    layout = Layout.of(vendor_groups, spec.hierarchical)
    compression, density, lowrank_rank = spec.compression, spec.density, spec.rank
    measured: float | None = None
    if compression == "auto":
        # One vendor group: no slow link to spare, whatever the flat layout's probe would measure.
        bytes_per_s = measure_link(transport, layout) if len(set(vendor_groups)) > 1 else float("inf")
        param_count = sum(p.numel() for p in params)
        matrix, lowrank = lowrank_numbers((p.shape for p in params), spec.rank)
        if bytes_per_s == float("inf"):
            choice = choose_policy(1.0, param_count, matrix_params=matrix, lowrank_params=lowrank, members=1)
        else:
            measured = bytes_per_s * 8 / 1e9
            choice = choose_policy(
                bytes_per_s,
                param_count,
                matrix_params=matrix,
                lowrank_params=lowrank,
                members=len(layout.leaders),
                density=spec.density,
                rank=spec.rank,
            )
        compression, density, lowrank_rank = choice.compression, choice.density, choice.rank
        reason = f"auto chose {compression}: {choice.reason}"
    else:
        reason = f"{compression}, as the job spec asks"
    plan = dataclasses.replace(spec, compression=compression, density=density, rank=lowrank_rank)
    reducer = GradientReducer(params, plan, transport, layout, seed=seed, extras=extras)
    return Exchange(reducer, transport, plan, reason, measured)
