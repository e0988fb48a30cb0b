"""Enqueueing the app's Celery tasks by name, once the caller's transaction commits.

Tasks import the services facade, which imports everything below it; by sending tasks by name the
layers below never import ``jobs.tasks``, so there is no import circle to dodge. ``robust``: a
broker hiccup must not turn a committed change into an error (the beat sweep finds the work anyway).
"""

from __future__ import annotations

import functools
from typing import Any

from django.db import transaction

from controlplane.celery import app

ADMIT = "jobs.tasks.admit_queued_jobs"
PROVISION = "jobs.tasks.provision_job"
TEARDOWN = "jobs.tasks.teardown_job"


def send(task_name: str, *args: Any) -> None:
    """Enqueue now."""
    app.send_task(task_name, args=args)


def send_each(task_name: str, args_list: list[tuple[Any, ...]]) -> None:
    """Enqueue one task per args, through one producer (one broker connection for them all)."""
    with app.producer_or_acquire() as producer:
        for args in args_list:
            app.send_task(task_name, args=args, producer=producer)


def after_commit(task_name: str, *args: Any) -> None:
    """Enqueue once the current transaction commits (at once outside one)."""
    transaction.on_commit(functools.partial(send, task_name, *args), robust=True)


def after_commit_each(task_name: str, args_list: list[tuple[Any, ...]]) -> None:
    """``after_commit`` for many tasks of one name: an admission cycle provisions a thousand jobs."""
    if args_list:
        transaction.on_commit(functools.partial(send_each, task_name, args_list), robust=True)
