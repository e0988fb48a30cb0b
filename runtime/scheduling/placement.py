"""Gang placement over a capacity snapshot: pure decisions, no I/O.

The skeleton's policy is FIFO with all-or-nothing gangs. Within a job's allowed flavors it prefers
a single flavor (in the order the spec lists them) and packs onto the fewest nodes; only when no
single flavor has room does it mix flavors. Later issues add fair share and throughput-aware policies
behind the same inputs and outputs.

``FreePool`` makes the same device choice as ``_pack`` incrementally, for a cycle that admits many jobs
(``runtime.scheduling.scheduler``).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import defaultdict
from collections.abc import Iterable, Sequence
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


def _device_key(device: FreeDevice) -> str:
    return device.device_id


class FreePool:
    """The free devices of a cycle, by flavor and node, that hands out devices as ``_pack`` would.

    ``take(flavor, n)`` returns exactly what ``_pack(<free devices of flavor>, n)`` returns (fullest node
    first, ties by node name; device ids in order within a node) but costs O(nodes touched + log nodes)
    instead of a sort of every free device, so that a cycle can admit thousands of jobs cheaply.
    """

    def __init__(self, free: Iterable[FreeDevice] = ()) -> None:
        self._nodes: dict[str, dict[str, list[FreeDevice]]] = defaultdict(dict)  # flavor -> node -> by id
        self._order: dict[str, list[tuple[int, str]]] = defaultdict(list)  # flavor -> sorted (-free, node)
        self._count: dict[str, int] = defaultdict(int)
        self._ids: set[str] = set()
        by_node: dict[tuple[str, str], list[FreeDevice]] = defaultdict(list)
        for device in free:
            if device.device_id not in self._ids:
                self._ids.add(device.device_id)
                by_node[(device.flavor, device.node)].append(device)
        for (flavor, node), devices in by_node.items():
            devices.sort(key=_device_key)
            self._nodes[flavor][node] = devices
            self._order[flavor].append((-len(devices), node))
            self._count[flavor] += len(devices)
        for order in self._order.values():
            order.sort()

    def count(self, flavor: str) -> int:
        return self._count.get(flavor, 0)

    def __contains__(self, device_id: object) -> bool:
        return device_id in self._ids

    def take(self, flavor: str, n: int) -> list[FreeDevice]:
        """Remove and return ``n`` devices of ``flavor``, fewest nodes first; ValueError if too few."""
        if n > self.count(flavor):
            raise ValueError(f"only {self.count(flavor)} {flavor} free, {n} asked")
        if n <= 0:
            return []
        nodes, order = self._nodes[flavor], self._order[flavor]
        chosen: list[FreeDevice] = []
        touched: list[tuple[str, int]] = []
        i = 0
        while len(chosen) < n:
            node = order[i][1]
            k = min(len(nodes[node]), n - len(chosen))
            chosen.extend(nodes[node][:k])
            touched.append((node, k))
            i += 1
        del order[:i]
        for node, k in touched:
            rest = nodes[node][k:]
            if rest:
                nodes[node] = rest
                insort(order, (-len(rest), node))
            else:
                del nodes[node]
        self._count[flavor] -= n
        self._ids.difference_update(d.device_id for d in chosen)
        return chosen

    def put(self, devices: Iterable[FreeDevice]) -> list[FreeDevice]:
        """Give devices back; returns those that were not free already."""
        added: list[FreeDevice] = []
        for device in devices:
            if device.device_id in self._ids:
                continue
            self._ids.add(device.device_id)
            self._resize(device.flavor, device.node, +1, device)
            added.append(device)
        return added

    def discard(self, devices: Iterable[FreeDevice]) -> None:
        """Withdraw devices if they are free (a device not free is ignored)."""
        for device in devices:
            if device.device_id not in self._ids:
                continue
            self._ids.discard(device.device_id)
            self._resize(device.flavor, device.node, -1, device)

    def _resize(self, flavor: str, node: str, delta: int, device: FreeDevice) -> None:
        nodes, order = self._nodes[flavor], self._order[flavor]
        held = nodes.get(node, [])
        if held:
            del order[bisect_left(order, (-len(held), node))]
        if delta > 0:
            insort(held, device, key=_device_key)
        else:
            held = [d for d in held if d.device_id != device.device_id]
        if held:
            nodes[node] = held
            insort(order, (-len(held), node))
        else:
            nodes.pop(node, None)
        self._count[flavor] += delta


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
