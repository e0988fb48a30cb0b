"""Usage that billing cannot see by itself: the devices jobs hold right now, and the milliseconds
their closed allocations held.

Billing may not import ``jobs`` (dependencies point one way), yet a budget counts devices held now,
before any usage record exists, and a reconciliation compares what allocations held with what was
recorded. So the jobs app registers a source here from ``JobsConfig.ready()``, the way it registers
its flavors with tenants. With no source registered, nothing is held and nothing was allocated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from billing.contracts import OpenUsage


@dataclass(frozen=True)
class UsageSource:
    # The devices held now by jobs of these tenants (all tenants for None).
    open_usage: Callable[[Iterable[int] | None], list[OpenUsage]]
    # Milliseconds held by closed allocations per (tenant, flavor), counted as usage records count them.
    allocated_ms: Callable[[], dict[tuple[int, str], int]]


_sources: list[UsageSource] = []


def register_usage_source(source: UsageSource) -> UsageSource:
    """Add a source; registering an equal one twice is a no-op. Returns ``source``."""
    if source not in _sources:
        _sources.append(source)
    return source


def unregister_usage_source(source: UsageSource) -> None:
    if source in _sources:
        _sources.remove(source)


def open_usage(tenant_ids: Iterable[int] | None = None) -> list[OpenUsage]:
    ids = None if tenant_ids is None else list(tenant_ids)
    return [usage for source in _sources for usage in source.open_usage(ids)]


def allocated_ms() -> dict[tuple[int, str], int]:
    totals: dict[tuple[int, str], int] = {}
    for source in _sources:
        for key, ms in source.allocated_ms().items():
            totals[key] = totals.get(key, 0) + ms
    return totals
