"""What leaves the tenants app: plain frozen dataclasses."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TenantRef:
    id: int
    slug: str
    name: str


@dataclass(frozen=True)
class IssuedToken:
    """A freshly issued token. ``secret`` exists only here and is never stored."""

    id: int
    tenant: TenantRef
    name: str
    secret: str
