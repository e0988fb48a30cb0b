"""The Kubernetes backend (issue 21), built in parts: so far the pool as a cluster's nodes show it
(``inventory``). ``POLYCHIP_BACKEND=kubernetes`` still refuses to start until the rest lands."""

from runtime.backends.kubernetes.inventory import (
    ClusterInventory,
    ClusterSettings,
    FlavorSelector,
    NodeState,
    cluster_settings,
    node_state,
    read_inventory,
)

__all__ = [
    "ClusterInventory",
    "ClusterSettings",
    "FlavorSelector",
    "NodeState",
    "cluster_settings",
    "node_state",
    "read_inventory",
]
