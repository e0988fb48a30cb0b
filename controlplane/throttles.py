"""Request rates the API allows: per API token (or signed-in user), per client address, and per job on
the workers' ingest route. Past a rate the answer is 429 with ``Retry-After`` (DRF's throttling).

Counts live in Django's cache: the per-process memory cache on the embedded default, so each server
process counts on its own; production points ``CACHES`` at Redis (``POLYCHIP_CACHE_URL``) to count
across processes.
"""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle


class PerTokenThrottle(SimpleRateThrottle):
    """One API token (or, in the browser, one signed-in user): a runaway CI loop slows only itself."""

    scope = "token"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        token_id = getattr(getattr(request, "auth", None), "pk", None)
        user = request.user
        if token_id is not None:
            ident = f"token-{token_id}"
        elif user is not None and user.is_authenticated:
            ident = f"user-{user.pk}"
        else:
            return None  # anonymous: the address throttle counts it
        return self.cache_format % {"scope": self.scope, "ident": ident}


class PerAddressThrottle(SimpleRateThrottle):
    """One client address, whoever it signs in as: many tokens from one place share one budget."""

    scope = "address"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


class PerJobIngestThrottle(SimpleRateThrottle):
    """The workers' telemetry route, per job: the ranks of all jobs on a host share its address, so
    the address is not the unit; a job whose workers send far more than heartbeats and steps is."""

    scope = "ingest"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        return self.cache_format % {"scope": self.scope, "ident": f"job-{view.kwargs.get('job_id')}"}
