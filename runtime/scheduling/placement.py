"""Gang placement over a capacity snapshot: pure decisions, no I/O.

The skeleton's policy is FIFO with all-or-nothing gangs. Within a job's allowed flavors it prefers
a single flavor (in the order the spec lists them) and packs onto the fewest nodes; only when no
single flavor has room does it mix flavors. Later issues add fair share and throughput-aware policies
behind the same inputs and outputs.

``FreePool`` makes the same device choice as ``_pack`` incrementally, for a cycle that admits many jobs
(``runtime.scheduling.scheduler``). Given a node-distance function (hops between two nodes, e.g.
``runtime.inventory.Fabric.hops``) it chooses by topology instead (``choose_devices``): one node if
one has room, else the nodes nearest each other, same rack before other racks.

Topology-aware choice minimizes the sum of pairwise hops over the gang's devices (two devices on
one node count 0). The sum, unlike the gang's diameter, rewards every device moved nearer the
others, so it prefers 7 devices in one rack and 1 across the hall to 4 and 4; it is proportional
to the mean hop distance of a pair, which is what all-to-all traffic and the latency of a ring built
over the gang pay; and it grows one node at a time, so a greedy search is cheap. Degraded devices
(``FreeDevice.degraded``) are chosen last: only when the healthy ones of their flavor are too few,
and then the gang takes every healthy one and the fewest degraded ones (those by topology).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

# Hops between two nodes, by name; 0 for a node and itself.
NodeDistance = Callable[[str, str], int]


@runtime_checkable
class RowDistance(Protocol):
    """A ``NodeDistance`` that also answers a whole row at once (``runtime.inventory.Fabric``): a gang
    that spans nodes measures every node with room from each of its seeds, 80,000 pairs in a cycle that
    admits a thousand jobs, and a row costs a fraction of as many calls."""

    def __call__(self, a: str, b: str) -> int: ...

    def hops_from(self, a: str, nodes: Sequence[str]) -> dict[str, int]: ...


@dataclass(frozen=True)
class FreeDevice:
    device_id: str
    node: str
    flavor: str
    # Schedulable but suspect (runtime.inventory.Health.DEGRADED): topology-aware choice takes it last.
    degraded: bool = False


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


# How many of the fullest nodes topology-aware choice tries growing a gang from; more seeds find
# better gangs on fragmented pools at a cost linear in the seeds.
SEEDS = 4
# Nodes that growth from a seed may pick from beyond the nearest ones that cover the gang: as many
# again, at most this many.
EXTRA_WINDOW = 16

_ByNode = Mapping[str, Mapping[str, Sequence[FreeDevice]]]  # node -> flavor -> devices, best first


def _room(devices: Mapping[str, Sequence[FreeDevice]], need: Mapping[str, int]) -> int:
    return sum(min(len(devices.get(flavor, ())), k) for flavor, k in need.items())


def _choose(by_node: _ByNode, need: Mapping[str, int], distance: NodeDistance, seeds: int = SEEDS) -> list[FreeDevice]:
    """Devices for ``need`` (flavor -> count, all available) with the fewest pairwise hops.

    One node, if one has room for the whole gang (the one with the least room, so that roomier
    nodes stay whole for larger gangs). Otherwise grow the gang from each of the ``seeds`` fullest
    nodes, greedily adding the node whose devices add the fewest hops to those chosen so far (ties:
    more room, nearer the seed), among the nodes nearest the seed; keep the growth with the fewest
    pairwise hops (ties: fewer nodes). Cost: seeds x (nodes + window x gang nodes) distance calls.
    """
    if len(need) == 1:  # one flavor, most gangs: the room is what the node has of it, up to the gang
        ((only, k),) = need.items()
        room = {node: min(len(devices.get(only, ())), k) for node, devices in by_node.items()}
    else:
        room = {node: _room(devices, need) for node, devices in by_node.items()}
    nodes = [node for node, r in room.items() if r > 0]
    whole = [node for node in nodes if all(len(by_node[node].get(f, ())) >= k for f, k in need.items())]
    if whole:

        def fit(node: str) -> tuple[int, int, str]:
            degraded = sum(d.degraded for f, k in need.items() for d in by_node[node][f][:k])
            return (degraded, sum(len(v) for v in by_node[node].values()), node)

        return _take_from(by_node, [min(whole, key=fit)], need)

    best: tuple[int, int, int] | None = None
    best_nodes: list[str] = []
    for rank, seed in enumerate(sorted(nodes, key=lambda node: (-room[node], node))[:seeds]):
        from_seed = (
            distance.hops_from(seed, nodes)
            if isinstance(distance, RowDistance)
            else {node: distance(seed, node) for node in nodes}
        )
        # Sorted as (hops, -room, name) tuples, built at once rather than by a key function per node.
        order = [node for _, _, node in sorted([(from_seed[node], -room[node], node) for node in nodes])]
        covered = dict.fromkeys(need, 0)
        size = 0
        for node in order:
            size += 1
            for flavor in need:
                covered[flavor] += len(by_node[node].get(flavor, ()))
            if all(covered[f] >= k for f, k in need.items()):
                break
        window = order[: size + min(size, EXTRA_WINDOW)]
        grown, score = _grow(by_node, need, distance, window, from_seed)
        key = (score, len(grown), rank)
        if best is None or key < best:
            best, best_nodes = key, grown
    return _take_from(by_node, best_nodes, need)


def _grow(
    by_node: _ByNode, need: Mapping[str, int], distance: NodeDistance, window: list[str], from_seed: Mapping[str, int]
) -> tuple[list[str], int]:
    """Grow a gang from ``window[0]`` within ``window``; returns its nodes in order and its pairwise hops."""
    left = dict(need)
    cost = dict.fromkeys(window, 0)  # hops from a node to every device chosen so far
    open_nodes = set(window)
    grown: list[str] = []
    score = 0
    current = window[0]
    while True:
        taken = 0
        for flavor in left:
            k = min(len(by_node[current].get(flavor, ())), left[flavor])
            left[flavor] -= k
            taken += k
        score += taken * cost[current]
        grown.append(current)
        open_nodes.discard(current)
        if not any(left.values()):
            return grown, score
        for node in open_nodes:
            cost[node] += taken * distance(current, node)
        rooms = {node: _room(by_node[node], left) for node in open_nodes}
        current = min(
            (node for node, r in rooms.items() if r > 0),
            key=lambda node: (cost[node], -rooms[node], from_seed[node], node),
        )


def _take_from(by_node: _ByNode, nodes: Sequence[str], need: Mapping[str, int]) -> list[FreeDevice]:
    left = dict(need)
    chosen: list[FreeDevice] = []
    for node in nodes:
        for flavor in left:
            k = min(len(by_node[node].get(flavor, ())), left[flavor])
            chosen.extend(by_node[node].get(flavor, ())[:k])
            left[flavor] -= k
    return chosen


def choose_devices(
    candidates: Iterable[FreeDevice], counts: Mapping[str, int], distance: NodeDistance, *, seeds: int = SEEDS
) -> list[FreeDevice]:
    """Choose ``counts[flavor]`` devices of each flavor among ``candidates`` with the fewest hops.

    A job may take several flavors at once; they are chosen together, so a second flavor's devices
    sit near the first's. The result is grouped by node (ranks on one node are neighbours). Degraded
    devices of a flavor are used only when its healthy ones are too few. ValueError if a flavor has
    too few candidates.
    """
    need = {flavor: k for flavor, k in counts.items() if k > 0}
    by_flavor: dict[str, list[FreeDevice]] = defaultdict(list)
    seen: set[str] = set()
    for device in candidates:
        if device.flavor in need and device.device_id not in seen:
            seen.add(device.device_id)
            by_flavor[device.flavor].append(device)
    by_node: dict[str, dict[str, list[FreeDevice]]] = defaultdict(dict)
    forced: list[FreeDevice] = []
    for flavor, k in list(need.items()):
        devices = by_flavor[flavor]
        if len(devices) < k:
            raise ValueError(f"only {len(devices)} {flavor} free, {k} asked")
        healthy = [d for d in devices if not d.degraded]
        if len(healthy) >= k:
            devices = healthy
        else:  # every healthy one, and the fewest degraded ones, chosen by topology
            forced.extend(sorted(healthy, key=_device_key))
            devices = [d for d in devices if d.degraded]
            need[flavor] = k - len(healthy)
        for device in devices:
            by_node[device.node].setdefault(flavor, []).append(device)
    for per_flavor in by_node.values():
        for devices in per_flavor.values():
            devices.sort(key=_device_key)
    need = {flavor: k for flavor, k in need.items() if k > 0}
    return forced + (_choose(by_node, need, distance, seeds) if need else [])


class FreePool:
    """The free devices of a cycle, by flavor and node, that hands out devices as ``_pack`` would.

    ``take(flavor, n)`` returns exactly what ``_pack(<free devices of flavor>, n)`` returns (fullest node
    first, ties by node name; device ids in order within a node) but costs O(nodes touched + log nodes)
    instead of a sort of every free device, so that a cycle can admit thousands of jobs cheaply.

    With a ``distance`` (hops between two nodes), ``take`` and ``take_many`` choose by topology
    instead (``choose_devices``: one node if one has room, else the nearest nodes), at a cost of a few
    distance calls per free node. Without one, behaviour is exactly as above.
    """

    def __init__(self, free: Iterable[FreeDevice] = (), distance: NodeDistance | None = None) -> None:
        self._distance = distance
        self._nodes: dict[str, dict[str, list[FreeDevice]]] = defaultdict(dict)  # flavor -> node -> by id
        self._order: dict[str, list[tuple[int, str]]] = defaultdict(list)  # flavor -> sorted (-free, node)
        self._count: dict[str, int] = defaultdict(int)
        self._degraded: dict[str, int] = defaultdict(int)  # flavor -> free degraded devices
        self._ids: set[str] = set()
        by_node: dict[tuple[str, str], list[FreeDevice]] = defaultdict(list)
        for device in free:
            if device.device_id not in self._ids:
                self._ids.add(device.device_id)
                by_node[(device.flavor, device.node)].append(device)
                self._degraded[device.flavor] += device.degraded
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
        if self._distance is not None:
            return self.take_many({flavor: n})
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
        self._degraded[flavor] -= sum(d.degraded for d in chosen)
        self._ids.difference_update(d.device_id for d in chosen)
        return chosen

    def take_many(self, counts: Mapping[str, int]) -> list[FreeDevice]:
        """Remove and return ``counts[flavor]`` devices of each flavor; ValueError (taking nothing) if too few.

        Without a distance this is ``take`` per flavor in the mapping's order; with one, the flavors
        are chosen together by topology.
        """
        need = {flavor: k for flavor, k in counts.items() if k > 0}
        for flavor, k in need.items():
            if k > self.count(flavor):
                raise ValueError(f"only {self.count(flavor)} {flavor} free, {k} asked")
        if self._distance is None:
            return [device for flavor, k in need.items() for device in self.take(flavor, k)]
        if not need:
            return []
        whole = self._best_fit_node(need)
        if whole is not None:
            chosen = self._nodes[whole[0]][whole[1]][: need[whole[0]]]
            self._withdraw(chosen)
            return chosen
        by_node: dict[str, dict[str, Sequence[FreeDevice]]] = defaultdict(dict)
        forced: list[FreeDevice] = []
        for flavor, k in list(need.items()):
            healthy = self._count[flavor] - self._degraded[flavor]
            for node, devices in self._nodes[flavor].items():
                if self._degraded[flavor]:
                    if healthy < k:  # as choose_devices: every healthy one, the fewest degraded by topology
                        forced.extend(d for d in devices if not d.degraded)
                    devices = [d for d in devices if d.degraded == (healthy < k)]
                if devices:
                    by_node[node][flavor] = devices
            if healthy < k:
                need[flavor] = k - healthy
        need = {flavor: k for flavor, k in need.items() if k > 0}
        chosen = forced + (_choose(by_node, need, self._distance) if need else [])
        self._withdraw(chosen)
        return chosen

    def _best_fit_node(self, need: Mapping[str, int]) -> tuple[str, str] | None:
        """(flavor, node) when ``_choose`` would put this one-flavor gang on one node without looking
        further: the node with the least room that fits it, ties by name. Read off the flavor's order
        by two bisections instead of a pass over every free node (a cycle admits a thousand gangs, most
        of them within a node). None when the gang spans flavors, degraded devices of the flavor are
        free (``_choose`` ranks nodes by them first), or no node has room."""
        if len(need) != 1:
            return None
        ((flavor, k),) = need.items()
        if self._degraded[flavor]:
            return None
        order = self._order[flavor]
        fits = bisect_left(order, (1 - k,))  # entries (-free, node) sort first when free >= k
        if fits == 0:
            return None
        least = order[fits - 1][0]  # the least room among the nodes that fit
        return flavor, order[bisect_left(order, (least,))][1]

    def _withdraw(self, chosen: Sequence[FreeDevice]) -> None:
        ids_by_node: dict[tuple[str, str], set[str]] = defaultdict(set)
        for device in chosen:
            ids_by_node[(device.flavor, device.node)].add(device.device_id)
        for (flavor, node), ids in ids_by_node.items():
            nodes, order = self._nodes[flavor], self._order[flavor]
            held = nodes[node]
            del order[bisect_left(order, (-len(held), node))]
            rest = [d for d in held if d.device_id not in ids]
            if rest:
                nodes[node] = rest
                insort(order, (-len(rest), node))
            else:
                del nodes[node]
            self._count[flavor] -= len(ids)
        for device in chosen:
            self._degraded[device.flavor] -= device.degraded
        self._ids.difference_update(d.device_id for d in chosen)

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
        self._degraded[flavor] += delta * device.degraded


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
