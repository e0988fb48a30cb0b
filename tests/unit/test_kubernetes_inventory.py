"""The pool as a cluster's Node objects show it (runtime.backends.kubernetes.inventory): flavors by labels and
extended resources, devices by allocatable, topology and health from labels, conditions, cordons and taints."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from runtime.backends.kubernetes import NodeState, cluster_settings, node_state, read_inventory
from runtime.inventory import Health, PoolFileError, parse_pool
from tests.pools import H100_FLAVOR

pytestmark = pytest.mark.unit


def pool_document(**cluster: Any) -> dict[str, Any]:
    return {
        "kubernetes": cluster,
        "flavors": {
            "h100-sxm": {
                **H100_FLAVOR,
                "kubernetes": {
                    "node_labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                    "tolerations": ["nvidia.com/gpu"],
                },
            },
            "ascend-910b": {**H100_FLAVOR, "vendor": "huawei", "kind": "npu"},  # defaults: label and resource
        },
    }


def node(name: str, labels: dict[str, str], resource: str = "nvidia.com/gpu", count: str = "8", **extra: Any) -> dict:
    """A Node as the apiserver answers it, Ready, with ``count`` of ``resource`` allocatable."""
    built: dict[str, Any] = {
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {
            "capacity": {"cpu": "96", resource: count},
            "allocatable": {"cpu": "95500m", resource: count},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }
    for path, value in extra.items():
        part, _, key = path.partition("__")
        built[part][key] = value
    return built


H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "polychip.io/rack": "r1"}
ASCEND = {"polychip.io/flavor": "ascend-910b", "polychip.io/rack": "r2"}


def test_nodes_become_the_pool_by_labels_and_allocatable_devices():
    pool = parse_pool(pool_document())
    assert pool.nodes == ()  # a file with kubernetes sections leaves the nodes to the cluster
    nodes = [
        node("gpu-b", H100),
        node("npu-a", ASCEND, resource="huawei.com/Ascend910", count="16"),
        node("cpu-only", {"kubernetes.io/os": "linux"}),
        node("gpu-empty", H100, count="0"),
    ]
    inventory = read_inventory(nodes, pool)
    assert [(n.name, n.flavor, n.devices, n.rack) for n in inventory.pool.nodes] == [
        ("gpu-b", "h100-sxm", 8, "r1"),
        ("npu-a", "ascend-910b", 16, "r2"),
    ]
    assert inventory.left_out == {
        "cpu-only": "no flavor's node labels match",
        "gpu-empty": "allocates no nvidia.com/gpu",
    }
    devices = inventory.pool.devices()
    assert len(devices) == 24 and devices[0].device_id == "gpu-b/0" and devices[0].memory_gib == 80
    assert {state.health for state in inventory.device_health().values()} == {Health.HEALTHY}
    assert inventory.pool.fabric().hops("gpu-b", "npu-a") > inventory.pool.fabric().hops("gpu-b", "gpu-b")


def condition(kind: str, status: str, reason: str = "") -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason}


@pytest.mark.parametrize(
    ("spec", "conditions", "expected"),
    [
        ({}, [condition("Ready", "True")], (Health.HEALTHY, "")),
        ({}, [condition("Ready", "False", "KubeletNotReady")], (Health.FAILED, "not Ready (KubeletNotReady)")),
        ({}, [condition("Ready", "Unknown", "NodeStatusUnknown")], (Health.FAILED, "not Ready (NodeStatusUnknown)")),
        ({}, [], (Health.FAILED, "not Ready (no Ready condition reported)")),
        (
            {},
            [condition("Ready", "True"), condition("NetworkUnavailable", "True", "NoRouteCreated")],
            (Health.FAILED, "NetworkUnavailable (NoRouteCreated)"),
        ),
        ({"unschedulable": True}, [condition("Ready", "True")], (Health.CORDONED, "cordoned")),
        (
            {"taints": [{"key": "maintenance", "value": "bios", "effect": "NoSchedule"}]},
            [condition("Ready", "True")],
            (Health.CORDONED, "tainted maintenance=bios:NoSchedule"),
        ),
        (  # a taint Polychip's pods tolerate, and one that only prefers, leave the node usable
            {
                "taints": [
                    {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                    {"key": "spot", "effect": "PreferNoSchedule"},
                ]
            },
            [condition("Ready", "True")],
            (Health.HEALTHY, ""),
        ),
        (  # the lifecycle controller's taint restates the cordon, which is read directly
            {"unschedulable": True, "taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]},
            [condition("Ready", "True")],
            (Health.CORDONED, "cordoned"),
        ),
        (
            {},
            [condition("Ready", "True"), condition("MemoryPressure", "True"), condition("PIDPressure", "True")],
            (Health.DEGRADED, "MemoryPressure, PIDPressure"),
        ),
        (  # a failure outranks a cordon, a cordon outranks pressure
            {"unschedulable": True},
            [condition("Ready", "False", "KubeletNotReady"), condition("DiskPressure", "True")],
            (Health.FAILED, "not Ready (KubeletNotReady)"),
        ),
    ],
)
def test_a_nodes_health_from_conditions_cordon_and_taints(spec, conditions, expected):
    state = node_state({"spec": spec, "status": {"conditions": conditions}}, frozenset({"nvidia.com/gpu"}))
    assert (state.health, state.reason) == expected


def test_devices_a_node_no_longer_allocates_are_failed_and_a_nodes_state_is_its_devices():
    withdrawn = node("gpu-a", H100)
    withdrawn["status"]["allocatable"]["nvidia.com/gpu"] = "6"
    cordoned = node("gpu-b", H100, spec__unschedulable=True)
    inventory = read_inventory([withdrawn, cordoned], parse_pool(pool_document()))
    assert [n.devices for n in inventory.pool.nodes] == [8, 8]  # capacity: what the database keeps
    assert inventory.withdrawn == {"gpu-a": 2}
    health = inventory.device_health()
    assert health["gpu-a/5"].health == Health.HEALTHY
    assert health["gpu-a/6"] == NodeState(Health.FAILED, "withdrawn by the device plugin (not allocatable)")
    assert health["gpu-a/7"].health == Health.FAILED
    assert health["gpu-b/7"] == NodeState(Health.CORDONED, "cordoned")
    schedulable = [d for d, state in health.items() if state.health.schedulable and d.startswith("gpu-a/")]
    assert len(schedulable) == 6  # what the node allocates


def test_a_gpu_nodes_own_taint_is_tolerated_by_default():
    settings = cluster_settings(parse_pool(pool_document()))
    ascend = next(s for s in settings.selectors if s.flavor == "ascend-910b")
    assert ascend.tolerations == frozenset({"huawei.com/Ascend910"})
    tainted = node(
        "npu-a",
        ASCEND,
        resource="huawei.com/Ascend910",
        spec__taints=[{"key": "huawei.com/Ascend910", "value": "present", "effect": "NoSchedule"}],
    )
    assert read_inventory([tainted], parse_pool(pool_document())).health["npu-a"].health == Health.HEALTHY


def test_coordinates_from_a_label_for_the_pools_topology():
    document = pool_document(rack_label="topology.kubernetes.io/zone", coords_label="example.com/torus")
    document["topology"] = {"kind": "torus3d", "dims": [2, 2, 2]}
    pool = parse_pool(document)
    nodes = [
        node("a", {**H100, "example.com/torus": "0-0-0", "topology.kubernetes.io/zone": "z1"}),
        node("b", {**H100, "example.com/torus": "1-1-1"}),
        node("c", {**H100, "example.com/torus": "0-0-0"}),
        node("d", {**H100, "example.com/torus": "2-0-0"}),
        node("e", {**H100, "example.com/torus": "0,1,0"}),
        node("f", H100),
    ]
    inventory = read_inventory(nodes, pool)
    assert [(n.name, n.coords, n.rack) for n in inventory.pool.nodes] == [("a", (0, 0, 0), "z1"), ("b", (1, 1, 1), "")]
    assert inventory.pool.fabric().hops("a", "b") == 3
    assert inventory.left_out["c"] == "coordinates [0, 0, 0] are also node 'a''s"
    assert inventory.left_out["d"].startswith("coordinates '2-0-0': x = 2 is outside 0..1")
    assert inventory.left_out["e"] == "coordinates '0,1,0' are not integers joined by dashes (x-y-z)"
    assert inventory.left_out["f"] == "no coordinates label; the torus3d topology needs x-y-z"


def test_a_node_matching_two_flavors_is_left_out_with_why():
    both = node("odd", {**H100, "polychip.io/flavor": "ascend-910b"})
    inventory = read_inventory([both], parse_pool(pool_document()))
    assert inventory.pool.nodes == ()
    assert inventory.left_out == {"odd": "labels match several flavors (h100-sxm, ascend-910b); make them distinct"}


def test_the_resource_defaults_to_the_vendors_device_plugin():
    settings = cluster_settings(parse_pool(pool_document()))
    assert {s.flavor: (s.resource, dict(s.node_labels)) for s in settings.selectors} == {
        "h100-sxm": ("nvidia.com/gpu", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}),
        "ascend-910b": ("huawei.com/Ascend910", {"polychip.io/flavor": "ascend-910b"}),
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["kubernetes"].update(zone_label="x"), "kubernetes.zone_label: unknown"),
        (lambda d: d["kubernetes"].update(rack_label=3), "kubernetes.rack_label: expected a label name"),
        (
            lambda d: d["flavors"]["h100-sxm"]["kubernetes"].update(resource="gpu"),
            "flavors.h100-sxm.kubernetes.resource",
        ),
        (lambda d: d["flavors"]["h100-sxm"]["kubernetes"].update(node_labels={}), "node_labels: expected a non-empty"),
        (lambda d: d["flavors"]["h100-sxm"]["kubernetes"].update(tolerations="x"), "tolerations: expected a list"),
        (lambda d: d["flavors"]["h100-sxm"]["kubernetes"].update(labels={}), "kubernetes.labels: unknown"),
        (lambda d: d["flavors"]["ascend-910b"].update(vendor="acme"), "flavors.ascend-910b.kubernetes.resource"),
        (lambda d: d["flavors"]["h100-sxm"].update(kubernetes=[]), "flavors.h100-sxm.kubernetes: expected a mapping"),
        (lambda d: d.update(kubernetes="yes"), "kubernetes: expected a mapping"),
    ],
)
def test_a_bad_kubernetes_section_names_its_field(change, message):
    document = copy.deepcopy(pool_document())
    change(document)
    with pytest.raises(PoolFileError, match=message.replace(".", r"\.")):
        cluster_settings(parse_pool(document))


def test_a_file_without_kubernetes_sections_still_needs_its_nodes():
    document = pool_document()
    del document["kubernetes"]
    for flavor in document["flavors"].values():
        flavor.pop("kubernetes", None)
    with pytest.raises(PoolFileError, match="nodes: missing or empty"):
        parse_pool(document)
