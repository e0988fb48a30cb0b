"""Quota arithmetic: pure checks over plain values, no database.

A quota is Kueue's: a nominal amount of one resource, a borrowing limit (None: borrow as much as the
cohort can lend) and a lending limit (None: lend all of the nominal that is unused). A flavor is
counted in whole devices; NAU (normalized accelerator units) may have up to three decimals.

What a cohort can lend a member is the sum of what its other members can lend:
``lendable = lending_limit if set else nominal``. A borrowing limit above that promises capacity
that does not exist, so it is refused; a tenant outside any cohort has nothing to borrow.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal

from runtime.errors import FieldError
from tenants.models import NAU_RESOURCE

NAU_PLACES = 3
MAX_AMOUNT = Decimal("999999999.999")  # the columns hold 12 digits, 3 of them decimals
AMOUNT_FIELDS = ("nominal", "borrowing_limit", "lending_limit")


class QuotaRuleError(FieldError):
    """A quota that breaks a rule; ``field`` is relative to the quota (``nominal``, ``resource``)."""


@dataclass(frozen=True)
class QuotaSpec:
    resource: str
    nominal: Decimal
    borrowing_limit: Decimal | None = None
    lending_limit: Decimal | None = None

    @property
    def lendable(self) -> Decimal:
        return self.lending_limit if self.lending_limit is not None else self.nominal


@dataclass(frozen=True)
class BorrowingExcess:
    """A member that may borrow more of a resource than the rest of its cohort can lend."""

    tenant_id: int
    resource: str
    borrowing_limit: Decimal
    available: Decimal


def amount_text(value: Decimal) -> str:
    """``4.000`` → ``4``, ``2.500`` → ``2.5``: how amounts are written in messages and JSON."""
    text = format(value.normalize(), "f")
    return "0" if text in ("-0", "") else text


def check_quota(spec: QuotaSpec, known_flavors: Collection[str]) -> None:
    """Raise QuotaRuleError for the first rule that ``spec`` breaks."""
    if spec.resource != NAU_RESOURCE and spec.resource not in known_flavors:
        listed = ", ".join(sorted(known_flavors)) or "none are registered yet"
        raise QuotaRuleError(
            "resource",
            f"unknown resource {spec.resource!r}: use {NAU_RESOURCE!r} or a flavor of the pool ({listed})",
        )
    for name in AMOUNT_FIELDS:
        value: Decimal | None = getattr(spec, name)
        if value is None:
            if name == "nominal":
                raise QuotaRuleError(name, "is required")
            continue
        if not value.is_finite():
            raise QuotaRuleError(name, f"must be a number, got {value}")
        if value < 0:
            raise QuotaRuleError(name, f"must not be negative, got {amount_text(value)}")
        if value > MAX_AMOUNT:
            raise QuotaRuleError(name, f"must be at most {MAX_AMOUNT}, got {amount_text(value)}")
        if spec.resource == NAU_RESOURCE:
            if value != value.quantize(Decimal(1).scaleb(-NAU_PLACES)):
                raise QuotaRuleError(name, f"NAU take at most {NAU_PLACES} decimals, got {value}")
        elif value != value.to_integral_value():
            raise QuotaRuleError(
                name, f"{spec.resource} is counted in whole devices, got {amount_text(value)}: round it"
            )
    if spec.lending_limit is not None and spec.lending_limit > spec.nominal:
        raise QuotaRuleError(
            "lending_limit",
            f"cannot lend more than the nominal {amount_text(spec.nominal)}, got {amount_text(spec.lending_limit)}",
        )


def duplicate_resource(specs: Iterable[QuotaSpec]) -> int | None:
    """The index of the first quota whose resource appeared before it, or None."""
    seen: set[str] = set()
    for index, spec in enumerate(specs):
        if spec.resource in seen:
            return index
        seen.add(spec.resource)
    return None


def lendable_by_others(members: Mapping[int, Mapping[str, QuotaSpec]], tenant_id: int, resource: str) -> Decimal:
    """What the cohort ``members`` (tenant id → resource → quota) other than ``tenant_id`` can lend."""
    return sum(
        (quotas[resource].lendable for other, quotas in members.items() if other != tenant_id and resource in quotas),
        Decimal(0),
    )


def borrowing_excesses(members: Mapping[int, Mapping[str, QuotaSpec]]) -> list[BorrowingExcess]:
    """Every member of one cohort whose borrowing limit exceeds what the others can lend, in order."""
    excesses = []
    for tenant_id in sorted(members):
        for resource in sorted(members[tenant_id]):
            limit = members[tenant_id][resource].borrowing_limit
            if limit is None or limit == 0:
                continue
            available = lendable_by_others(members, tenant_id, resource)
            if limit > available:
                excesses.append(BorrowingExcess(tenant_id, resource, limit, available))
    return excesses


def uncohorted_borrowing(quotas: Mapping[str, QuotaSpec]) -> str | None:
    """For a tenant in no cohort: the first resource with a borrowing limit above zero, or None."""
    for resource in sorted(quotas):
        limit = quotas[resource].borrowing_limit
        if limit is not None and limit > 0:
            return resource
    return None
