"""Billing's series for /metrics, made here because billing/ holds no float (money is Decimal there):
the relay's backlog and each tenant's month.

- ``polychip_usage_outbox_rows`` and ``polychip_usage_outbox_oldest_age_seconds``: usage records the
  relay has yet to post to the ledger, and how long the oldest has waited (the relay's lag);
- ``polychip_tenant_spend``, ``polychip_tenant_budget{kind="soft"|"hard"}``: the month's spend so far
  (its usage rated with the tenant's book, as budgets rate it) against its budgets, in the book's currency.

Spend is rated per tenant, which costs a query or two each; it changes only as usage comes in, so it is
rated at most every ``SPEND_TTL_S`` seconds per process and served from memory in between.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime

from prometheus_client.core import GaugeMetricFamily, Metric

from billing import services as billing
from billing.contracts import BudgetStatus

SPEND_TTL_S = 30.0
_spend_lock = threading.Lock()
_spend: tuple[float, list[BudgetStatus]] = (0.0, [])


def _statuses(tenant_ids: list[int], now: datetime) -> list[BudgetStatus]:
    global _spend
    with _spend_lock:
        at, statuses = _spend
        if time.monotonic() - at > SPEND_TTL_S or [s.tenant_id for s in statuses] != tenant_ids:
            statuses = [billing.budget_status(tenant_id, now=now) for tenant_id in tenant_ids]
            _spend = (time.monotonic(), statuses)
        return statuses


def families(tenant: Callable[[int], str], tenants: Mapping[int, str], now: datetime) -> Iterator[Metric]:
    waiting, oldest = billing.outbox_state()
    rows = GaugeMetricFamily("polychip_usage_outbox_rows", "Usage records waiting for the relay")
    rows.add_metric([], waiting)
    lag = GaugeMetricFamily(
        "polychip_usage_outbox_oldest_age_seconds", "How long the oldest usage record has waited for the relay"
    )
    lag.add_metric([], max(0.0, (now - oldest).total_seconds()) if oldest else 0.0)
    yield rows
    yield lag

    spend = GaugeMetricFamily(
        "polychip_tenant_spend",
        "This month's spend so far, rated with the tenant's book",
        labels=["tenant", "currency"],
    )
    budget = GaugeMetricFamily("polychip_tenant_budget", "This month's budget", labels=["tenant", "currency", "kind"])
    for status in _statuses(sorted(tenants), now):
        slug = tenant(status.tenant_id)
        spend.add_metric([slug, status.currency], float(status.spend))
        for kind, amount in (("soft", status.soft_budget), ("hard", status.hard_budget)):
            if amount is not None:
                budget.add_metric([slug, status.currency, kind], float(amount))
    yield spend
    yield budget
