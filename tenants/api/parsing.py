"""Request bodies of the tenants API, checked before any service runs: pure, no database.

Each parser takes the decoded JSON and returns plain values, or raises ``InvalidInput`` naming the
field (a dotted path such as ``quotas[1].nominal``). Fields a client may not write (the tenant,
ids, usage, prices, balances) are refused by name, never silently dropped.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django.utils.dateparse import parse_datetime

from tenants.models import Scope
from tenants.quota_rules import QuotaSpec
from tenants.services import InvalidInput

SLUG = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
MAX_NAME = 200
MAX_DESCRIPTION = 500
MAX_TOKEN_NAME = 100
MAX_TOKEN_DAYS = 3650
MAX_WEIGHT = Decimal("999.999")
SCOPES = tuple(s.value for s in Scope)
# Named so that the refusal says why: they are the system's to set, never a client's.
NOT_WRITABLE = frozenset(
    {
        "id",
        "tenant",
        "tenant_id",
        "user",
        "user_id",
        "created_at",
        "updated_at",
        "prefix",
        "secret",
        "digest",
        "last_used_at",
        "revoked_at",
        "usage",
        "used",
        "in_use",
        "borrowed",
        "price",
        "prices",
        "balance",
        "balances",
        "tenants",
    }
)


def _at(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def expect_object(
    data: Any, *, allowed: Collection[str], required: Collection[str] = (), prefix: str = ""
) -> Mapping[str, Any]:
    """``data`` as a JSON object holding only ``allowed`` keys and every ``required`` one."""
    if not isinstance(data, Mapping):
        raise InvalidInput(prefix or "body", f"must be a JSON object, got {type(data).__name__}")
    for key in data:
        if key not in allowed:
            if key in NOT_WRITABLE:
                raise InvalidInput(_at(prefix, str(key)), "cannot be written here; leave it out")
            raise InvalidInput(_at(prefix, str(key)), f"unknown field; the fields are {', '.join(sorted(allowed))}")
    for key in required:
        if key not in data:
            raise InvalidInput(_at(prefix, key), "is required")
    return data


def text(value: Any, field: str, *, max_length: int, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise InvalidInput(field, f"must be a string, got {type(value).__name__}")
    value = value.strip()
    if not value and not allow_empty:
        raise InvalidInput(field, "must not be empty")
    if len(value) > max_length:
        raise InvalidInput(field, f"must be at most {max_length} characters, got {len(value)}")
    return value


def slug(value: Any, field: str) -> str:
    if not isinstance(value, str) or not SLUG.match(value):
        raise InvalidInput(
            field, f"must be 1-63 lowercase letters, digits and inner hyphens (like 'ml-research'), got {value!r}"
        )
    return value


def amount(value: Any, field: str) -> Decimal:
    """A number as a JSON number or a decimal string (``2``, ``2.5``, ``"2.5"``), exactly."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidInput(field, f"must be a number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidInput(field, f"must be a finite number, got {value!r}")
    try:
        # Through str, so that 0.1 is 0.1 and not the binary float's expansion.
        number = Decimal(str(value).strip())
    except InvalidOperation:
        raise InvalidInput(field, f"must be a number, got {value!r}") from None
    if not number.is_finite():
        raise InvalidInput(field, f"must be a finite number, got {value!r}")
    return number


def weight(value: Any, field: str = "fair_share_weight") -> Decimal:
    number = amount(value, field)
    if number <= 0 or number > MAX_WEIGHT:
        raise InvalidInput(field, f"must be above 0 and at most {MAX_WEIGHT}, got {value!r}")
    if number != number.quantize(Decimal("0.001")):
        raise InvalidInput(field, f"takes at most 3 decimals, got {value!r}")
    return number


# --- quotas ------------------------------------------------------------------------------------

QUOTA_FIELDS = ("resource", "nominal", "borrowing_limit", "lending_limit")


def quota(data: Any, *, prefix: str = "", resource: str | None = None) -> QuotaSpec:
    """One quota. With ``resource`` (from the URL) the body may omit it, or must repeat it exactly."""
    required = ("nominal",) if resource is not None else ("resource", "nominal")
    raw = expect_object(data, allowed=QUOTA_FIELDS, required=required, prefix=prefix)
    if resource is not None:
        if "resource" in raw and raw["resource"] != resource:
            raise InvalidInput(_at(prefix, "resource"), f"the URL names {resource!r}; leave it out or repeat it")
        name = resource
    else:
        name = raw["resource"]
        if not isinstance(name, str) or not name.strip():
            raise InvalidInput(_at(prefix, "resource"), f"must be 'nau' or a flavor name, got {name!r}")
        name = name.strip()
    limits: dict[str, Decimal | None] = {}
    for key in ("borrowing_limit", "lending_limit"):
        value = raw.get(key)
        limits[key] = None if value is None else amount(value, _at(prefix, key))
    nominal_raw = raw["nominal"]
    if nominal_raw is None:
        raise InvalidInput(_at(prefix, "nominal"), "is required (a number, 0 for none)")
    return QuotaSpec(
        resource=name,
        nominal=amount(nominal_raw, _at(prefix, "nominal")),
        borrowing_limit=limits["borrowing_limit"],
        lending_limit=limits["lending_limit"],
    )


def quota_set(data: Any) -> list[QuotaSpec]:
    """``{"quotas": [...]}`` (or the bare list): the tenant's whole quota set."""
    items = data if isinstance(data, list) else expect_object(data, allowed=("quotas",), required=("quotas",))["quotas"]
    if not isinstance(items, list):
        raise InvalidInput("quotas", f"must be a list of quotas, got {type(items).__name__}")
    return [quota(item, prefix=f"quotas[{i}]") for i, item in enumerate(items)]


# --- tokens ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenRequest:
    name: str
    scopes: tuple[str, ...]
    expires_at: datetime | None


def token_request(data: Any, *, now: datetime) -> TokenRequest:
    raw = expect_object(data, allowed=("name", "scopes", "expires_in_days", "expires_at"), required=("name", "scopes"))
    name = text(raw["name"], "name", max_length=MAX_TOKEN_NAME)
    scopes = raw["scopes"]
    if not isinstance(scopes, list) or not scopes:
        raise InvalidInput("scopes", f"must be a non-empty list drawn from {', '.join(SCOPES)}")
    for i, scope in enumerate(scopes):
        if scope not in SCOPES:
            raise InvalidInput(f"scopes[{i}]", f"unknown scope {scope!r}; the scopes are {', '.join(SCOPES)}")
    expires_at: datetime | None = None
    if raw.get("expires_in_days") is not None and raw.get("expires_at") is not None:
        raise InvalidInput("expires_at", "give expires_in_days or expires_at, not both")
    days = raw.get("expires_in_days")
    if days is not None:
        if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_TOKEN_DAYS:
            raise InvalidInput("expires_in_days", f"must be a whole number from 1 to {MAX_TOKEN_DAYS}, got {days!r}")
        expires_at = now + timedelta(days=days)
    at = raw.get("expires_at")
    if at is not None:
        parsed = parse_datetime(at) if isinstance(at, str) else None
        if parsed is None:
            raise InvalidInput("expires_at", f"must be an ISO 8601 time like 2027-01-31T00:00:00Z, got {at!r}")
        if parsed.tzinfo is None:
            raise InvalidInput("expires_at", "needs a time zone, e.g. a trailing Z for UTC")
        if parsed <= now:
            raise InvalidInput("expires_at", "must be in the future")
        if parsed > now + timedelta(days=MAX_TOKEN_DAYS):
            raise InvalidInput(
                "expires_at", f"must be within {MAX_TOKEN_DAYS} days from now (the longest a token lives), got {at!r}"
            )
        expires_at = parsed
    return TokenRequest(name=name, scopes=tuple(dict.fromkeys(scopes)), expires_at=expires_at)


# --- cohorts and tenants -----------------------------------------------------------------------


def cohort(data: Any, *, partial: bool) -> dict[str, Any]:
    raw = expect_object(data, allowed=("name", "description"), required=() if partial else ("name",))
    out: dict[str, Any] = {}
    if "name" in raw:
        out["name"] = slug(raw["name"], "name")
    if "description" in raw:
        out["description"] = text(raw["description"] or "", "description", max_length=MAX_DESCRIPTION, allow_empty=True)
    return out


def cohort_ref(value: Any, field: str = "cohort") -> int | str | None:
    """A cohort by id or by name; null for none."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str) or (isinstance(value, str) and not value.strip()):
        raise InvalidInput(field, f"must be a cohort id, a cohort name or null, got {value!r}")
    return value.strip() if isinstance(value, str) else value


def tenant(data: Any, *, partial: bool) -> dict[str, Any]:
    editable = ("name", "cohort", "fair_share_weight", "max_queued_jobs")
    allowed = editable if partial else ("slug", *editable)
    if partial and isinstance(data, Mapping) and "slug" in data:
        raise InvalidInput("slug", "a tenant's slug cannot change; create another tenant instead")
    raw = expect_object(data, allowed=allowed, required=() if partial else ("slug", "name"))
    out: dict[str, Any] = {}
    if "slug" in raw:
        out["slug"] = slug(raw["slug"], "slug")
    if "name" in raw:
        out["name"] = text(raw["name"], "name", max_length=MAX_NAME)
    if "cohort" in raw:
        out["cohort"] = cohort_ref(raw["cohort"])
    if "fair_share_weight" in raw:
        out["fair_share_weight"] = weight(raw["fair_share_weight"])
    if "max_queued_jobs" in raw:
        out["max_queued_jobs"] = queued_cap(raw["max_queued_jobs"])
    return out


MAX_QUEUED_CAP = 1_000_000


def queued_cap(value: Any, field: str = "max_queued_jobs") -> int | None:
    """A tenant's cap on waiting jobs: a whole number, or null for the cloud's default."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_QUEUED_CAP:
        raise InvalidInput(field, f"must be a whole number from 0 to {MAX_QUEUED_CAP}, or null for the default")
    return value
