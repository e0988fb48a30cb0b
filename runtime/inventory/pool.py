"""The pool: nodes and devices, loaded from a pool file (YAML).

Optional in the file: a ``topology`` section (``kind`` and that kind's parameters, see
``runtime.inventory.topology``) and per-node ``coords`` in it. Without a topology section, nodes
take no coordinates and the pool's fabric is a one-pod fat tree derived from the nodes' racks.

The local backend's device profiles ride along in the same file, under ``local_profile`` of each
flavor, but only ``runtime.backends.local`` reads them: nothing else may know how a chip is emulated.
Likewise the ``kubernetes`` sections (one at the top, one per flavor: which extended resource and node
labels make a node of that flavor) are read by ``runtime.backends.kubernetes`` alone; a file with
``kubernetes`` sections may leave ``nodes`` out, since the cluster's nodes are the pool's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from runtime.catalog import DeviceKind, Flavor
from runtime.inventory.topology import Coords, Fabric, Topology, make_topology, rack_fat_tree


class PoolFileError(ValueError):
    """A pool file that cannot be used; the message names the field and the fix."""


class Health(StrEnum):
    """A device's health, as operators and failure detection set it.

    ``degraded`` (it works, but something is off: ECC errors, a slow link) stays schedulable and
    is chosen last; ``cordoned`` (an operator took it out, e.g. for maintenance) and ``failed``
    are never scheduled.
    """

    HEALTHY = "healthy"
    DEGRADED = "degraded"
    CORDONED = "cordoned"
    FAILED = "failed"

    @property
    def schedulable(self) -> bool:
        return self in SCHEDULABLE


SCHEDULABLE = frozenset({Health.HEALTHY, Health.DEGRADED})


@dataclass(frozen=True)
class DeviceSpec:
    device_id: str
    node: str
    flavor: str
    index: int
    memory_gib: float = 0.0
    health: Health = Health.HEALTHY


@dataclass(frozen=True)
class NodeSpec:
    name: str
    flavor: str
    devices: int
    rack: str = ""
    coords: Coords = ()  # the node's place in the pool's topology; () when the pool names none


@dataclass(frozen=True)
class Pool:
    flavors: dict[str, Flavor]
    nodes: tuple[NodeSpec, ...]
    local_profiles: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The topology the pool file names, or None: then ``fabric()`` derives a fat tree from racks.
    topology: Topology | None = None
    # The file's ``kubernetes`` sections, as written: {"cluster": top-level section, "flavors": {name: section}}.
    kubernetes: dict[str, Any] = field(default_factory=dict)

    def devices(self) -> list[DeviceSpec]:
        return [
            DeviceSpec(
                device_id=f"{node.name}/{i}",
                node=node.name,
                flavor=node.flavor,
                index=i,
                memory_gib=self.flavors[node.flavor].memory_gib if node.flavor in self.flavors else 0.0,
            )
            for node in self.nodes
            for i in range(node.devices)
        ]

    def fabric(self) -> Fabric:
        """The topology with every node's coordinates: ``fabric().hops(a, b)`` by node name."""
        if self.topology is None:
            return rack_fat_tree([(node.name, node.rack) for node in self.nodes])
        return Fabric(topology=self.topology, coords={node.name: node.coords for node in self.nodes})


_FLAVOR_FIELDS = {
    "vendor": str,
    "kind": str,
    "model": str,
    "peak_bf16_tflops": float,
    "memory_gib": float,
    "interconnect": str,
    "interconnect_gbps": float,
    "torch_device_type": str,
    "collective_backend": str,
}


def _require(mapping: dict[str, Any], key: str, where: str, kind: type) -> Any:
    if key not in mapping:
        raise PoolFileError(f"{where}.{key}: missing; add it ({kind.__name__})")
    value = mapping[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind):
        raise PoolFileError(f"{where}.{key}: expected {kind.__name__}, got {value!r}")
    return value


def parse_pool(document: dict[str, Any]) -> Pool:
    if not isinstance(document, dict):
        raise PoolFileError("pool file: expected a mapping with 'flavors' and 'nodes'")
    raw_flavors = document.get("flavors")
    if not isinstance(raw_flavors, dict) or not raw_flavors:
        raise PoolFileError("flavors: missing or empty; add a mapping of flavor name to its figures")
    flavors: dict[str, Flavor] = {}
    profiles: dict[str, dict[str, Any]] = {}
    flavor_sections: dict[str, Any] = {}
    for name, raw in raw_flavors.items():
        where = f"flavors.{name}"
        if not isinstance(raw, dict):
            raise PoolFileError(f"{where}: expected a mapping of figures")
        values = {key: _require(raw, key, where, kind) for key, kind in _FLAVOR_FIELDS.items()}
        try:
            values["kind"] = DeviceKind(values["kind"])
        except ValueError:
            choices = ", ".join(k.value for k in DeviceKind)
            raise PoolFileError(f"{where}.kind: {values['kind']!r} is not one of {choices}") from None
        try:
            flavors[name] = Flavor(name=name, **values)
        except ValueError as exc:
            raise PoolFileError(f"{where}: {exc}") from None
        profile = raw.get("local_profile", {})
        if not isinstance(profile, dict):
            raise PoolFileError(f"{where}.local_profile: expected a mapping such as {{relative_speed: 0.5}}")
        profiles[name] = dict(profile)
        if "kubernetes" in raw:
            flavor_sections[name] = raw["kubernetes"]

    topology = _topology(document)
    kubernetes = _kubernetes_sections(document, flavor_sections)
    raw_nodes = document.get("nodes")
    if kubernetes and raw_nodes is None:  # the cluster's nodes are the pool's
        raw_nodes = []
    elif not isinstance(raw_nodes, list) or not raw_nodes:
        raise PoolFileError("nodes: missing or empty; add a list of {name, flavor, devices}")
    nodes: list[NodeSpec] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_nodes):
        where = f"nodes[{i}]"
        if not isinstance(raw, dict):
            raise PoolFileError(f"{where}: expected a mapping with name, flavor, devices")
        name = _require(raw, "name", where, str)
        flavor = _require(raw, "flavor", where, str)
        devices = _require(raw, "devices", where, int)
        if name in seen:
            raise PoolFileError(f"{where}.name: {name!r} appears twice; node names must be unique")
        if flavor not in flavors:
            raise PoolFileError(f"{where}.flavor: {flavor!r} is not defined under flavors")
        if devices < 1:
            raise PoolFileError(f"{where}.devices: must be at least 1")
        seen.add(name)
        coords = _node_coords(raw, where, topology)
        nodes.append(NodeSpec(name=name, flavor=flavor, devices=devices, rack=str(raw.get("rack", "")), coords=coords))
    if topology is not None:
        placed: dict[Coords, str] = {}
        for i, node in enumerate(nodes):
            if node.coords in placed:
                raise PoolFileError(
                    f"nodes[{i}].coords: {list(node.coords)} is also node {placed[node.coords]!r}'s; "
                    "give every node a place of its own"
                )
            placed[node.coords] = node.name
    return Pool(flavors=flavors, nodes=tuple(nodes), local_profiles=profiles, topology=topology, kubernetes=kubernetes)


def _kubernetes_sections(document: dict[str, Any], flavor_sections: dict[str, Any]) -> dict[str, Any]:
    """The ``kubernetes`` sections as written (``runtime.backends.kubernetes`` checks their contents);
    {} when the file has none."""
    cluster = document.get("kubernetes")
    if cluster is None and not flavor_sections:
        return {}
    if cluster is not None and not isinstance(cluster, dict):
        raise PoolFileError("kubernetes: expected a mapping, e.g. {rack_label: topology.kubernetes.io/zone}")
    for name, section in flavor_sections.items():
        if not isinstance(section, dict):
            raise PoolFileError(f"flavors.{name}.kubernetes: expected a mapping, e.g. {{resource: nvidia.com/gpu}}")
    return {"cluster": dict(cluster or {}), "flavors": dict(flavor_sections)}


def _topology(document: dict[str, Any]) -> Topology | None:
    raw = document.get("topology")
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("kind"), str):
        raise PoolFileError(
            "topology: expected a mapping with a kind (torus3d, dragonfly, fat-tree) and its parameters, "
            "e.g. {kind: fat-tree, pods: 2, racks_per_pod: 4, nodes_per_rack: 8}"
        )
    parameters = {key: value for key, value in raw.items() if key != "kind"}
    try:
        return make_topology(raw["kind"], parameters)
    except ValueError as exc:
        raise PoolFileError(f"topology.{exc}") from None


def _node_coords(raw: dict[str, Any], where: str, topology: Topology | None) -> Coords:
    value = raw.get("coords")
    if topology is None:
        if value is not None:
            raise PoolFileError(
                f"{where}.coords: given, but the pool file has no topology section; add one "
                "(topology: {kind: ..., ...}) or remove the coords"
            )
        return ()
    names = ", ".join(topology.coord_names)
    if value is None:
        raise PoolFileError(f"{where}.coords: missing; the {topology.kind} topology needs [{names}] for every node")
    if not isinstance(value, list):
        raise PoolFileError(f"{where}.coords: expected a list [{names}], got {value!r}")
    problem = topology.check(value)
    if problem is not None:
        raise PoolFileError(f"{where}.coords: {problem}")
    return tuple(value)


def load_pool(path: str | Path) -> Pool:
    try:
        document = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as exc:
        raise PoolFileError(f"{path}: not valid YAML ({exc})") from None
    return parse_pool(document)
