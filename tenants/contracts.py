"""What leaves the tenants app: plain frozen dataclasses."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import NamedTuple


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


@dataclass(frozen=True)
class MemberRef:
    """Which tenant a user acts for, and in what role."""

    tenant: TenantRef
    role: str


@dataclass(frozen=True)
class TokenView:
    """A token as its tenant may see it: never the secret, never its digest."""

    id: int
    name: str
    prefix: str
    scopes: tuple[str, ...]
    user: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None


@dataclass(frozen=True)
class NewToken:
    """A token just created through the API; ``secret`` is shown this once."""

    token: TokenView
    secret: str


@dataclass(frozen=True)
class QuotaView:
    resource: str
    nominal: Decimal
    borrowing_limit: Decimal | None  # None: as much as the cohort can lend
    lending_limit: Decimal | None  # None: all unused nominal
    updated_at: datetime | None = None


@dataclass(frozen=True)
class CohortView:
    id: int
    name: str
    description: str
    created_at: datetime
    tenants: tuple[str, ...]  # member slugs, sorted


@dataclass(frozen=True)
class TenantView:
    id: int
    slug: str
    name: str
    cohort: str | None
    cohort_id: int | None
    fair_share_weight: Decimal
    created_at: datetime
    quotas: tuple[QuotaView, ...]
    max_queued_jobs: int | None = None  # None: the cloud's default (POLYCHIP_MAX_QUEUED_JOBS)


class QuotaLimits(NamedTuple):
    """One resource's quota for admission: (nominal, borrowing_limit, lending_limit).

    A None limit keeps the model's meaning: no borrowing limit (as much as the cohort can lend),
    no lending limit (all unused nominal).
    """

    nominal: Decimal
    borrowing_limit: Decimal | None
    lending_limit: Decimal | None


@dataclass(frozen=True)
class TenantQuotaView:
    """What the admission loop needs of one tenant (see ``services.quotas_for_admission``)."""

    id: int
    slug: str
    cohort: str | None
    weight: Decimal
    quotas: Mapping[str, QuotaLimits]  # resource (flavor name or "nau") → limits
