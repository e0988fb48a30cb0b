"""The Kubernetes backend (issue 21), built in parts: so far the pool as a cluster's nodes show it
(``inventory``) and the objects of a tenant and of a run (``manifests``, each checked against the
Kubernetes schemas in the tests). ``POLYCHIP_BACKEND=kubernetes`` still refuses to start until the
backend that applies and observes them lands."""

from runtime.backends.kubernetes.inventory import (
    ClusterInventory,
    ClusterSettings,
    FlavorSelector,
    NodeState,
    cluster_settings,
    node_state,
    read_inventory,
)
from runtime.backends.kubernetes.manifests import ClusterConfig, run_children, run_parent, tenant_objects

__all__ = [
    "ClusterConfig",
    "ClusterInventory",
    "ClusterSettings",
    "FlavorSelector",
    "NodeState",
    "cluster_settings",
    "node_state",
    "read_inventory",
    "run_children",
    "run_parent",
    "tenant_objects",
]
