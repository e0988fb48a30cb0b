"""The runtime backend that settings choose; built once per process."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from runtime.backends.base import Backend
from runtime.inventory import load_pool
from tenants import services as tenants


@cache
def get_backend() -> Backend:
    if settings.POLYCHIP_BACKEND == "local":
        from jobs.checks import local_link_is_valid
        from runtime.backends.local import LocalBackend

        # A process that skipped the system checks (a Celery worker) still names the setting to fix.
        for error in local_link_is_valid(None):
            raise ImproperlyConfigured(f"{error.msg}: {error.hint} ({error.id})")
        gbit = settings.POLYCHIP_LOCAL_LINK_GBIT
        pool = load_pool(settings.POLYCHIP_POOL_FILE)
        return LocalBackend(
            runs_dir=settings.POLYCHIP_RUNS_DIR,
            profiles=pool.local_profiles,
            sample_time_ms=settings.POLYCHIP_LOCAL_SAMPLE_TIME_MS,
            link_gbit=None if gbit is None else float(gbit),
            link_shaping=settings.POLYCHIP_LOCAL_LINK_SHAPING,
            telemetry_files=settings.POLYCHIP_LOCAL_TELEMETRY_FILES,
            sandbox=settings.POLYCHIP_SANDBOX,
            standby_ranks=settings.POLYCHIP_LOCAL_STANDBY_RANKS,
        )
    if settings.POLYCHIP_BACKEND == "kubernetes":
        return _kubernetes_backend()
    raise ImproperlyConfigured(f"POLYCHIP_BACKEND={settings.POLYCHIP_BACKEND!r}: use local or kubernetes")


def _kubernetes_backend() -> Backend:
    from jobs.checks import backend_is_configured
    from runtime.backends.kubernetes import ClusterConfig, KubernetesBackend, cluster_settings
    from runtime.backends.kubernetes.api import Api, connect

    for error in backend_is_configured(None):
        if error.is_serious():
            raise ImproperlyConfigured(f"{error.msg}: {error.hint} ({error.id})")
    selectors = cluster_settings(load_pool(settings.POLYCHIP_POOL_FILE)).selectors
    config = ClusterConfig(
        worker_image=settings.POLYCHIP_K8S_WORKER_IMAGE,
        resources={s.flavor: s.resource for s in selectors},
        tolerations={s.flavor: s.tolerations for s in selectors},
        namespace_prefix=settings.POLYCHIP_K8S_NAMESPACE_PREFIX,
        control_plane_namespace=settings.POLYCHIP_K8S_CONTROL_PLANE_NAMESPACE,
    )
    return KubernetesBackend(
        Api(connect(settings.POLYCHIP_K8S_KUBECONFIG)),
        config,
        settings.POLYCHIP_RUNS_DIR,
        telemetry_base=settings.POLYCHIP_K8S_TELEMETRY_URL or None,
    )


def device_limits(tenant_id: int, capacity: Mapping[str, int]) -> dict[str, int]:
    """The most devices of each flavor (of ``capacity``: the pool's, per flavor) a tenant may hold at
    once: its nominal quota and what it may borrow, within the flavor's pool; a flavor without a quota
    of its own, the whole pool (as admission lets it, within the tenant's NAU)."""
    quotas = {q.resource: q for q in tenants.list_quotas(tenant_id)}
    limits: dict[str, int] = {}
    for flavor, pool in sorted(capacity.items()):
        quota = quotas.get(flavor)
        if quota is None or quota.borrowing_limit is None:
            limits[flavor] = pool
        else:
            limits[flavor] = min(pool, int(quota.nominal + quota.borrowing_limit))
    return limits
