"""The runtime backend that settings choose; built once per process."""

from __future__ import annotations

from functools import cache

from django.conf import settings

from runtime.backends.base import Backend
from runtime.inventory import load_pool


@cache
def get_backend() -> Backend:
    if settings.POLYCHIP_BACKEND == "local":
        from runtime.backends.local import LocalBackend

        pool = load_pool(settings.POLYCHIP_POOL_FILE)
        return LocalBackend(
            runs_dir=settings.POLYCHIP_RUNS_DIR,
            profiles=pool.local_profiles,
            sample_time_ms=settings.POLYCHIP_LOCAL_SAMPLE_TIME_MS,
        )
    raise ValueError(f"POLYCHIP_BACKEND={settings.POLYCHIP_BACKEND!r} is not available yet; set POLYCHIP_BACKEND=local")
