"""How a gang's place in the topology stretches a data-parallel step: a documented model.

A data-parallel step computes, then all-reduces its gradients. We model the all-reduce as DDP does
it: the gradients go in buckets, and each bucket is a ring all-reduce over the gang's ranks,
``2 (n - 1)`` steps in which every rank sends ``bucket / n`` bytes to its ring neighbour at once. A
ring step lasts as long as its slowest edge:

    edge time = latency + (bucket / n) / bandwidth
    latency   = base_latency                           inside a node (0 hops)
              = base_latency + hop_latency * hops      between nodes
    bandwidth = intra_node_gbps inside a node, inter_node_gbps between nodes (GB/s)

The ring visits each node's ranks one after another (intra-node edges), and the nodes in
nearest-neighbour order from the first one, closing back to it; the edges between nodes cross
``hops`` links each. The communication time of a step is ``buckets * 2 (n - 1) * slowest edge``.

The *ideal* layout puts every rank on one node, where every edge is intra-node. A job's isolated
step time is taken to be its step time in that ideal layout, of which ``comm_fraction`` is
communication; in a real layout the communication part stretches by ``t / t_ideal`` and the
compute part does not:

    step_time_factor = (1 - comm_fraction) + comm_fraction * t / t_ideal   (>= 1)

For a gang larger than a node no layout reaches the ideal, so compare factors between layouts
rather than reading one alone. The default figures of ``LinkModel`` are assumptions that
describe a common set-up, not measurements: NVLink-class 900 GB/s inside a node (the H100 figure
of the demo pool), one 400 Gb/s NIC (50 GB/s) per device between nodes, 5 µs to launch a ring
step, 1 µs per link crossed, and DDP's default 25 MiB buckets. Pass your own ``LinkModel`` to
model another cluster.

On the local backend every rank is a process on one host, so every layout is the ideal one there
and the factor is 1: this model has nothing to say about it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runtime.inventory.topology import Coords, Topology


@dataclass(frozen=True)
class LinkModel:
    intra_node_gbps: float = 900.0
    inter_node_gbps: float = 50.0
    base_latency_us: float = 5.0
    hop_latency_us: float = 1.0
    bucket_mib: float = 25.0

    def __post_init__(self) -> None:
        for name in ("intra_node_gbps", "inter_node_gbps", "bucket_mib"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be > 0")
        for name in ("base_latency_us", "hop_latency_us"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0")

    def edge_seconds(self, hops: int, ranks: int) -> float:
        """One ring step over one edge of ``hops`` links, in a ring of ``ranks``."""
        chunk = self.bucket_mib * 2**20 / ranks
        if hops == 0:
            return self.base_latency_us * 1e-6 + chunk / (self.intra_node_gbps * 1e9)
        return (self.base_latency_us + self.hop_latency_us * hops) * 1e-6 + chunk / (self.inter_node_gbps * 1e9)


def ring_edge_hops(gang_nodes: Sequence[Coords], topology: Topology) -> list[int]:
    """The hops of each edge of the ring over the gang's ranks (one entry per rank, in any order)."""
    per_node: dict[Coords, int] = {}
    for coords in gang_nodes:
        per_node[tuple(coords)] = per_node.get(tuple(coords), 0) + 1
    edges = [0] * sum(k - 1 for k in per_node.values())
    nodes = list(per_node)
    if len(nodes) > 1:
        # Nearest-neighbour tour from the first node: the order a ring-building library would
        # approximate; exact tours are not worth it for a model.
        tour = [nodes[0]]
        rest = nodes[1:]
        while rest:
            here = tour[-1]
            best = min(range(len(rest)), key=lambda i: topology.hops(here, rest[i]))
            tour.append(rest.pop(best))
        edges.extend(topology.hops(a, b) for a, b in zip(tour, tour[1:] + tour[:1], strict=True))
    return edges


def allreduce_seconds(gang_nodes: Sequence[Coords], topology: Topology, link: LinkModel | None = None) -> float:
    """Seconds of one bucket's ring all-reduce over ranks on the nodes at ``gang_nodes`` (one entry
    per rank; a node appears once per rank on it)."""
    link = link or LinkModel()
    n = len(gang_nodes)
    if n < 2:
        return 0.0
    slowest = max(link.edge_seconds(h, n) for h in ring_edge_hops(gang_nodes, topology))
    return 2 * (n - 1) * slowest


def step_time_factor(
    gang_nodes: Sequence[Coords], topology: Topology, comm_fraction: float, link: LinkModel | None = None
) -> float:
    """The multiplier (>= 1) on a job's isolated step time when its ranks sit at ``gang_nodes``."""
    if not 0.0 <= comm_fraction <= 1.0:
        raise ValueError(f"comm_fraction: must be between 0 and 1, got {comm_fraction!r}")
    link = link or LinkModel()
    n = len(gang_nodes)
    if n < 2:
        return 1.0
    ideal = 2 * (n - 1) * link.edge_seconds(0, n)
    actual = allreduce_seconds(gang_nodes, topology, link)
    return (1.0 - comm_fraction) + comm_fraction * actual / ideal
