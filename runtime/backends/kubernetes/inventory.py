"""The pool as a Kubernetes cluster shows it: nodes and their devices, topology and health, from Node objects.

The pool file still names the flavors (their figures, and under each flavor's ``kubernetes`` section
which extended resource counts its devices and which node labels mark its nodes); the cluster names
the nodes. A node is of a flavor when it carries every label of that flavor's ``node_labels`` (by
default ``polychip.io/flavor: <flavor>``) and allocates at least one of its ``resource`` (by default
the vendor's device plugin resource: ``nvidia.com/gpu``, ``amd.com/gpu``, ``huawei.com/Ascend910``,
``google.com/tpu``). Its devices are its capacity of that resource; a device plugin withdraws an
unhealthy chip from ``allocatable``, so the devices beyond what the node allocates are failed (with the
reason), lest a placement count on a device no pod could get. Which chip was withdrawn the node does
not say, and Polychip pins a pod to its node and a count, not to a chip: the last indices stand for them.

Topology comes from labels named in the file's top-level ``kubernetes`` section: the rack
(``rack_label``, default ``polychip.io/rack``; ``topology.kubernetes.io/zone`` is a common choice)
and, when the file declares a topology, the node's coordinates (``coords_label``, default
``polychip.io/coords``, integers joined by dashes, e.g. ``1-0-3``: label values cannot hold commas).

Health comes from the node: not Ready, or its network unavailable: failed; cordoned
(``spec.unschedulable``) or tainted NoSchedule/NoExecute by a key that Polychip's pods do not
tolerate (the flavor's ``tolerations``, by default its resource's name, the taint GPU node pools carry):
cordoned; memory, disk or PID pressure: degraded. Every node left out, and every node not healthy,
comes with the reason.

Input here is what the apiserver answered (plain JSON, as ``kubectl get nodes -o json`` prints):
nothing in this module talks to a cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from runtime.inventory.pool import Health, NodeSpec, Pool, PoolFileError

FLAVOR_LABEL = "polychip.io/flavor"
RACK_LABEL = "polychip.io/rack"
COORDS_LABEL = "polychip.io/coords"

# The device plugins' extended resources, by the flavor's vendor (a flavor's section may name another).
VENDOR_RESOURCES: Mapping[str, str] = {
    "nvidia": "nvidia.com/gpu",
    "amd": "amd.com/gpu",
    "huawei": "huawei.com/Ascend910",
    "google": "google.com/tpu",
}

# Conditions that take a node out (True is bad for these; Ready is the other way round).
_FAILING_CONDITIONS = ("NetworkUnavailable",)
_PRESSURE_CONDITIONS = ("MemoryPressure", "DiskPressure", "PIDPressure")
_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
# The node lifecycle controller's taints restate a condition or a cordon that is read directly.
_LIFECYCLE_TAINTS = frozenset(
    {
        "node.kubernetes.io/unschedulable",
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/memory-pressure",
        "node.kubernetes.io/disk-pressure",
        "node.kubernetes.io/pid-pressure",
        "node.kubernetes.io/network-unavailable",
    }
)


@dataclass(frozen=True)
class FlavorSelector:
    """What makes a cluster node one of a flavor's: its labels and its extended resource."""

    flavor: str
    resource: str
    node_labels: Mapping[str, str]
    tolerations: frozenset[str] = frozenset()  # taint keys Polychip's pods of this flavor tolerate

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.node_labels.items())


@dataclass(frozen=True)
class ClusterSettings:
    """The pool file's ``kubernetes`` sections, checked."""

    selectors: tuple[FlavorSelector, ...]
    rack_label: str = RACK_LABEL
    coords_label: str = COORDS_LABEL


@dataclass(frozen=True)
class NodeState:
    """A node's health as its conditions, cordon and taints say, with why when it is not healthy."""

    health: Health
    reason: str = ""


@dataclass(frozen=True)
class ClusterInventory:
    """The pool with the cluster's nodes, each node's health, and the nodes left out with why."""

    pool: Pool
    health: dict[str, NodeState] = field(default_factory=dict)  # by node name
    left_out: dict[str, str] = field(default_factory=dict)  # node name -> why it is not in the pool
    withdrawn: dict[str, int] = field(default_factory=dict)  # node name -> devices it no longer allocates

    def device_health(self) -> dict[str, NodeState]:
        """Every device's state: its node's, but failed for the devices the node no longer allocates."""
        allocatable = {node.name: node.devices - self.withdrawn.get(node.name, 0) for node in self.pool.nodes}
        states = {}
        for device in self.pool.devices():
            if device.index >= allocatable[device.node]:
                states[device.device_id] = NodeState(Health.FAILED, "withdrawn by the device plugin (not allocatable)")
            else:
                states[device.device_id] = self.health[device.node]
        return states


def cluster_settings(pool: Pool) -> ClusterSettings:
    """The ``kubernetes`` sections of a pool file, checked; ``PoolFileError`` names the field and the fix."""
    sections = pool.kubernetes or {}
    cluster = sections.get("cluster", {})
    flavor_sections = sections.get("flavors", {})
    unknown = set(cluster) - {"rack_label", "coords_label"}
    if unknown:
        raise PoolFileError(f"kubernetes.{sorted(unknown)[0]}: unknown; the section takes rack_label and coords_label")
    selectors = []
    for name, flavor in pool.flavors.items():
        where = f"flavors.{name}.kubernetes"
        section = flavor_sections.get(name, {})
        unknown = set(section) - {"resource", "node_labels", "tolerations"}
        if unknown:
            raise PoolFileError(f"{where}.{sorted(unknown)[0]}: unknown; use resource, node_labels or tolerations")
        resource = section.get("resource", VENDOR_RESOURCES.get(flavor.vendor))
        if not isinstance(resource, str) or "/" not in resource:
            raise PoolFileError(
                f"{where}.resource: {resource!r} is not an extended resource name; give the device plugin's, "
                "e.g. nvidia.com/gpu"
            )
        node_labels = section.get("node_labels", {FLAVOR_LABEL: name})
        if (
            not isinstance(node_labels, dict)
            or not node_labels
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in node_labels.items())
        ):
            raise PoolFileError(
                f"{where}.node_labels: expected a non-empty mapping of label to value, e.g. {{{FLAVOR_LABEL}: {name}}}"
            )
        tolerations = section.get("tolerations", [resource] if isinstance(resource, str) else [])
        if not isinstance(tolerations, list) or not all(isinstance(key, str) for key in tolerations):
            raise PoolFileError(f"{where}.tolerations: expected a list of taint keys, e.g. [{resource}]")
        selectors.append(FlavorSelector(name, resource, dict(node_labels), frozenset(tolerations)))
    for label in ("rack_label", "coords_label"):
        if label in cluster and not isinstance(cluster[label], str):
            raise PoolFileError(f"kubernetes.{label}: expected a label name, e.g. topology.kubernetes.io/zone")
    return ClusterSettings(
        selectors=tuple(selectors),
        rack_label=cluster.get("rack_label", RACK_LABEL),
        coords_label=cluster.get("coords_label", COORDS_LABEL),
    )


def node_state(node: Mapping[str, Any], tolerations: frozenset[str] = frozenset()) -> NodeState:
    """A node's health from its conditions, its cordon and its taints; the worst finding wins."""
    conditions = {c.get("type"): c for c in node.get("status", {}).get("conditions") or []}
    ready = conditions.get("Ready")
    if ready is None or ready.get("status") != "True":
        why = (ready or {}).get("reason") or "no Ready condition reported"
        return NodeState(Health.FAILED, f"not Ready ({why})")
    for kind in _FAILING_CONDITIONS:
        if conditions.get(kind, {}).get("status") == "True":
            return NodeState(Health.FAILED, f"{kind} ({conditions[kind].get('reason') or 'no reason given'})")
    if node.get("spec", {}).get("unschedulable"):
        return NodeState(Health.CORDONED, "cordoned")
    for taint in node.get("spec", {}).get("taints") or []:
        key = taint.get("key", "")
        if taint.get("effect") in _BLOCKING_EFFECTS and key not in _LIFECYCLE_TAINTS and key not in tolerations:
            value = f"={taint['value']}" if taint.get("value") else ""
            return NodeState(Health.CORDONED, f"tainted {key}{value}:{taint.get('effect')}")
    pressed = [kind for kind in _PRESSURE_CONDITIONS if conditions.get(kind, {}).get("status") == "True"]
    if pressed:
        return NodeState(Health.DEGRADED, ", ".join(pressed))
    return NodeState(Health.HEALTHY)


def _count(quantity: Any) -> int | None:
    """An extended resource's quantity (a whole number, as the apiserver writes it), None if it is not one."""
    text = str(quantity)
    return int(text) if text.isdigit() else None


def _coords(value: str | None, pool: Pool) -> tuple[tuple[int, ...], str]:
    """A node's coordinates from its label, or () with why they cannot be used."""
    if pool.topology is None:
        return (), ""
    names = "-".join(pool.topology.coord_names)
    if not value:
        return (), f"no coordinates label; the {pool.topology.kind} topology needs {names}"
    parts = value.split("-")
    if not all(part.isdigit() for part in parts):
        return (), f"coordinates {value!r} are not integers joined by dashes ({names})"
    coords = tuple(int(part) for part in parts)
    problem = pool.topology.check(coords)
    return (coords, "") if problem is None else ((), f"coordinates {value!r}: {problem}")


def read_inventory(nodes: Iterable[Mapping[str, Any]], pool: Pool) -> ClusterInventory:
    """The pool file's flavors and topology with the cluster's nodes, by node name."""
    settings = cluster_settings(pool)
    found: list[NodeSpec] = []
    health: dict[str, NodeState] = {}
    left_out: dict[str, str] = {}
    withdrawn: dict[str, int] = {}
    places: dict[tuple[int, ...], str] = {}
    for node in sorted(nodes, key=lambda n: n.get("metadata", {}).get("name", "")):
        name = node.get("metadata", {}).get("name", "")
        labels = node.get("metadata", {}).get("labels") or {}
        matching = [s for s in settings.selectors if s.matches(labels)]
        if not matching:
            left_out[name] = "no flavor's node labels match"
            continue
        if len(matching) > 1:
            left_out[name] = (
                f"labels match several flavors ({', '.join(s.flavor for s in matching)}); make them distinct"
            )
            continue
        selector = matching[0]
        status = node.get("status", {})
        allocatable = _count((status.get("allocatable") or {}).get(selector.resource, 0))
        capacity = _count((status.get("capacity") or {}).get(selector.resource, 0))
        if not allocatable:
            left_out[name] = f"allocates no {selector.resource}"
            continue
        coords, problem = _coords(labels.get(settings.coords_label), pool)
        if problem:
            left_out[name] = problem
            continue
        if coords and coords in places:
            left_out[name] = f"coordinates {list(coords)} are also node {places[coords]!r}'s"
            continue
        places[coords] = name
        health[name] = node_state(node, selector.tolerations)
        devices = max(allocatable, capacity or 0)
        if devices > allocatable:
            withdrawn[name] = devices - allocatable
        rack = labels.get(settings.rack_label, "")
        found.append(NodeSpec(name=name, flavor=selector.flavor, devices=devices, rack=rack, coords=coords))
    return ClusterInventory(
        pool=replace(pool, nodes=tuple(found)), health=health, left_out=left_out, withdrawn=withdrawn
    )
