"""Celery's delivery settings that billing relies on: a task is acknowledged only after it ran, a
worker that dies mid-task hands the message back, and no worker holds messages it has not started."""

from __future__ import annotations

from controlplane.celery import app


def test_tasks_are_acknowledged_late_and_requeued_when_their_worker_dies():
    conf = app.conf
    assert conf.task_acks_late is True
    assert conf.task_reject_on_worker_lost is True
    assert conf.worker_prefetch_multiplier == 1


def test_the_beat_schedule_relays_usage_checks_budgets_and_runs_invoices():
    app.loader.import_default_modules()
    tasks = {entry["task"] for entry in app.conf.beat_schedule.values()}
    assert {"billing.tasks.relay_usage", "billing.tasks.check_budgets", "billing.tasks.invoice_cycle"} <= tasks
    assert tasks <= set(app.tasks)  # every scheduled name is a registered task
