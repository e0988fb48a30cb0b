"""Celery tasks of the tenants app: thin calls into ``tenants.services``."""

from __future__ import annotations

from celery import shared_task

from tenants import services


@shared_task(name="tenants.tasks.purge_idempotency_keys", ignore_result=True)  # beat: hourly
def purge_idempotency_keys() -> int:
    """Forget Idempotency-Keys past their retention; a run that dies leaves them for the next."""
    return services.purge_idempotency_keys()
