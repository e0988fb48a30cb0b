"""Gang placement over a capacity snapshot: pure decisions, no I/O.

The skeleton's policy is FIFO with all-or-nothing gangs. Within a job's allowed flavors it prefers
a single flavor (in the order the spec lists them) and packs onto the fewest nodes; only when no
single flavor has room does it mix flavors. Later issues add fair share and throughput-aware policies
behind the same inputs and outputs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class FreeDevice:
    device_id: str
    node: str
    flavor: str


@dataclass(frozen=True)
class GangRequest:
    devices: int
    flavors: tuple[str, ...]


@dataclass(frozen=True)
class Placement:
    devices: tuple[FreeDevice, ...]

    @property
    def flavors(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(d.flavor for d in self.devices))


@dataclass(frozen=True)
class Refusal:
    reason: str


def _pack(candidates: Sequence[FreeDevice], count: int) -> list[FreeDevice]:
    """Take ``count`` devices, filling the nodes with the most free devices first (fewest nodes)."""
    by_node: dict[str, list[FreeDevice]] = defaultdict(list)
    for device in candidates:
        by_node[device.node].append(device)
    chosen: list[FreeDevice] = []
    for node in sorted(by_node, key=lambda n: (-len(by_node[n]), n)):
        for device in sorted(by_node[node], key=lambda d: d.device_id):
            if len(chosen) == count:
                return chosen
            chosen.append(device)
    return chosen


def place_gang(request: GangRequest, free: Sequence[FreeDevice]) -> Placement | Refusal:
    allowed = request.flavors
    usable = [d for d in free if d.flavor in allowed]
    by_flavor: dict[str, list[FreeDevice]] = defaultdict(list)
    for device in usable:
        by_flavor[device.flavor].append(device)

    for flavor in allowed:
        if len(by_flavor[flavor]) >= request.devices:
            return Placement(devices=tuple(_pack(by_flavor[flavor], request.devices)))

    if len(usable) >= request.devices:
        chosen: list[FreeDevice] = []
        for flavor in allowed:
            chosen.extend(_pack(by_flavor[flavor], min(len(by_flavor[flavor]), request.devices - len(chosen))))
            if len(chosen) == request.devices:
                return Placement(devices=tuple(chosen))

    counts = ", ".join(f"{len(by_flavor[f])} {f}" for f in allowed)
    return Refusal(reason=f"waiting for {request.devices} devices; free now: {counts}")
