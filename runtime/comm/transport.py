"""Point-to-point messages between ranks, counted per link, and an emulated slow link.

Every byte the gradient exchange sends goes through ``Transport``: the collectives are built from its
``exchange``, so the bytes it counts are the lengths of the buffers really handed to the process
group (values, indices, headers and sizes alike), split by link class:

- ``intra``: between ranks of the same vendor group (NVLink, HCCS, ICI on real chips);
- ``cross``: between groups, the slow link of a mixed cluster.

``LinkThrottle`` is a token bucket on the cross-group sends of this rank. The local backend uses it
when it cannot shape the link for real (network namespaces with ``tc``, see
``runtime.backends.local.netem``); either way the worker is told which one ran.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["LinkCounters", "LinkThrottle", "Transport"]


class LinkThrottle:
    """A token bucket: sends drain at ``bits_per_s``, with ``burst_bytes`` allowed at once.

    ``consume(n)`` returns once the n bytes would have left the link: a sender waits as long as a
    serial link of that bandwidth would make it wait, queueing behind its own earlier sends."""

    def __init__(
        self,
        bits_per_s: float,
        burst_bytes: int = 64 * 1024,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not bits_per_s > 0:
            raise ValueError(f"bits_per_s: must be > 0, got {bits_per_s}")
        self.bytes_per_s = bits_per_s / 8.0
        self.burst_s = burst_bytes / self.bytes_per_s
        self.clock = clock
        self.sleep = sleep
        self._free_at = 0.0  # when the link has drained everything sent so far
        self._lock = threading.Lock()

    def consume(self, nbytes: int) -> float:
        """Wait until ``nbytes`` more have drained; returns the seconds waited."""
        with self._lock:
            now = self.clock()
            self._free_at = max(now, self._free_at) + nbytes / self.bytes_per_s
            wait = self._free_at - self.burst_s - now
        if wait > 0:
            self.sleep(wait)
            return wait
        return 0.0


@dataclass
class LinkCounters:
    intra_bytes: int = 0
    cross_bytes: int = 0

    def snapshot(self) -> LinkCounters:
        return LinkCounters(self.intra_bytes, self.cross_bytes)

    def since(self, earlier: LinkCounters) -> LinkCounters:
        return LinkCounters(self.intra_bytes - earlier.intra_bytes, self.cross_bytes - earlier.cross_bytes)


class Transport:
    """This rank's sends and receives over the default process group (gloo or NCCL), counted.

    ``vendor_groups[r]`` is rank r's vendor group: a send to another group crosses the slow link.
    """

    def __init__(self, rank: int, vendor_groups: Sequence[int], throttle: LinkThrottle | None = None) -> None:
        if not 0 <= rank < len(vendor_groups):
            raise ValueError(f"rank {rank} is outside the {len(vendor_groups)} ranks of vendor_groups")
        self.rank = rank
        self.vendor_groups = tuple(vendor_groups)
        self.throttle = throttle
        self.counters = LinkCounters()

    def crosses(self, peer: int) -> bool:
        return self.vendor_groups[peer] != self.vendor_groups[self.rank]

    def exchange(
        self,
        send_to: int | None,
        payload: torch.Tensor | None,
        recv_from: int | None,
        into: torch.Tensor | None,
    ) -> None:
        """Send ``payload`` to ``send_to`` while receiving ``into`` from ``recv_from`` (either may be None)."""
        sends = [(send_to, payload)] if send_to is not None and payload is not None else []
        receives = [(recv_from, into)] if recv_from is not None and into is not None else []
        self.exchange_many(sends, receives)

    def exchange_many(
        self, sends: Sequence[tuple[int, torch.Tensor]], receives: Sequence[tuple[int, torch.Tensor]]
    ) -> None:
        """All these sends and receives at once, in one round trip; returns when all are done."""
        pending: list[dist.Work | None] = [dist.irecv(into, src=src) for src, into in receives]
        keep = []
        for dst, payload in sends:
            nbytes = payload.numel() * payload.element_size()
            if self.crosses(dst):
                self.counters.cross_bytes += nbytes
                if self.throttle is not None:
                    self.throttle.consume(nbytes)
            else:
                self.counters.intra_bytes += nbytes
            keep.append(payload.contiguous())
            pending.append(dist.isend(keep[-1], dst=dst))
        for work in pending:
            if work is not None:  # None: this rank is not in the group (never so for the default group)
                work.wait()

    def send(self, dst: int, payload: torch.Tensor) -> None:
        self.exchange(dst, payload, None, None)

    def recv(self, src: int, into: torch.Tensor) -> None:
        self.exchange(None, None, src, into)
