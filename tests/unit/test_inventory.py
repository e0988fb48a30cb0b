from pathlib import Path

import pytest

from runtime.catalog import DeviceKind
from runtime.inventory import PoolFileError, load_pool, parse_pool

DEMO = Path(__file__).resolve().parents[2] / "runtime" / "pools" / "demo.yaml"


def test_the_demo_pool_has_two_gpu_generations_an_npu_and_a_tpu():
    pool = load_pool(DEMO)
    kinds = sorted(f.kind for f in pool.flavors.values())
    assert kinds.count(DeviceKind.GPU) >= 2 and DeviceKind.NPU in kinds and DeviceKind.TPU in kinds
    assert all(f.peak_bf16_tflops > 0 and f.memory_gib > 0 and f.interconnect for f in pool.flavors.values())
    assert all(0 < p["relative_speed"] <= 1 for p in pool.local_profiles.values())
    assert len(pool.devices()) == sum(n.devices for n in pool.nodes)
    assert len({d.device_id for d in pool.devices()}) == len(pool.devices())


def _doc(**changes):
    flavor = {
        "vendor": "v",
        "kind": "gpu",
        "model": "m",
        "peak_bf16_tflops": 1,
        "memory_gib": 1,
        "interconnect": "x",
        "interconnect_gbps": 1,
        "torch_device_type": "cuda",
        "collective_backend": "nccl",
    }
    doc = {"flavors": {"f": flavor}, "nodes": [{"name": "n", "flavor": "f", "devices": 1}]}
    for path, value in changes.items():
        target = doc
        *parents, last = path.split("__")
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[last] = value
    return doc


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"flavors__f__kind": "fpga"}, "flavors.f.kind: 'fpga' is not one of"),
        ({"flavors__f__memory_gib": "lots"}, "flavors.f.memory_gib: expected float"),
        ({"flavors__f__peak_bf16_tflops": 0}, "peak_bf16_tflops must be > 0"),
        ({"nodes__0__flavor": "g"}, "nodes[0].flavor: 'g' is not defined"),
        ({"nodes__0__devices": 0}, "nodes[0].devices: must be at least 1"),
        ({"nodes": []}, "nodes: missing or empty"),
    ],
)
def test_a_bad_pool_file_names_the_field(changes, message):
    with pytest.raises(PoolFileError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        parse_pool(_doc(**changes))


# --- health, memory, topology ---------------------------------------------------------------


def test_degraded_stays_schedulable_and_cordoned_or_failed_never():
    from runtime.inventory import Health

    assert Health.HEALTHY.schedulable and Health.DEGRADED.schedulable
    assert not Health.CORDONED.schedulable and not Health.FAILED.schedulable


def test_devices_carry_their_flavors_memory_and_start_healthy():
    from runtime.inventory import Health

    pool = load_pool(DEMO)
    by_flavor = {d.flavor: d for d in pool.devices()}
    assert by_flavor["tpu-v4"].memory_gib == 32 and by_flavor["h100-sxm"].memory_gib == 80
    assert all(d.health is Health.HEALTHY for d in pool.devices())


def test_without_a_topology_the_racks_make_a_fat_tree():
    pool = load_pool(DEMO)
    fabric = pool.fabric()
    assert fabric.topology.kind == "fat-tree"
    assert fabric.hops("gpu-h100-0", "gpu-h100-0") == 0
    assert fabric.hops("gpu-h100-0", "gpu-a100-0") == 2  # both in r1
    assert fabric.hops("gpu-h100-0", "npu-910b-0") == 4
    assert fabric.hops("npu-910b-0", "tpu-v4-0") == 4


def test_nodes_without_a_rack_share_no_switch():
    from runtime.inventory import rack_fat_tree

    fabric = rack_fat_tree([("a", ""), ("b", ""), ("c", "r1"), ("d", "r1")])
    assert fabric.hops("a", "b") == 4 and fabric.hops("c", "d") == 2


def test_torus_hops_wrap_around():
    from runtime.inventory import Torus3D

    torus = Torus3D(dims=(4, 4, 8))
    assert torus.hops((0, 0, 0), (0, 0, 0)) == 0
    assert torus.hops((0, 0, 0), (1, 0, 0)) == 1
    assert torus.hops((0, 0, 0), (3, 0, 0)) == 1  # wraps: 0 -> 3 is one link
    assert torus.hops((0, 0, 0), (2, 2, 4)) == 2 + 2 + 4  # the farthest point
    assert torus.hops((0, 0, 1), (0, 0, 7)) == 2  # 1 -> 0 -> 7
    assert torus.hops((1, 3, 6), (3, 0, 1)) == 2 + 1 + 3


def test_dragonfly_hops_follow_the_consecutive_arrangement():
    from runtime.inventory import Dragonfly

    # 3 groups of 2 routers with 1 global link each: router 0 of group g links to group g+1,
    # router 1 to group g+2.
    fly = Dragonfly(groups=3, routers_per_group=2, global_links_per_router=1, nodes_per_router=2)
    assert fly.hops((0, 0, 0), (0, 0, 0)) == 0
    assert fly.hops((0, 0, 0), (0, 0, 1)) == 2  # same router
    assert fly.hops((0, 0, 0), (0, 1, 0)) == 3  # one local link
    # group 0 -> group 1: router 0 of group 0 owns the link; group 1's end is its router 1 (link to g+2 = 0)
    assert fly.hops((0, 0, 0), (1, 1, 0)) == 3
    assert fly.hops((0, 1, 0), (1, 1, 0)) == 4  # a local hop first
    assert fly.hops((0, 1, 0), (1, 0, 0)) == 5  # local, global, local
    assert fly.hops((1, 0, 0), (0, 1, 1)) == fly.hops((0, 1, 1), (1, 0, 0))


def test_dragonfly_hops_take_the_best_of_parallel_global_links():
    from runtime.inventory import Dragonfly

    # 3 groups, 2 routers, 2 global links each: fewer groups than the 5 the links could reach, so
    # group g's links k = 0..3 go to g+1 (router 0), g+2 (router 0), g itself (router 1, unused)
    # and g+1 again (router 1). Each group's link to g+1 lands on the router that owns the far
    # group's link back (router 0 of group g+1, its k = 1), so the cables are:
    #   0-1: (0r0, 1r0) and (0r1, 1r0);  0-2: (0r0, 2r0) and (0r0, 2r1);  1-2: (1r0, 2r0), (1r1, 2r0).
    fly = Dragonfly(groups=3, routers_per_group=2, global_links_per_router=2, nodes_per_router=2)
    # Router 1 of group 0 owns a link straight to router 0 of group 1: node, global, node.
    assert fly.hops((0, 1, 0), (1, 0, 0)) == 3
    assert fly.hops((1, 0, 0), (0, 1, 0)) == 3
    assert fly.hops((0, 0, 0), (1, 0, 1)) == 3
    # Both cables land on router 0 of group 1: router 1 there costs a local hop.
    assert fly.hops((0, 1, 0), (1, 1, 0)) == 4
    assert fly.hops((0, 0, 0), (1, 1, 0)) == 4
    # Group 0 -> 2 leaves from router 0 only, and reaches both routers of group 2 directly.
    assert fly.hops((0, 0, 0), (2, 1, 0)) == 3
    assert fly.hops((0, 1, 0), (2, 1, 0)) == 4
    # Group 1 -> 2 lands on router 0 of group 2 only; from router 1 of group 1 it is still 3 to there.
    assert fly.hops((1, 1, 0), (2, 0, 0)) == 3
    assert fly.hops((1, 1, 0), (2, 1, 0)) == 4
    for a in [(g, r, 0) for g in range(3) for r in range(2)]:
        for b in [(g, r, 1) for g in range(3) for r in range(2)]:
            assert fly.hops(a, b) == fly.hops(b, a)
            assert 2 <= fly.hops(a, b) <= 5


def test_fat_tree_hops():
    from runtime.inventory import FatTree

    tree = FatTree(pods=2, racks_per_pod=2, nodes_per_rack=4)
    assert tree.hops((0, 0, 0), (0, 0, 0)) == 0
    assert tree.hops((0, 0, 0), (0, 0, 3)) == 2
    assert tree.hops((0, 0, 0), (0, 1, 0)) == 4
    assert tree.hops((0, 0, 0), (1, 0, 0)) == 6


def test_a_dragonfly_with_too_few_global_links_is_refused():
    from runtime.inventory import make_topology

    with pytest.raises(ValueError, match="groups: 4 groups need more global links"):
        make_topology(
            "dragonfly", {"groups": 4, "routers_per_group": 1, "global_links_per_router": 2, "nodes_per_router": 1}
        )


def test_a_pool_file_with_a_topology_and_coords():
    doc = _doc()
    doc["topology"] = {"kind": "torus3d", "dims": [2, 2, 2]}
    doc["nodes"] = [
        {"name": "a", "flavor": "f", "devices": 1, "coords": [0, 0, 0]},
        {"name": "b", "flavor": "f", "devices": 1, "coords": [1, 1, 1]},
    ]
    pool = parse_pool(doc)
    assert pool.topology is not None and pool.topology.kind == "torus3d"
    assert pool.fabric().hops("a", "b") == 3


def _torus_doc(coords, kind="torus3d", **params):
    doc = _doc()
    doc["topology"] = {"kind": kind, **(params or {"dims": [2, 2, 2]})}
    doc["nodes"][0]["coords"] = coords
    return doc


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (_torus_doc([0, 0]), "nodes[0].coords: expected 3 integers [x, y, z]"),
        (_torus_doc([0, 0, 2]), "nodes[0].coords: z = 2 is outside 0..1"),
        (_torus_doc("0,0,0"), "nodes[0].coords: expected a list"),
        (_torus_doc(None), "nodes[0].coords: missing; the torus3d topology needs [x, y, z]"),
        (_torus_doc([0, 0, 0], kind="mesh"), "topology.kind: 'mesh' is not one of"),
        (_torus_doc([0, 0, 0], dims=[2, 2]), "topology.dims: expected three sizes"),
        (_torus_doc([0, 0, 0], kind="fat-tree", pods=1, racks_per_pod=1), "topology.nodes_per_rack: missing"),
        (_torus_doc([0, 0, 0], kind="fat-tree", pods=0, racks_per_pod=1, nodes_per_rack=1), "topology.pods: expected"),
        (_torus_doc([0, 0, 0], kind="fat-tree", pods=1, racks_per_pod=1, nodes_per_rack=1, k=4), "topology.k: not a"),
        ({**_doc(nodes__0__coords=[0, 0, 0])}, "nodes[0].coords: given, but the pool file has no topology"),
    ],
)
def test_a_bad_topology_names_the_field(doc, message):
    if doc["nodes"][0].get("coords", 0) is None:
        del doc["nodes"][0]["coords"]
    with pytest.raises(PoolFileError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        parse_pool(doc)


def test_two_nodes_in_one_place_are_refused():
    doc = _torus_doc([0, 0, 0])
    doc["nodes"].append({"name": "m", "flavor": "f", "devices": 1, "coords": [0, 0, 0]})
    with pytest.raises(PoolFileError, match=r"nodes\[1\]\.coords: \[0, 0, 0\] is also node 'n'"):
        parse_pool(doc)


def test_step_time_factor():
    from runtime.inventory import FatTree, LinkModel, step_time_factor

    tree = FatTree(pods=2, racks_per_pod=2, nodes_per_rack=4)
    one_node = [(0, 0, 0)] * 8
    assert step_time_factor(one_node, tree, 0.3) == pytest.approx(1.0)
    assert step_time_factor([(0, 0, 0)], tree, 0.3) == 1.0
    rack = [(0, 0, 0)] * 4 + [(0, 0, 1)] * 4
    pods = [(0, 0, 0)] * 4 + [(1, 0, 0)] * 4
    f_rack, f_pods = step_time_factor(rack, tree, 0.3), step_time_factor(pods, tree, 0.3)
    assert 1.0 < f_rack < f_pods
    assert step_time_factor(pods, tree, 0.0) == 1.0
    # Hand-computed: 8 ranks, 25 MiB buckets; slowest edge crosses 6 hops at 50 GB/s.
    link = LinkModel()
    chunk = 25 * 2**20 / 8
    ideal = 5e-6 + chunk / 900e9
    slow = 11e-6 + chunk / 50e9
    assert f_pods == pytest.approx(0.7 + 0.3 * slow / ideal)
    assert link.edge_seconds(6, 8) == pytest.approx(slow)
    with pytest.raises(ValueError, match="comm_fraction"):
        step_time_factor(pods, tree, 1.5)
