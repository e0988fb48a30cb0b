"""Network topologies of the pool and hop distances between nodes.

A node's place in a topology is a short tuple of integers, its *coordinates*, whose meaning the
topology gives. ``hops(a, b)`` counts the links a message crosses from node ``a`` to node ``b`` on a
minimal route; two nodes with equal coordinates are the same node (0 hops). Hop counts are
comparable within one topology only: a fat tree counts the node-to-switch links, a torus links
nodes directly.

- ``Torus3D(dims)``: coordinates ``(x, y, z)``; nodes are linked to their six neighbours and each
  ring wraps around, so the distance is the Manhattan distance with wrap-around per dimension:
  ``sum(min(|a_i - b_i|, dims_i - |a_i - b_i|))``. (TPU v4 pods are 3D tori.)
- ``Dragonfly(groups, routers_per_group, global_links_per_router)``: coordinates
  ``(group, router, slot)``; nodes hang off routers, the routers of a group are fully connected
  by local links, and groups are joined by global links. Counting every link, node to router
  included: same router 2 (node, router, node); same group 3 (one local link); another group
  3 to 5: node to its router, a local link to the router that owns the global link to the other
  group if that is another router, the global link, a local link on the far side if needed, and the
  link to the node. Which router owns which global link follows the usual *consecutive*
  arrangement: global link ``k`` of group ``g`` (``k = 0 .. routers * links - 1``, router
  ``k // links`` owns it) goes to group ``(g + k + 1) mod groups``, which needs
  ``groups <= routers_per_group * global_links_per_router + 1`` so every pair of groups is linked.
  With exactly that many groups each pair of groups shares one cable. With fewer, the links wrap
  around: a pair may share several parallel cables (and a link that would come back to its own
  group is unused). The ``i``-th link of ``g`` to ``h`` (in order of ``k``) lands on the router
  that owns the ``i``-th link of ``h`` to ``g`` (cycling when ``h`` has fewer), and the same
  from ``h``'s side; a route takes the best of these cables, so between groups it is 3, plus one
  when the cable leaves from another router than the source's, plus one when it lands on another
  router than the destination's.
- ``FatTree(pods, racks_per_pod, nodes_per_rack)``: coordinates ``(pod, rack, slot)``; a node
  hangs off its rack's edge switch, edge switches off their pod's aggregation switches, pods off
  the core. Counting every link: same node 0, same rack 2 (node, edge, node), same pod 4 (up to
  aggregation and down), otherwise 6 (up to the core and down). The k-ary fat tree of Al-Fares et
  al. is the case ``pods = k, racks_per_pod = k/2, nodes_per_rack = k/2``.

When a pool file names no topology, ``rack_fat_tree`` derives a one-pod fat tree from the nodes'
``rack`` labels: same node 0, same rack 2, otherwise 4.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any, ClassVar

Coords = tuple[int, ...]


class Topology(ABC):
    """A network topology: validates node coordinates and counts hops between them."""

    kind: ClassVar[str]
    coord_names: ClassVar[tuple[str, ...]]

    @abstractmethod
    def hops(self, a: Coords, b: Coords) -> int:
        """Links crossed on a minimal route from the node at ``a`` to the node at ``b``."""

    def hops_from(self, a: Coords, others: Sequence[Coords]) -> list[int]:
        """``hops(a, b)`` for each of ``others``, in order (a topology may answer a row faster)."""
        return [self.hops(a, b) for b in others]

    @abstractmethod
    def bounds(self) -> tuple[int, ...]:
        """The exclusive upper bound of each coordinate (each runs from 0)."""

    @abstractmethod
    def parameters(self) -> dict[str, Any]:
        """The parameters that ``make_topology(kind, parameters)`` rebuilds this topology from."""

    def check(self, coords: Sequence[int]) -> str | None:
        """What is wrong with ``coords`` for this topology, or None when they are usable."""
        names = ", ".join(self.coord_names)
        if len(coords) != len(self.coord_names) or not all(
            isinstance(c, int) and not isinstance(c, bool) for c in coords
        ):
            return f"expected {len(self.coord_names)} integers [{names}], got {list(coords)!r}"
        for name, value, bound in zip(self.coord_names, coords, self.bounds(), strict=True):
            if not 0 <= value < bound:
                return f"{name} = {value} is outside 0..{bound - 1}; fix the coordinate or the topology's size"
        return None


def _positive(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: expected an integer of at least 1, got {value!r}")
    return value


@dataclass(frozen=True)
class Torus3D(Topology):
    dims: tuple[int, int, int]

    kind: ClassVar[str] = "torus3d"
    coord_names: ClassVar[tuple[str, ...]] = ("x", "y", "z")

    def __post_init__(self) -> None:
        if len(self.dims) != 3:
            raise ValueError(f"dims: expected three sizes [x, y, z], got {list(self.dims)!r}")
        for axis, size in zip("xyz", self.dims, strict=True):
            _positive(f"dims.{axis}", size)

    def hops(self, a: Coords, b: Coords) -> int:
        # Unrolled: placement calls this thousands of times per gang.
        x, y, z = self.dims
        dx, dy, dz = abs(a[0] - b[0]), abs(a[1] - b[1]), abs(a[2] - b[2])
        return (dx if 2 * dx <= x else x - dx) + (dy if 2 * dy <= y else y - dy) + (dz if 2 * dz <= z else z - dz)

    def bounds(self) -> tuple[int, ...]:
        return self.dims

    def parameters(self) -> dict[str, Any]:
        return {"dims": list(self.dims)}


@dataclass(frozen=True)
class _Cables:
    """The global cables between two groups, as (router on this side, router on the other)."""

    pairs: frozenset[tuple[int, int]]
    leaving: frozenset[int]  # routers on this side that own one
    landing: frozenset[int]  # routers on the other side that one lands on

    @classmethod
    def of(cls, pairs: set[tuple[int, int]]) -> _Cables:
        return cls(frozenset(pairs), frozenset(x for x, _ in pairs), frozenset(y for _, y in pairs))


@dataclass(frozen=True)
class Dragonfly(Topology):
    groups: int
    routers_per_group: int
    global_links_per_router: int
    nodes_per_router: int

    kind: ClassVar[str] = "dragonfly"
    coord_names: ClassVar[tuple[str, ...]] = ("group", "router", "slot")

    def __post_init__(self) -> None:
        for name in ("groups", "routers_per_group", "global_links_per_router", "nodes_per_router"):
            _positive(name, getattr(self, name))
        most = self.routers_per_group * self.global_links_per_router + 1
        if self.groups > most:
            raise ValueError(
                f"groups: {self.groups} groups need more global links than routers_per_group * "
                f"global_links_per_router = {most - 1} per group; use at most {most} groups or more links"
            )

    @cached_property
    def _cables(self) -> dict[tuple[int, int], _Cables]:
        """The global cables between each ordered pair of groups, built once (``hops`` is hot).

        ``owners[g][h]`` lists the routers of ``g`` that own its links to ``h``, in order of ``k``;
        the module docstring gives how the two sides' links pair up into cables.
        """
        ports = self.routers_per_group * self.global_links_per_router
        owners: list[dict[int, list[int]]] = [{} for _ in range(self.groups)]
        for g in range(self.groups):
            for k in range(ports):
                h = (g + k + 1) % self.groups
                if h != g:  # a link back to its own group joins nothing
                    owners[g].setdefault(h, []).append(k // self.global_links_per_router)
        table: dict[tuple[int, int], _Cables] = {}
        for g in range(self.groups):
            for h in range(g + 1, self.groups):
                out, back = owners[g][h], owners[h][g]  # both non-empty: __post_init__ checked
                pairs = {(r, back[i % len(back)]) for i, r in enumerate(out)}
                pairs |= {(out[i % len(out)], r) for i, r in enumerate(back)}
                table[g, h] = _Cables.of(pairs)
                table[h, g] = _Cables.of({(y, x) for x, y in pairs})
        return table

    def hops(self, a: Coords, b: Coords) -> int:
        # node -> router (1), [a local link to the cable's router: 1], the global cable (1),
        # [a local link to the destination's router: 1], router -> node (1): the best cable wins.
        if a == b:
            return 0
        (ga, ra, _), (gb, rb, _) = a, b
        if ga == gb:
            return 2 if ra == rb else 3
        cables = self._cables[ga, gb]
        if (ra, rb) in cables.pairs:
            return 3
        if ra in cables.leaving or rb in cables.landing:
            return 4
        return 5

    def bounds(self) -> tuple[int, ...]:
        return (self.groups, self.routers_per_group, self.nodes_per_router)

    def parameters(self) -> dict[str, Any]:
        return {
            "groups": self.groups,
            "routers_per_group": self.routers_per_group,
            "global_links_per_router": self.global_links_per_router,
            "nodes_per_router": self.nodes_per_router,
        }


@dataclass(frozen=True)
class FatTree(Topology):
    pods: int
    racks_per_pod: int
    nodes_per_rack: int

    kind: ClassVar[str] = "fat-tree"
    coord_names: ClassVar[tuple[str, ...]] = ("pod", "rack", "slot")

    def __post_init__(self) -> None:
        for name in ("pods", "racks_per_pod", "nodes_per_rack"):
            _positive(name, getattr(self, name))

    def hops(self, a: Coords, b: Coords) -> int:
        if a == b:
            return 0
        if a[0] != b[0]:
            return 6
        return 2 if a[1] == b[1] else 4

    def hops_from(self, a: Coords, others: Sequence[Coords]) -> list[int]:
        pod, rack = a[0], a[1]
        return [0 if b == a else 6 if b[0] != pod else 2 if b[1] == rack else 4 for b in others]

    def bounds(self) -> tuple[int, ...]:
        return (self.pods, self.racks_per_pod, self.nodes_per_rack)

    def parameters(self) -> dict[str, Any]:
        return {"pods": self.pods, "racks_per_pod": self.racks_per_pod, "nodes_per_rack": self.nodes_per_rack}


TOPOLOGY_KINDS: dict[str, type[Topology]] = {t.kind: t for t in (Torus3D, Dragonfly, FatTree)}


def make_topology(kind: str, parameters: Mapping[str, Any]) -> Topology:
    """Build a topology from its kind and parameters; ValueError names the parameter and the fix."""
    cls = TOPOLOGY_KINDS.get(kind)
    if cls is None:
        raise ValueError(f"kind: {kind!r} is not one of {', '.join(TOPOLOGY_KINDS)}")
    params = dict(parameters)
    if cls is Torus3D:
        dims = params.pop("dims", None)
        if not isinstance(dims, list | tuple) or len(dims) != 3:
            raise ValueError(f"dims: expected three sizes [x, y, z], got {dims!r}")
        if params:
            raise ValueError(f"{sorted(params)[0]}: not a parameter of {kind}; it takes dims")
        return Torus3D(dims=(dims[0], dims[1], dims[2]))
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]  # every kind is a dataclass
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise ValueError(f"{unknown[0]}: not a parameter of {kind}; it takes {', '.join(names)}")
    for name in names:
        if name not in params:
            raise ValueError(f"{name}: missing; add it (an integer of at least 1)")
    return cls(**params)


@dataclass(frozen=True)
class Fabric:
    """A topology with every node's coordinates in it: hop distances between nodes by name.

    ``hops`` is the node-distance function that topology-aware placement takes.
    """

    topology: Topology
    coords: Mapping[str, Coords]

    def hops(self, a: str, b: str) -> int:
        if a == b:
            return 0
        return self.topology.hops(self.coords[a], self.coords[b])

    # A fabric is itself a node-distance function, one that also answers a row at once
    # (``runtime.scheduling.placement.RowDistance``).
    __call__ = hops

    def hops_from(self, a: str, nodes: Sequence[str]) -> dict[str, int]:
        """``hops(a, node)`` for each of ``nodes``."""
        coords = self.coords
        row = self.topology.hops_from(coords[a], [coords[node] for node in nodes])
        return {node: 0 if node == a else hops for node, hops in zip(nodes, row, strict=True)}


def rack_fat_tree(nodes: Sequence[tuple[str, str]]) -> Fabric:
    """A one-pod fat tree from ``(node, rack)`` pairs: same node 0, same rack 2, otherwise 4.

    A node without a rack label gets a rack of its own: nothing says it shares a switch with anyone.
    """
    racks: dict[str, int] = {}
    slots: dict[int, int] = {}
    coords: dict[str, Coords] = {}
    for name, rack in nodes:
        key = rack if rack else f"\0{name}"
        index = racks.setdefault(key, len(racks))
        slot = slots.get(index, 0)
        slots[index] = slot + 1
        coords[name] = (0, index, slot)
    topology = FatTree(pods=1, racks_per_pod=max(1, len(racks)), nodes_per_rack=max([1, *slots.values()]))
    return Fabric(topology=topology, coords=coords)
