"""Celery tasks of the billing app: thin, idempotent, safe to run twice or to die half-way."""

from __future__ import annotations

from celery import shared_task

from billing import services


@shared_task(ignore_result=True)
def relay_usage() -> int:
    """Post the usage outbox to the ledger. Killed at any point, the next run posts what is left."""
    return services.relay_usage()


@shared_task(ignore_result=True)
def run_invoices(period: str, finalize: bool = False) -> int:
    return len(services.run_invoices(services.parse_period(period), finalize=finalize))


@shared_task(ignore_result=True)
def invoice_cycle() -> dict[str, int]:
    """Refresh this month's drafts; finalize last month's once its finalize day has come."""
    return services.invoice_cycle()
