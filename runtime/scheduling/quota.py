"""Quota arithmetic over tenants and cohorts, as Kueue does it for ClusterQueues: exact, in integers.

For a tenant t and a resource r that t has a ``Limit`` for:

- ``lendable`` = the lending limit (clamped to nominal), or all of nominal; ``guaranteed`` = nominal - lendable;
- the cohort's capacity for r is the sum of its members' lendable amounts;
- the cohort's usage for r is the sum over members of max(0, usage - guaranteed): what a tenant uses inside
  its guaranteed part never touches the cohort's pool;
- a demand fits when, for every limited resource, the tenant stays within nominal + borrowing limit and the
  cohort's usage stays within its capacity.

A tenant without a cohort is a cohort of one, so it can use up to its nominal quota and no more. A flavor
that a tenant has no ``Limit`` for is governed by its NAU limit alone; with neither, the tenant may not use
that flavor. Resources without a ``Limit`` are not checked.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field

from runtime.scheduling.model import MILLI, NAU, AdmittedJob, Limit, Snapshot, TenantQuota

__all__ = ["QuotaLedger", "demand_for", "format_amount"]


def demand_for(
    job_class: str, flavor_counts: Mapping[str, int], nau_rates: Mapping[tuple[str, str], int]
) -> dict[str, int]:
    """What a placement charges: devices per flavor, plus milli-NAU summed over the devices.

    A (job class, flavor) pair missing from ``nau_rates`` is charged 1 NAU per device.
    """
    demand: dict[str, int] = {}
    nau = 0
    for flavor, count in flavor_counts.items():
        if count <= 0:
            continue
        demand[flavor] = demand.get(flavor, 0) + count
        nau += count * nau_rates.get((job_class, flavor), MILLI)
    demand[NAU] = nau
    return demand


def format_amount(resource: str, amount: int) -> str:
    """``12500`` milli-NAU reads ``12.500``; devices read as themselves."""
    if resource != NAU:
        return str(amount)
    return _milli(amount)


def _milli(amount: int) -> str:
    sign = "-" if amount < 0 else ""
    whole, milli = divmod(abs(amount), MILLI)
    return f"{sign}{whole}.{milli:03d}"


def _plain(amount: int) -> str:
    return str(amount)


def _unit(resource: str) -> str:
    return "NAU" if resource == NAU else resource


@dataclass(eq=False)
class _Cohort:
    name: str | None
    capacity: dict[str, int] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=dict)


@dataclass(eq=False)
class _Account:
    tenant_id: int
    limits: Mapping[str, Limit]
    cohort: _Cohort
    guaranteed: dict[str, int]
    usage: dict[str, int] = field(default_factory=dict)


def _lendable(limit: Limit) -> int:
    nominal = max(0, limit.nominal)
    if limit.lending_limit is None:
        return nominal
    return max(0, min(nominal, limit.lending_limit))


class QuotaLedger:
    """Usage per tenant and cohort, and whether a demand fits. Mutable; every operation is O(resources)."""

    def __init__(self, tenants: Mapping[int, TenantQuota], admitted: Iterable[AdmittedJob] = ()) -> None:
        self._accounts: dict[int, _Account] = {}
        self._cohorts: dict[str, _Cohort] = {}
        for tenant_id in sorted(tenants):
            quota = tenants[tenant_id]
            if quota.cohort is None:
                cohort = _Cohort(name=None)
            else:
                cohort = self._cohorts.setdefault(quota.cohort, _Cohort(name=quota.cohort))
            guaranteed = {}
            for resource, limit in quota.limits.items():
                lendable = _lendable(limit)
                guaranteed[resource] = max(0, limit.nominal) - lendable
                cohort.capacity[resource] = cohort.capacity.get(resource, 0) + lendable
            self._accounts[tenant_id] = _Account(tenant_id, quota.limits, cohort, guaranteed)
        for job in admitted:
            self.add(job.tenant_id, job.demand)

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> QuotaLedger:
        return cls(snapshot.tenants, snapshot.admitted)

    # --- state -----------------------------------------------------------------------------------------

    def _account(self, tenant_id: int) -> _Account:
        account = self._accounts.get(tenant_id)
        if account is None:  # not a known tenant: no quota at all, a cohort of its own
            account = _Account(tenant_id, {}, _Cohort(name=None), {})
            self._accounts[tenant_id] = account
        return account

    def add(self, tenant_id: int, demand: Mapping[str, int]) -> None:
        self._change(self._account(tenant_id), demand, +1)

    def remove(self, tenant_id: int, demand: Mapping[str, int]) -> None:
        account = self._account(tenant_id)
        for resource, amount in demand.items():
            if amount > account.usage.get(resource, 0):
                raise ValueError(
                    f"tenant {tenant_id} releases {format_amount(resource, amount)} {_unit(resource)} "
                    f"but uses only {format_amount(resource, account.usage.get(resource, 0))}"
                )
        self._change(account, demand, -1)

    def _change(self, account: _Account, demand: Mapping[str, int], sign: int) -> None:
        cohort = account.cohort
        for resource, amount in demand.items():
            if not amount:
                continue
            before = account.usage.get(resource, 0)
            after = before + sign * amount
            account.usage[resource] = after
            if resource in account.limits:
                g = account.guaranteed[resource]
                cohort.usage[resource] = cohort.usage.get(resource, 0) + max(0, after - g) - max(0, before - g)

    def usage(self, tenant_id: int) -> Mapping[str, int]:
        return self._account(tenant_id).usage

    def limits(self, tenant_id: int) -> Mapping[str, Limit]:
        return self._account(tenant_id).limits

    def cohort_key(self, tenant_id: int) -> Hashable:
        """Equal for tenants that share a cohort (a tenant without one is alone in its own)."""
        cohort = self._account(tenant_id).cohort
        return cohort.name if cohort.name is not None else (None, tenant_id)

    def lendable_free(self, cohort: str, resource: str) -> int:
        """What the named cohort can still lend of ``resource`` (capacity minus usage, at least 0)."""
        state = self._cohorts.get(cohort)
        if state is None:
            return 0
        return max(0, state.capacity.get(resource, 0) - state.usage.get(resource, 0))

    def cohort_usage(self, cohort: str, resource: str) -> tuple[int, int]:
        """(usage, capacity) of the named cohort's pool for ``resource``."""
        state = self._cohorts.get(cohort)
        if state is None:
            return 0, 0
        return state.usage.get(resource, 0), state.capacity.get(resource, 0)

    # --- questions -------------------------------------------------------------------------------------

    def has_quota(self, tenant_id: int, flavor: str) -> bool:
        """Whether the tenant may use ``flavor`` at all (its own limit, or a NAU limit)."""
        limits = self._account(tenant_id).limits
        return flavor in limits or NAU in limits

    def headroom(
        self,
        tenant_id: int,
        resource: str,
        *,
        within_nominal: bool = False,
        released: int = 0,
        relief: int = 0,
    ) -> int | None:
        """The most of ``resource`` that the tenant could add now; None = not limited.

        ``within_nominal`` caps it at what keeps the tenant within its nominal quota. ``released`` and ``relief``
        answer as if the tenant had first given back ``released`` of it and the cohort's pool usage had first
        dropped by ``relief`` (see ``relief``), without changing anything.
        """
        account = self._account(tenant_id)
        limit = account.limits.get(resource)
        if limit is None:
            if resource == NAU or NAU in account.limits:
                return None
            return 0
        usage = account.usage.get(resource, 0) - released
        cohort = account.cohort
        cohort_usage = cohort.usage.get(resource, 0) - relief
        room = max(0, account.guaranteed[resource] - usage) + max(0, cohort.capacity.get(resource, 0) - cohort_usage)
        if limit.borrowing_limit is not None:
            room = min(room, limit.nominal + limit.borrowing_limit - usage)
        if within_nominal:
            room = min(room, limit.nominal - usage)
        return max(0, room)

    def relief(self, tenant_id: int, released: Mapping[str, int]) -> dict[str, int]:
        """How much the cohort's pool usage would drop, per resource, if the tenant gave ``released`` back.

        Additive over tenants: each member's share of the pool depends on its own usage alone.
        """
        account = self._account(tenant_id)
        drop: dict[str, int] = {}
        for resource, amount in released.items():
            if resource in account.limits and amount:
                g = account.guaranteed[resource]
                held = account.usage.get(resource, 0)
                drop[resource] = max(0, held - g) - max(0, held - amount - g)
        return drop

    def fits(self, tenant_id: int, demand: Mapping[str, int]) -> str | None:
        """None when the demand fits the tenant's quota now, else why not (readable, specific)."""
        for resource, amount in demand.items():
            if amount <= 0:
                continue
            room = self.headroom(tenant_id, resource)
            if room is None or amount <= room:
                continue
            return self.refusal(tenant_id, resource, amount)
        return None

    def refusal(self, tenant_id: int, resource: str, amount: int) -> str:
        """Why ``amount`` of ``resource`` does not fit now (for an amount above its headroom)."""
        account = self._account(tenant_id)
        limit = account.limits.get(resource)
        if limit is None:
            return f"no quota for {resource}; ask an operator"
        return self._refusal(account, resource, amount, limit)

    def _refusal(self, account: _Account, resource: str, amount: int, limit: Limit) -> str:
        unit = _unit(resource)
        usage = account.usage.get(resource, 0)
        nominal = limit.nominal
        cohort = account.cohort

        show = _milli if resource == NAU else _plain

        def limit_terms() -> str:
            return f"nominal {show(nominal)} + borrowing limit {show(limit.borrowing_limit or 0)}"

        # The most the tenant could ever hold: capped by its borrowing limit and by all that its cohort can lend.
        by_cohort = account.guaranteed[resource] + cohort.capacity.get(resource, 0)
        by_limit = None if limit.borrowing_limit is None else nominal + limit.borrowing_limit
        if amount > min(by_cohort, by_limit if by_limit is not None else by_cohort):
            if by_limit is not None and by_limit <= by_cohort:
                ceiling, terms = by_limit, limit_terms()
            elif cohort.name is None:
                ceiling, terms = by_cohort, f"nominal {show(nominal)}; no cohort to borrow from"
            else:
                ceiling = by_cohort
                terms = f"nominal {show(nominal)} + at most {show(by_cohort - nominal)} lent by cohort {cohort.name}"
            return f"needs {show(amount)} {unit} but your tenant may hold at most {show(ceiling)} ({terms})"
        if by_limit is not None and usage + amount > by_limit:
            return (
                f"would exceed the borrowing limit for {unit} ({limit_terms()}); "
                f"{show(usage)} in use by your tenant, this job needs {show(amount)}"
            )
        if cohort.name is None:
            return (
                f"waiting: {show(usage)} of {show(nominal)} {unit} in use by your tenant; no cohort to borrow from; "
                f"this job needs {show(amount)}"
            )
        # What the pool leaves this tenant, split into its own unused nominal and what others lend.
        available = max(0, account.guaranteed[resource] - usage) + max(
            0, cohort.capacity.get(resource, 0) - cohort.usage.get(resource, 0)
        )
        unused = max(0, nominal - usage)
        lent_out = f" ({show(unused - available)} lent to others)" if available < unused else ""
        to_lend = f"{show(max(0, available - unused))}{' NAU' if resource == NAU else ''}"
        return (
            f"waiting: {show(usage)} of {show(nominal)} {unit} in use by your tenant{lent_out}; "
            f"cohort has {to_lend} to lend; this job needs {show(amount)}"
        )

    def nominal_room(self, tenant_id: int, resource: str) -> int | None:
        """What the tenant may still add of ``resource`` within its own nominal quota, whatever the cohort
        has free; None = not limited (as ``headroom`` says it)."""
        account = self._account(tenant_id)
        limit = account.limits.get(resource)
        if limit is None:
            return None if resource == NAU or NAU in account.limits else 0
        return max(0, limit.nominal - account.usage.get(resource, 0))

    def would_borrow(self, tenant_id: int, demand: Mapping[str, int]) -> bool:
        """Whether adding the demand takes the tenant above nominal for some limited resource."""
        account = self._account(tenant_id)
        for resource, amount in demand.items():
            limit = account.limits.get(resource)
            if limit is not None and amount > 0 and account.usage.get(resource, 0) + amount > limit.nominal:
                return True
        return False

    def within_nominal(self, tenant_id: int, demand: Mapping[str, int]) -> bool:
        return not self.would_borrow(tenant_id, demand)

    def is_borrowing(
        self, tenant_id: int, resources: Iterable[str] | None = None, released: Mapping[str, int] | None = None
    ) -> bool:
        """Whether the tenant uses more than nominal now, for some of ``resources`` (default: any).

        ``released``: as if it had given that back first.
        """
        account = self._account(tenant_id)
        names = account.limits if resources is None else resources
        for resource in names:
            limit = account.limits.get(resource)
            if limit is None:
                continue
            held = account.usage.get(resource, 0) - (released.get(resource, 0) if released else 0)
            if held > limit.nominal:
                return True
        return False
