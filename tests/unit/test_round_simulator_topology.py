"""The round simulator with a device layout: device tracking, topology-aware choice, the step-time model.

Hand-worked cases use ``round_s = 100`` and a ``LinkModel`` whose bandwidths are so large that a
bucket's transfer takes no time and whose latency is 10 µs per ring step plus 10 µs per hop: an edge
of ``h`` hops then lasts ``10 + 10 h`` µs against 10 µs inside a node, so with ``comm_fraction`` 0.5
a 2-device gang over ``h`` hops has the factor ``0.5 + 0.5 (10 + 10 h) / 10 = 1 + h / 2``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.inventory import Fabric, FatTree, LinkModel, NodeSpec, Torus3D, load_pool
from runtime.scheduling.policies import get_policy
from runtime.simulate.rounds import Cluster, run_rounds
from runtime.simulate.trace import SimJob, ThroughputTable, generate_trace, load_gavel_throughputs

ROOT = Path(__file__).resolve().parents[2]
GAVEL = ROOT / "bench" / "data" / "gavel"

LATENCY_ONLY = LinkModel(
    intra_node_gbps=1e15, inter_node_gbps=1e15, base_latency_us=10.0, hop_latency_us=10.0, bucket_mib=1.0
)


def rates(consolidated: float, spread: float, devices: int) -> ThroughputTable:
    return ThroughputTable({("A", "v100", devices, True): consolidated, ("A", "v100", devices, False): spread})


def sim(job_id: int, at: float, steps: float, devices: int = 1) -> SimJob:
    return SimJob(job_id=job_id, arrival_s=at, job_type="A", devices=devices, total_steps=steps)


def test_without_a_layout_the_figures_are_unchanged():
    """A generated trace (gangs of 1, 2, 4, 8) with restarts: figures recorded before layouts existed;
    the layout-only parameters change nothing, and no placement is recorded."""
    table = load_gavel_throughputs(GAVEL / "throughputs.csv")
    trace = generate_trace(table, jobs=40, jobs_per_hour=4.0, seed=5)
    cluster = Cluster({"k80": 8, "p100": 8, "v100": 8}, {"k80": 4, "p100": 4, "v100": 4})
    result = run_rounds(trace, cluster, get_policy("aware"), table, restart_cost_s=30.0)
    assert sum(result.finish_s.values()) == pytest.approx(2690006.157414781, rel=1e-12)
    assert result.busy_device_s == pytest.approx(3209111.7356892084, rel=1e-12)
    assert (result.rounds, result.restarts, result.allocations) == (900, 895, 69)
    assert not result.placements and result.gang_s == 0.0
    other = run_rounds(
        trace, cluster, get_policy("aware"), table, restart_cost_s=30.0, device_choice="random", comm_fraction=0.9
    )
    assert other.finish_s == result.finish_s


def two_nodes() -> Cluster:
    """Node ``a`` with 1 v100 and node ``b`` with 2, in one rack of a fat tree (2 hops apart)."""
    fabric = Fabric(FatTree(pods=1, racks_per_pod=1, nodes_per_rack=2), {"a": (0, 0, 0), "b": (0, 0, 1)})
    return Cluster.laid_out([NodeSpec("a", "v100", 1), NodeSpec("b", "v100", 2)], fabric)


def test_laid_out_cluster_counts_devices_and_server_sizes():
    cluster = two_nodes()
    assert dict(cluster.devices) == {"v100": 3}
    assert cluster.server_size("v100") == 2
    with pytest.raises(ValueError, match="the nodes hold"):
        Cluster({"v100": 4}, nodes=cluster.nodes, fabric=cluster.fabric)
    with pytest.raises(ValueError, match="need a fabric"):
        Cluster({"v100": 3}, nodes=cluster.nodes)


def test_from_pool_uses_the_pool_files_nodes():
    pool = load_pool(ROOT / "runtime" / "pools" / "demo.yaml")
    cluster = Cluster.from_pool(pool)
    assert sum(cluster.devices.values()) == len(pool.devices())
    assert cluster.fabric is not None and set(cluster.fabric.coords) >= {n.name for n in pool.nodes}


def test_topology_choice_puts_a_gang_on_one_node_at_the_consolidated_rate():
    """A 2-device gang, 600 steps, 4 steps/s consolidated, 2 spread. Node ``b`` has room for it: both
    devices there, factor 1.0, 4 steps/s: 400 steps in round 0, the rest by t = 150."""
    result = run_rounds(
        [sim(1, 0.0, 600.0, devices=2)], two_nodes(), get_policy("fifo"), rates(4.0, 2.0, 2), round_s=100.0
    )
    (placement,) = result.placements[1]
    assert placement.nodes == ("b", "b") and placement.consolidated
    assert placement.factor == 1.0
    assert placement.steps_per_s == 4.0
    assert result.finish_s == {1: pytest.approx(150.0)}
    assert result.mean_gang_factor == 1.0


def test_a_continuing_job_keeps_its_devices():
    """Job 1 (2 devices, 1000 steps at 4/s) runs from t = 0 to 250 on node ``b``; job 2 (1 device)
    arrives at t = 50 and gets ``a`` from t = 100. FIFO never moves job 1: one placement, same devices,
    every round. Job 2 finishes at 100 + 300 / 4 = 175; when it is done its device is free again, and
    job 3 (arriving at 150) takes it at t = 200."""
    table = ThroughputTable(
        {("A", "v100", n, c): 4.0 for n in (1, 2) for c in (True, False)},
    )
    trace = [sim(1, 0.0, 1000.0, devices=2), sim(2, 50.0, 300.0), sim(3, 150.0, 100.0)]
    result = run_rounds(trace, two_nodes(), get_policy("fifo"), table, round_s=100.0)
    assert [(p.start_s, p.devices) for p in result.placements[1]] == [(0.0, ("b/0", "b/1"))]
    assert [(p.start_s, p.devices) for p in result.placements[2]] == [(100.0, ("a/0",))]
    assert [(p.start_s, p.devices) for p in result.placements[3]] == [(200.0, ("a/0",))]
    assert result.finish_s == pytest.approx({1: 250.0, 2: 175.0, 3: 225.0})
    assert result.restarts == 3


def ring() -> Cluster:
    """Four 1-device nodes on a 4 x 1 x 1 torus; names out of ring order: a at x=0, b at 2, c at 1, d at 3."""
    coords = {"a": (0, 0, 0), "b": (2, 0, 0), "c": (1, 0, 0), "d": (3, 0, 0)}
    return Cluster.laid_out([NodeSpec(n, "v100", 1) for n in coords], Fabric(Torus3D((4, 1, 1)), coords))


def test_on_a_tiny_torus_topology_choice_beats_blind_packing():
    """A 2-device gang of 300 steps; 6 steps/s on one node (every gang spreads here: nodes hold 1 device).
    The factor charges the spread, against the one-node rate (the table's spread rate is not used too).

    topology: a and its neighbour c, 1 hop: factor 1 + 1/2 = 1.5, 4 steps/s, done at t = 75.
    pack (fullest node first, ties by name: a, b): 2 hops, factor 2.0, 3 steps/s, done at t = 100.
    """
    table = rates(6.0, 3.0, 2)
    finish, factor = {}, {}
    for choice in ("topology", "pack"):
        result = run_rounds(
            [sim(1, 0.0, 300.0, devices=2)],
            ring(),
            get_policy("fifo"),
            table,
            round_s=100.0,
            device_choice=choice,
            comm_fraction=0.5,
            link=LATENCY_ONLY,
        )
        (placement,) = result.placements[1]
        finish[choice], factor[choice] = result.finish_s[1], placement.factor
        assert sorted(placement.nodes) == (["a", "c"] if choice == "topology" else ["a", "b"])
        assert result.mean_gang_factor == pytest.approx(placement.factor)
    assert factor == pytest.approx({"topology": 1.5, "pack": 2.0})
    assert finish == pytest.approx({"topology": 75.0, "pack": 100.0})


def test_random_choice_is_seeded_and_no_better_than_topology():
    table = rates(6.0, 3.0, 2)
    trace = [sim(i, 0.0, 300.0, devices=2) for i in range(1, 4)]
    runs = [
        run_rounds(trace, ring(), get_policy("fifo"), table, round_s=100.0, device_choice="random", seed=s)
        for s in (1, 1, 2)
    ]
    assert runs[0].placements == runs[1].placements
    aware = run_rounds(trace, ring(), get_policy("fifo"), table, round_s=100.0)
    assert all(run.mean_gang_factor >= aware.mean_gang_factor for run in runs)


def test_bad_device_choice_or_comm_fraction():
    trace = [sim(1, 0.0, 10.0)]
    with pytest.raises(ValueError, match="device_choice"):
        run_rounds(trace, ring(), get_policy("fifo"), rates(1.0, 1.0, 1), device_choice="nearest")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="comm_fraction"):
        run_rounds(trace, ring(), get_policy("fifo"), rates(1.0, 1.0, 1), comm_fraction=1.5)
