"""Celery tasks of the billing app: thin, idempotent, safe to run twice or to die half-way.

Each is named explicitly (the names beat's schedule uses) and retries only the transient errors of
``controlplane.celery.TRANSIENT_ERRORS``; the frequent periodic ones do not retry at all: beat sends the
next run within seconds, and a run that dies half-way leaves nothing for it to undo.
"""

from __future__ import annotations

from celery import shared_task

from billing import services
from controlplane.celery import RETRY_POLICY, TRANSIENT_ERRORS

# Celery ships no type annotations, so mypy --strict calls shared_task an untyped decorator: each use below
# carries a `type: ignore[untyped-decorator]` for that alone (the tasks' own signatures are typed).


@shared_task(name="billing.tasks.relay_usage", ignore_result=True)  # type: ignore[untyped-decorator]  # beat: every POLYCHIP_RELAY_SECONDS
def relay_usage() -> int:
    """Post the usage outbox to the ledger. Killed at any point, the next run posts what is left."""
    return services.relay_usage()


@shared_task(name="billing.tasks.run_invoices", ignore_result=True, autoretry_for=TRANSIENT_ERRORS, **RETRY_POLICY)  # type: ignore[untyped-decorator]
def run_invoices(period: str, finalize: bool = False) -> int:
    return len(services.run_invoices(services.parse_period(period), finalize=finalize))


@shared_task(  # type: ignore[untyped-decorator]
    name="billing.tasks.invoice_cycle", ignore_result=True, autoretry_for=TRANSIENT_ERRORS, **RETRY_POLICY
)  # beat: hourly, so a transient error is retried rather than left for an hour
def invoice_cycle() -> dict[str, int]:
    """Refresh this month's drafts; finalize last month's once its finalize day has come."""
    return services.invoice_cycle()


@shared_task(name="billing.tasks.check_budgets", ignore_result=True)  # type: ignore[untyped-decorator]  # beat: every 30 s
def check_budgets() -> int:
    """Raise each budget alert once per period, devices held now included; returns tenants checked."""
    return len(services.check_budgets_now())
