"""The Kubernetes backend (issue 21), built in parts: so far the pool as a cluster's nodes show it
(``inventory``), the objects of a tenant and of a run (``manifests``, each checked against the
Kubernetes schemas in the tests), and what a run's pods say of it (``observe``).
``POLYCHIP_BACKEND=kubernetes`` still refuses to start until the backend that applies the objects and
watches the pods lands."""

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
from runtime.backends.kubernetes.observe import observation_of

__all__ = [
    "ClusterConfig",
    "ClusterInventory",
    "ClusterSettings",
    "FlavorSelector",
    "NodeState",
    "cluster_settings",
    "node_state",
    "observation_of",
    "read_inventory",
    "run_children",
    "run_parent",
    "tenant_objects",
]
