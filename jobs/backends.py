"""The runtime backend that settings choose; built once per process."""

from __future__ import annotations

from functools import cache

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from runtime.backends.base import Backend
from runtime.inventory import load_pool


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
        )
    raise ValueError(f"POLYCHIP_BACKEND={settings.POLYCHIP_BACKEND!r} is not available yet; set POLYCHIP_BACKEND=local")
