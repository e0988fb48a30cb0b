"""Billing's series for /metrics, made here because billing/ holds no float (money is Decimal there):
the relay's backlog and each tenant's month.

- ``polychip_usage_outbox_rows`` and ``polychip_usage_outbox_oldest_age_seconds``: usage records the
  relay has yet to post to the ledger, and how long the oldest has waited (the relay's lag);
- ``polychip_tenant_spend``, ``polychip_tenant_budget{kind="soft"|"hard"}``: a budgeted tenant's spend this
  month (its usage, the devices it holds now included, rated with its book) against its budgets, in the
  book's currency, as the budget check (beat, every 30 s) last rated it. Rating every tenant's month in
  the scrape itself took 250 ms at 50 tenants; the check rates them anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime

from prometheus_client.core import GaugeMetricFamily, Metric

from billing import services as billing
from controlplane.monitoring import Tally


def families(tenant: Callable[[int], str], now: datetime) -> Iterator[Metric]:
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
    spend_tally, budget_tally = Tally(), Tally()
    for status in billing.checked_budgets(now=now):
        slug = tenant(status.tenant_id)
        spend_tally.add([slug, status.currency], float(status.spend))
        for kind, amount in (("soft", status.soft_budget), ("hard", status.hard_budget)):
            if amount is not None:
                budget_tally.add([slug, status.currency, kind], float(amount))
    yield spend_tally.into(spend)
    yield budget_tally.into(budget)
