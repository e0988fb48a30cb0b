"""The inventory: the pool's flavors, nodes and devices, their health, and the network topology.

- ``pool``: the pool file (flavors, nodes, devices, health states, coordinates).
- ``topology``: 3D torus, dragonfly and fat tree with hop distances; ``Fabric`` gives them by node name.
- ``steptime``: a model of how a gang's hops stretch a data-parallel step.
"""

from runtime.inventory.pool import (
    SCHEDULABLE,
    DeviceSpec,
    Health,
    NodeSpec,
    Pool,
    PoolFileError,
    load_pool,
    parse_pool,
)
from runtime.inventory.steptime import LinkModel, allreduce_seconds, ring_edge_hops, step_time_factor
from runtime.inventory.topology import (
    TOPOLOGY_KINDS,
    Coords,
    Dragonfly,
    Fabric,
    FatTree,
    Topology,
    Torus3D,
    make_topology,
    rack_fat_tree,
)

__all__ = [
    "SCHEDULABLE",
    "TOPOLOGY_KINDS",
    "Coords",
    "DeviceSpec",
    "Dragonfly",
    "Fabric",
    "FatTree",
    "Health",
    "LinkModel",
    "NodeSpec",
    "Pool",
    "PoolFileError",
    "Topology",
    "Torus3D",
    "allreduce_seconds",
    "load_pool",
    "make_topology",
    "parse_pool",
    "rack_fat_tree",
    "ring_edge_hops",
    "step_time_factor",
]
