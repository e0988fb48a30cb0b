"""The Kubernetes objects of a tenant and of a job's attempt, as plain manifests (dicts the apiserver takes).

A tenant gets a namespace of its own with, as defence in depth beside Polychip's own admission, a
ResourceQuota per extended resource it may use, a LimitRange, a NetworkPolicy that admits only its own
pods' traffic and lets them reach only each other, the control plane's web pods (telemetry) and DNS,
a service account with no API rights and no token mounted, and the RoleBinding that gives the control
plane its rights there (``TENANT_RUNS_ROLE``, a ClusterRole bound in tenants' namespaces only: the
control plane holds no such right cluster-wide).

A job's attempt (a *run*) is one parent object, a ConfigMap holding each rank's worker config without
its secret, and children that name it as their owner, so that tearing the run down is one delete:

- a Secret with the job's ingest token (the ranks read it from ``POLYCHIP_TELEMETRY_TOKEN``);
- a headless Service (``publishNotReadyAddresses``: ranks find each other before they are ready)
  that gives every pod of the run a DNS name, ``<hostname>.<run>``;
- the rendezvous store in a pod of its own (``runtime.recovery.storehost``), so that a rank's death
  does not take the rendezvous down with it;
- a pod per rank, pinned to the node admission chose (required node affinity), asking for one device
  of its flavor's extended resource, tolerating the flavor's taints, with the torchrun environment
  (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``...) beside Polychip's.

Pods are bare (``restartPolicy: Never``): a rank that fails is Polychip's to recover, on devices it
chooses, not the kubelet's to restart in place. The device plugin chooses which of the node's devices
a pod gets; Polychip pins the node and the count (device ids are the node's name and an index).

Built-in jobs run the Polychip worker image; ``container`` jobs the tenant's image and command with the
same environment. ``python`` and ``torchrun`` jobs run the worker image too, with their code bundle
fetched before the rank starts by an init container (``runtime.codefetch``: from the control plane's
ingest route, with the run's token, checked against the job's SHA-256) into a pod-local volume at
``CODE_DIR``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from runtime.backends.base import LaunchRequest
from runtime.worker.config import TELEMETRY_TOKEN_ENV

LABEL_RUN = "polychip.io/run"
LABEL_ROLE = "polychip.io/role"
LABEL_RANK = "polychip.io/rank"
LABEL_FLAVOR = "polychip.io/flavor"
LABEL_TENANT = "polychip.io/tenant"
LABEL_MANAGED = "app.kubernetes.io/managed-by"
MANAGER = "polychip"
CONFIG_DIR = "/etc/polychip/run"
CODE_VOLUME = "/polychip/code"  # the pod's emptyDir (its own folder belongs to root)
CODE_DIR = f"{CODE_VOLUME}/src"  # made and filled by the init container, as the rank's user
RUNNER_ACCOUNT = "polychip-runner"
CONTROL_PLANE_ACCOUNT = "polychip-control-plane"
TENANT_RUNS_ROLE = "polychip-tenant-runs"  # deploy/kubernetes/base/rbac.yaml
WEB_PORT = 8000
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class ClusterConfig:
    """What Polychip's settings say of the cluster it runs jobs on."""

    worker_image: str
    # flavor -> its extended resource (``nvidia.com/gpu``...) and the taint keys its pods tolerate
    resources: Mapping[str, str]
    tolerations: Mapping[str, frozenset[str]] = field(default_factory=dict)
    namespace_prefix: str = "polychip-t-"
    control_plane_namespace: str = "polychip"
    store_port: int = 29500
    # Each rank's CPU and memory (requests = limits: a rank's speed must not depend on its neighbours').
    rank_cpu: str = "4"
    rank_memory: str = "16Gi"
    store_cpu: str = "250m"
    store_memory: str = "256Mi"


def tenant_namespace(config: ClusterConfig, tenant_slug: str) -> str:
    """The tenant's namespace: the prefix and its slug, a DNS label (``ValueError`` if it cannot be one)."""
    name = f"{config.namespace_prefix}{tenant_slug}".lower()
    if len(name) > 63 or not _DNS_LABEL.match(name):
        raise ValueError(
            f"namespace {name!r} is not a DNS label (lowercase letters, digits and dashes, at most 63); "
            "shorten the namespace prefix or the tenant's slug"
        )
    return name


def _metadata(name: str, namespace: str | None = None, **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {LABEL_MANAGED: MANAGER, **labels}}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def tenant_objects(config: ClusterConfig, tenant_slug: str, device_limits: Mapping[str, int]) -> list[dict[str, Any]]:
    """The tenant's namespace and what guards it, in the order they can be made: the namespace, then the
    RoleBinding that gives the control plane its rights there, then the rest; ``device_limits``: the most
    of each extended resource its pods may ask for at once (its quota and what it could borrow)."""
    namespace = tenant_namespace(config, tenant_slug)
    labels = {LABEL_TENANT: tenant_slug}
    own_pods: dict[str, Any] = {"podSelector": {}}
    control_plane_web = {
        "to": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": config.control_plane_namespace}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/component": "web"}},
            }
        ],
        "ports": [{"protocol": "TCP", "port": WEB_PORT}],
    }
    dns = {
        "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}],
        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
    }
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": _metadata(namespace, **labels)},
        # Second: the control plane's rights in the namespace, without which it could make nothing else there.
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _metadata("polychip-control-plane", namespace, **labels),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": TENANT_RUNS_ROLE},
            "subjects": [
                {"kind": "ServiceAccount", "name": CONTROL_PLANE_ACCOUNT, "namespace": config.control_plane_namespace}
            ],
        },
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _metadata(RUNNER_ACCOUNT, namespace, **labels),
            # No role binds it, and no token is mounted: the ranks have no business with the API.
            "automountServiceAccountToken": False,
        },
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": _metadata("polychip-devices", namespace, **labels),
            "spec": {"hard": {f"requests.{resource}": str(count) for resource, count in sorted(device_limits.items())}},
        },
        {
            "apiVersion": "v1",
            "kind": "LimitRange",
            "metadata": _metadata("polychip-defaults", namespace, **labels),
            "spec": {
                "limits": [
                    {
                        "type": "Container",
                        "default": {"cpu": config.rank_cpu, "memory": config.rank_memory},
                        "defaultRequest": {"cpu": config.store_cpu, "memory": config.store_memory},
                    }
                ]
            },
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": _metadata("polychip-isolation", namespace, **labels),
            "spec": {
                "podSelector": {},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [{"from": [own_pods]}],
                "egress": [{"to": [own_pods]}, control_plane_web, dns],
            },
        },
    ]


SHARED_CONFIG = "shared.json"


def run_parent(request: LaunchRequest, namespace: str, rank_configs: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """The run's parent object: a ConfigMap of the ranks' worker configs, token left out. What every rank's
    config holds alike (the split, the scores, the workload: arrays as long as the world) is written once
    in ``shared.json``; ``rank<N>.json`` holds the rest and names it (``runtime.worker.config.load_config``),
    so the object grows with the ranks, not with their square, and stays under the apiserver's 1 MiB."""
    configs = {
        rank: {key: value for key, value in worker.items() if key != "telemetry_token"}
        for rank, worker in sorted(rank_configs.items())
    }
    first = next(iter(configs.values()), {})
    common = {key: value for key, value in first.items() if all(key in c and c[key] == value for c in configs.values())}
    data = {SHARED_CONFIG: json.dumps(common, sort_keys=True)}
    for rank, worker in configs.items():
        own = {key: value for key, value in worker.items() if key not in common}
        data[f"rank{rank}.json"] = json.dumps({**own, "shared": SHARED_CONFIG}, sort_keys=True)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(request.job_id, namespace, **{LABEL_RUN: request.job_id, LABEL_ROLE: "run"}),
        "data": data,
    }


def run_children(
    config: ClusterConfig, request: LaunchRequest, namespace: str, owner_uid: str, *, bundle_url: str | None = None
) -> list[dict[str, Any]]:
    """Everything else of the run, each owned by the parent (whose ``metadata.uid`` the apiserver gave);
    ``bundle_url``: where the ranks of a python or torchrun job fetch its code (as the pods reach it)."""
    kind = request.workload.kind
    if kind in ("python", "torchrun") and not (bundle_url and request.workload.bundle):
        raise ValueError(
            f"workload.bundle: a {kind} job on Kubernetes needs its bundle and the URL its pods fetch it from "
            "(LaunchRequest.bundle_url)"
        )
    for placement in request.placements:
        if placement.flavor not in config.resources:
            raise ValueError(
                f"flavor {placement.flavor!r} has no extended resource in the cluster settings; "
                "add it under the flavor's kubernetes section of the pool file"
            )
    run = request.job_id
    owner = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": run,
        "uid": owner_uid,
        "controller": True,
    }

    def owned(name: str, **labels: str) -> dict[str, Any]:
        return {**_metadata(name, namespace, **{LABEL_RUN: run, **labels}), "ownerReferences": [owner]}

    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": owned(f"{run}-token", **{LABEL_ROLE: "token"}),
            "type": "Opaque",
            "stringData": {"token": request.telemetry_token},
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": owned(run, **{LABEL_ROLE: "rendezvous"}),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {LABEL_RUN: run},
                "ports": [{"name": "store", "port": config.store_port, "targetPort": config.store_port}],
            },
        },
        _store_pod(config, run, owned(f"{run}-store", **{LABEL_ROLE: "store"})),
    ]
    world_size = len(request.placements)
    for placement in sorted(request.placements, key=lambda p: p.rank):
        meta = owned(
            f"{run}-r{placement.rank}",
            **{LABEL_ROLE: "rank", LABEL_RANK: str(placement.rank), LABEL_FLAVOR: placement.flavor},
        )
        pod = _rank_pod(config, request, meta, placement.rank, placement.node, placement.flavor, world_size)
        if kind in ("python", "torchrun") and bundle_url:
            _with_code(config, pod, request.workload.bundle, bundle_url, run)
        objects.append(pod)
    return objects


def _with_code(config: ClusterConfig, pod: dict[str, Any], bundle: str, url: str, run: str) -> None:
    """The rank's code: fetched and checked by an init container into a volume the rank reads."""
    spec = pod["spec"]
    rank = spec["containers"][0]
    token = next(e for e in rank["env"] if e["name"] == TELEMETRY_TOKEN_ENV)
    resources = {"cpu": config.store_cpu, "memory": "512Mi"}
    spec["initContainers"] = [
        {
            "name": "code",
            "image": config.worker_image,
            "command": ["python", "-m", "runtime.codefetch", url, bundle, CODE_DIR],
            "env": [token, {"name": "PYTHONUNBUFFERED", "value": "1"}],
            "resources": {"requests": resources, "limits": resources},
            "volumeMounts": [{"name": "code", "mountPath": CODE_VOLUME}],
            "securityContext": _container_security(),
        }
    ]
    rank["volumeMounts"].append({"name": "code", "mountPath": CODE_VOLUME, "readOnly": True})
    spec["volumes"].append({"name": "code", "emptyDir": {"sizeLimit": "2Gi"}})


def _pod_spec(run: str, hostname: str) -> dict[str, Any]:
    return {
        "hostname": hostname,
        "subdomain": run,  # with the headless Service: <hostname>.<run>.<namespace>.svc
        "restartPolicy": "Never",
        "serviceAccountName": RUNNER_ACCOUNT,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
    }


def _container_security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _store_pod(config: ClusterConfig, run: str, metadata: dict[str, Any]) -> dict[str, Any]:
    resources = {"cpu": config.store_cpu, "memory": config.store_memory}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            **_pod_spec(run, "store"),
            "containers": [
                {
                    "name": "store",
                    "image": config.worker_image,
                    "command": ["python", "-m", "runtime.recovery.storehost", "0.0.0.0", str(config.store_port)],  # noqa: S104
                    "ports": [{"name": "store", "containerPort": config.store_port}],
                    "resources": {"requests": resources, "limits": resources},
                    "securityContext": _container_security(),
                }
            ],
        },
    }


def _rank_pod(
    config: ClusterConfig,
    request: LaunchRequest,
    metadata: dict[str, Any],
    rank: int,
    node: str,
    flavor: str,
    world_size: int,
) -> dict[str, Any]:
    run = request.job_id
    workload = request.workload
    env = {
        "MASTER_ADDR": f"store.{run}",
        "MASTER_PORT": str(config.store_port),
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": "0",  # one device per pod
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": str(rank),
        "POLYCHIP_JOB_ID": run,
        "POLYCHIP_ARTIFACTS_DIR": request.artifacts_dir,
        "PYTHONUNBUFFERED": "1",
        **workload.env,
    }
    env_list: list[dict[str, Any]] = [{"name": name, "value": value} for name, value in env.items()]
    env_list.append(
        {"name": TELEMETRY_TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": f"{run}-token", "key": "token"}}}
    )
    args: list[str] = []
    if workload.kind == "container":  # no command: the image's entrypoint, with the args
        image, command, args = workload.image, list(workload.command), list(workload.args)
    else:
        image, command = (
            config.worker_image,
            ["python", "-m", "runtime.worker", "--config", f"{CONFIG_DIR}/rank{rank}.json"],
        )
    resource = config.resources[flavor]
    cpu_memory = {"cpu": config.rank_cpu, "memory": config.rank_memory}
    container: dict[str, Any] = {
        "name": "rank",
        "image": image,
        "env": env_list,
        "resources": {"requests": {**cpu_memory, resource: "1"}, "limits": {**cpu_memory, resource: "1"}},
        "volumeMounts": [{"name": "run", "mountPath": CONFIG_DIR, "readOnly": True}],
        "securityContext": _container_security(),
    }
    if command:
        container["command"] = command
    if args:
        container["args"] = args
    # By the Node object's name, as the inventory knows nodes (a hostname label can differ from it).
    node_term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            **_pod_spec(run, f"r{rank}"),
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [node_term]}}
            },
            "tolerations": [
                {"key": key, "operator": "Exists", "effect": effect}
                for key in sorted(config.tolerations.get(flavor, frozenset()))
                for effect in ("NoSchedule", "NoExecute")
            ],
            "containers": [container],
            "volumes": [{"name": "run", "configMap": {"name": run}}],
        },
    }
