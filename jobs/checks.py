"""System checks: settings that would otherwise fail only when the first job is admitted."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from runtime.backends.kubernetes import cluster_settings
from runtime.inventory import PoolFileError, load_pool
from runtime.scheduling.policies import POLICIES

# How the local backend may shape the cross-group link (``runtime.backends.local.LocalBackend``).
LINK_SHAPINGS = ("auto", "netns", "token_bucket")
BACKENDS = ("local", "kubernetes")
# A namespace prefix leaves room for a tenant's slug within a DNS label's 63 characters.
_NAMESPACE_PREFIX = re.compile(r"^[a-z]([-a-z0-9]{0,30})$")


@register()
def placement_policy_is_known(app_configs: Any, **kwargs: Any) -> list[Error]:
    name = settings.POLYCHIP_PLACEMENT_POLICY
    if name in ("", "none") or name in POLICIES:
        return []
    choices = ", ".join([*POLICIES, "none"])
    return [
        Error(
            f"POLYCHIP_PLACEMENT_POLICY={name!r} is not a placement policy",
            hint=f"set it to one of: {choices}",
            id="polychip.E001",
        )
    ]


@register()
def local_link_is_valid(app_configs: Any, **kwargs: Any) -> list[Error]:
    """The local backend's emulated cross-group link: a speed in Gbit/s (or none) and a shaping."""
    errors = []
    gbit = settings.POLYCHIP_LOCAL_LINK_GBIT
    if gbit is not None and (
        isinstance(gbit, bool) or not isinstance(gbit, int | float) or not math.isfinite(gbit) or gbit <= 0
    ):
        errors.append(
            Error(
                f"POLYCHIP_LOCAL_LINK_GBIT={gbit!r} is not a link speed",
                hint="set it to the cross-group link's speed in Gbit/s, a number > 0 such as 1 or 0.5, "
                "or unset it for no throttling",
                id="polychip.E002",
            )
        )
    shaping = settings.POLYCHIP_LOCAL_LINK_SHAPING
    if shaping not in LINK_SHAPINGS:
        errors.append(
            Error(
                f"POLYCHIP_LOCAL_LINK_SHAPING={shaping!r} is not a way to shape the link",
                hint="set it to auto (netns where the machine allows it, else token_bucket), netns (tc in "
                "network namespaces; needs root) or token_bucket (the ranks' own transport waits)",
                id="polychip.E003",
            )
        )
    return errors


@register()
def backend_is_configured(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    """The backend named, and for Kubernetes what it needs: a cluster to reach, an image for the ranks,
    a namespace prefix that makes DNS labels, and pool-file kubernetes sections it can read."""
    backend = settings.POLYCHIP_BACKEND
    if backend not in BACKENDS:
        return [
            Error(
                f"POLYCHIP_BACKEND={backend!r} is not a backend",
                hint="set it to local (processes on this host) or kubernetes (pods on a cluster)",
                id="polychip.E004",
            )
        ]
    if backend != "kubernetes":
        return []
    errors: list[CheckMessage] = []
    if not settings.POLYCHIP_CHECKPOINT_URL.startswith("s3://"):
        errors.append(
            Warning(
                f"POLYCHIP_CHECKPOINT_URL={settings.POLYCHIP_CHECKPOINT_URL!r} is a folder of the control plane's: "
                "ranks in pods see it only if every node mounts it at that path",
                hint="use an S3 store (s3://bucket/prefix) that the tenants' pods can reach, or mount the folder "
                "on every node; the same holds for the artifacts folder (POLYCHIP_VAR_DIR/artifacts)",
                id="polychip.W001",
            )
        )
    kubeconfig = settings.POLYCHIP_K8S_KUBECONFIG
    if kubeconfig and not Path(kubeconfig).is_file():
        errors.append(
            Error(
                f"POLYCHIP_K8S_KUBECONFIG={kubeconfig!r} is not a file",
                hint="give the path of a kubeconfig, or leave it empty to use the pod's service account in a cluster",
                id="polychip.E005",
            )
        )
    elif not kubeconfig and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        errors.append(
            Error(
                "POLYCHIP_K8S_KUBECONFIG is empty and this process is not in a cluster (no KUBERNETES_SERVICE_HOST)",
                hint="set POLYCHIP_K8S_KUBECONFIG to a kubeconfig file that reaches the cluster",
                id="polychip.E005",
            )
        )
    image = settings.POLYCHIP_K8S_WORKER_IMAGE
    if not image or any(c.isspace() for c in image):
        errors.append(
            Error(
                f"POLYCHIP_K8S_WORKER_IMAGE={image!r} is not an image reference",
                hint="set it to the Polychip image the ranks run, e.g. registry.example.com/polychip:0.1.0 "
                "(deploy/Containerfile builds it)",
                id="polychip.E006",
            )
        )
    prefix = settings.POLYCHIP_K8S_NAMESPACE_PREFIX
    if not _NAMESPACE_PREFIX.match(prefix):
        errors.append(
            Error(
                f"POLYCHIP_K8S_NAMESPACE_PREFIX={prefix!r} cannot begin a namespace name",
                hint="use a lowercase letter, then up to 30 lowercase letters, digits or dashes, e.g. polychip-t-",
                id="polychip.E007",
            )
        )
    try:
        cluster_settings(load_pool(settings.POLYCHIP_POOL_FILE))
    except (OSError, PoolFileError) as exc:
        errors.append(
            Error(
                f"POLYCHIP_POOL_FILE={settings.POLYCHIP_POOL_FILE!r}: {exc}",
                hint="fix the pool file's kubernetes sections (README: Inventory from a Kubernetes cluster)",
                id="polychip.E008",
            )
        )
    return errors
