"""The Kubernetes backend (``POLYCHIP_BACKEND=kubernetes``): the pool as a cluster's nodes show it
(``inventory``), the objects of a tenant and of a run (``manifests``, each checked against the
Kubernetes schemas in the tests), what a run's pods say of it (``observe``), the API as plain JSON
(``api``), the pods kept current by list-then-watch (``reconcile``) and the backend itself (``backend``).
Tested against an emulated apiserver and a node agent that runs pods as local processes, never yet a
real cluster (README: What runs against an emulator)."""

from runtime.backends.kubernetes.backend import KubernetesBackend
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
    "KubernetesBackend",
    "NodeState",
    "cluster_settings",
    "node_state",
    "observation_of",
    "read_inventory",
    "run_children",
    "run_parent",
    "tenant_objects",
]
