"""Topology-aware device choice against topology-blind choice, in the step-time model.

For each topology (fat tree, dragonfly, 3D torus) it builds a cluster of 8-device nodes (1,024
nodes, 8,192 devices; ``--quick``: 256 nodes), takes a random share of the devices (seeded) so the
free devices are fragmented, and places gangs of 4, 8, 16 and 32 devices three ways:

- ``aware``: ``runtime.scheduling.choose_devices`` with the topology's hop distance;
- ``lowest_ids``: the free devices with the lowest ids (node names follow the coordinates, so this
  is a linear sweep of the cluster);
- ``random``: free devices drawn at random.

It prints, per topology and gang size, the mean step-time factor of the model
(``runtime.inventory.step_time_factor``, ``comm_fraction`` 0.3, default ``LinkModel``) for each
choice, the ratios aware / blind (below 1: the aware choice steps faster), the mean pairwise hops,
and the time that ``choose_devices`` took per gang (also for gangs of 64).

Then the round simulator (``runtime.simulate.run_rounds``, policy ``aware``, rounds of 360 s) replays
Gavel's ``static_multi_100`` trace (gangs of 1, 2, 4 and 8 devices) on 24 k80, 24 p100 and 24 v100
laid out as 4-device nodes (6 per flavor, 18 nodes) in a fat tree (3 pods of 2 racks of 3 nodes, a
pod per flavor) and in a 3D torus (3 x 3 x 2), once per device choice: ``topology`` (hop distance),
``pack`` (fullest node first) and ``random`` (seeded). A placed job runs at the table's rate
(consolidated only on one node) divided by the model's factor for its nodes. It prints avg JCT,
makespan and the mean step-time factor of gangs of 2+ devices (weighted by the time they ran), and
the ratios topology / random and topology / pack. The last line is one JSON object with all of it.

The local backend runs every rank as a process on one host: every layout is the ideal one there,
so topology-aware choice cannot change its step time and this bench reports no figure for it.

    .venv/bin/python bench/topology.py [--quick] [--seed 7]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import asdict
from itertools import combinations
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.inventory import Dragonfly, Fabric, FatTree, LinkModel, NodeSpec, Topology, Torus3D, step_time_factor
from runtime.scheduling import FreeDevice, choose_devices
from runtime.scheduling.policies import get_policy
from runtime.simulate import load_gavel_throughputs, load_trace, run_rounds, summarize
from runtime.simulate.rounds import DEVICE_CHOICES, Cluster

DEVICES_PER_NODE = 8
GANGS = (4, 8, 16, 32)
TIMED_GANGS = (*GANGS, 64)
COMM_FRACTION = 0.3
BUSY_SHARE = 0.6  # share of devices already taken: what makes the pool fragmented
FLAVOR = "h100-sxm"


def topologies(quick: bool) -> dict[str, Topology]:
    if quick:  # 256 nodes each
        return {
            "fat-tree": FatTree(pods=4, racks_per_pod=4, nodes_per_rack=16),
            "dragonfly": Dragonfly(groups=8, routers_per_group=4, global_links_per_router=2, nodes_per_router=8),
            "torus3d": Torus3D(dims=(8, 8, 4)),
        }
    return {  # 1,024 nodes each
        "fat-tree": FatTree(pods=8, racks_per_pod=8, nodes_per_rack=16),
        "dragonfly": Dragonfly(groups=16, routers_per_group=8, global_links_per_router=2, nodes_per_router=8),
        "torus3d": Torus3D(dims=(8, 8, 16)),
    }


def all_coords(topology: Topology) -> list[tuple[int, ...]]:
    a, b, c = topology.bounds()
    return [(i, j, k) for i in range(a) for j in range(b) for k in range(c)]


def fragmented(fabric: Fabric, rng: random.Random) -> list[FreeDevice]:
    devices = [
        FreeDevice(device_id=f"{node}/{i}", node=node, flavor=FLAVOR)
        for node in sorted(fabric.coords)
        for i in range(DEVICES_PER_NODE)
    ]
    return sorted(rng.sample(devices, round(len(devices) * (1 - BUSY_SHARE))), key=lambda d: d.device_id)


def pairwise_hops(devices: list[FreeDevice], fabric: Fabric) -> float:
    pairs = list(combinations(devices, 2))
    return sum(fabric.hops(a.node, b.node) for a, b in pairs) / len(pairs)


GAVEL = Path(__file__).resolve().parent / "data" / "gavel"
SIM_TRACE = "static_multi_100"
SIM_FLAVORS = ("k80", "p100", "v100")
SIM_DEVICES_PER_NODE = 4
SIM_NODES_PER_FLAVOR = 6


def sim_topologies() -> dict[str, Topology]:
    return {  # 18 nodes each
        "fat-tree": FatTree(pods=3, racks_per_pod=2, nodes_per_rack=3),
        "torus3d": Torus3D(dims=(3, 3, 2)),
    }


def simulate(seed: int, link: LinkModel) -> dict[str, object]:
    """Replay the trace once per topology and device choice; figures per topology."""
    table = load_gavel_throughputs(GAVEL / "throughputs.csv")
    trace = load_trace(GAVEL / f"trace_{SIM_TRACE}.csv", table)
    nodes = [
        NodeSpec(name=f"{flavor}-{i}", flavor=flavor, devices=SIM_DEVICES_PER_NODE)
        for flavor in SIM_FLAVORS
        for i in range(SIM_NODES_PER_FLAVOR)
    ]
    print(
        f"round simulator: {SIM_TRACE}, policy aware, {len(nodes)} nodes of {SIM_DEVICES_PER_NODE} devices"
        f" ({SIM_NODES_PER_FLAVOR * SIM_DEVICES_PER_NODE} each of {', '.join(SIM_FLAVORS)})"
    )
    print("  topology  choice    avg JCT h  makespan h  gang factor  placements  wall s")
    out: dict[str, object] = {}
    for name, topology in sim_topologies().items():
        fabric = Fabric(topology=topology, coords=dict(zip((n.name for n in nodes), all_coords(topology), strict=True)))
        cluster = Cluster.laid_out(nodes, fabric)
        runs: dict[str, dict[str, float]] = {}
        for choice in DEVICE_CHOICES:
            started = time.perf_counter()
            result = run_rounds(
                trace,
                cluster,
                get_policy("aware"),
                table,
                device_choice=choice,
                comm_fraction=COMM_FRACTION,
                link=link,
                seed=seed,
            )
            wall = time.perf_counter() - started
            summary = summarize(result)
            runs[choice] = {
                "avg_jct_h": round(summary.avg_jct_h, 3),
                "makespan_h": round(summary.makespan_h, 3),
                "gang_factor": round(result.mean_gang_factor, 4),
                "placements": sum(len(v) for v in result.placements.values()),
                "wall_s": round(wall, 2),
            }
            r = runs[choice]
            print(
                f"  {name:9s} {choice:9s} {r['avg_jct_h']:9.2f}  {r['makespan_h']:10.1f}  {r['gang_factor']:11.3f}"
                f"  {r['placements']:10d}  {r['wall_s']:6.2f}"
            )
        ratios = {
            f"{key}_topology_vs_{blind}": round(runs["topology"][key] / runs[blind][key], 4)
            for blind in ("random", "pack")
            for key in ("avg_jct_h", "makespan_h", "gang_factor")
        }
        print(
            "  ratios topology / random: avg JCT {avg_jct_h_topology_vs_random:.3f}, makespan "
            "{makespan_h_topology_vs_random:.3f}, factor {gang_factor_topology_vs_random:.3f};"
            " topology / pack: {avg_jct_h_topology_vs_pack:.3f}, {makespan_h_topology_vs_pack:.3f},"
            " {gang_factor_topology_vs_pack:.3f}".format(**ratios)
        )
        out[name] = {**runs, "ratios": ratios}
    return {
        "trace": SIM_TRACE,
        "policy": "aware",
        "nodes": len(nodes),
        "devices_per_node": SIM_DEVICES_PER_NODE,
        "topologies": out,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="256 nodes per topology, fewer trials")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    trials = 10 if args.quick else 40
    link = LinkModel()
    result: dict[str, object] = {
        "bench": "topology",
        "quick": args.quick,
        "seed": args.seed,
        "devices_per_node": DEVICES_PER_NODE,
        "busy_share": BUSY_SHARE,
        "comm_fraction": COMM_FRACTION,
        "trials": trials,
        "link_model": asdict(link),
        "local_backend": "not applicable: all ranks share one host, so every layout is the ideal one",
        "topologies": {},
    }
    for name, topology in topologies(args.quick).items():
        coords = all_coords(topology)
        fabric = Fabric(topology=topology, coords={f"n{i:05d}": c for i, c in enumerate(coords)})
        rng = random.Random(f"{args.seed}-{name}")
        rows: dict[str, dict[str, float]] = {}
        timings: dict[int, list[float]] = {g: [] for g in TIMED_GANGS}
        factors: dict[int, dict[str, list[float]]] = {g: {"aware": [], "lowest_ids": [], "random": []} for g in GANGS}
        hops: dict[int, dict[str, list[float]]] = {g: {"aware": [], "lowest_ids": [], "random": []} for g in GANGS}
        for _ in range(trials):
            free = fragmented(fabric, rng)
            for gang in TIMED_GANGS:
                start = time.perf_counter()
                aware = choose_devices(free, {FLAVOR: gang}, fabric.hops)
                timings[gang].append((time.perf_counter() - start) * 1000)
                if gang not in factors:
                    continue
                choices = {"aware": aware, "lowest_ids": free[:gang], "random": rng.sample(free, gang)}
                for how, devices in choices.items():
                    layout = [fabric.coords[d.node] for d in devices]
                    factors[gang][how].append(step_time_factor(layout, topology, COMM_FRACTION, link))
                    hops[gang][how].append(pairwise_hops(devices, fabric))
        print(f"{name} ({len(coords)} nodes, {len(coords) * DEVICES_PER_NODE} devices, {BUSY_SHARE:.0%} taken)")
        print(
            "  gang  factor aware / lowest ids / random   ratio vs lowest ids / random   mean hops aware / ids / random"
        )
        for gang in GANGS:
            mean = {how: statistics.fmean(v) for how, v in factors[gang].items()}
            mean_hops = {how: statistics.fmean(v) for how, v in hops[gang].items()}
            rows[str(gang)] = {
                "factor_aware": round(mean["aware"], 4),
                "factor_lowest_ids": round(mean["lowest_ids"], 4),
                "factor_random": round(mean["random"], 4),
                "ratio_vs_lowest_ids": round(mean["aware"] / mean["lowest_ids"], 4),
                "ratio_vs_random": round(mean["aware"] / mean["random"], 4),
                "pair_hops_aware": round(mean_hops["aware"], 3),
                "pair_hops_lowest_ids": round(mean_hops["lowest_ids"], 3),
                "pair_hops_random": round(mean_hops["random"], 3),
            }
            r = rows[str(gang)]
            print(
                f"  {gang:4d}  {r['factor_aware']:.3f} / {r['factor_lowest_ids']:.3f} / {r['factor_random']:.3f}"
                f"          {r['ratio_vs_lowest_ids']:.3f} / {r['ratio_vs_random']:.3f}"
                f"              {r['pair_hops_aware']:.2f} / {r['pair_hops_lowest_ids']:.2f}"
                f" / {r['pair_hops_random']:.2f}"
            )
        choice_ms = {
            str(g): {"median": round(statistics.median(v), 3), "max": round(max(v), 3)} for g, v in timings.items()
        }
        print(
            "  choose_devices ms per gang (median / max): "
            + ", ".join(f"{g}: {v['median']:.2f} / {v['max']:.2f}" for g, v in choice_ms.items())
        )
        assert isinstance(result["topologies"], dict)
        result["topologies"][name] = {
            "nodes": len(coords),
            "free_devices": round(len(coords) * DEVICES_PER_NODE * (1 - BUSY_SHARE)),
            "gangs": rows,
            "choose_ms": choice_ms,
        }
    result["simulator"] = simulate(args.seed, link)
    print(json.dumps(result, separators=(",", ":")))


if __name__ == "__main__":
    main()
