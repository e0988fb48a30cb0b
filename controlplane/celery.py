"""The Celery app; tasks live in each app's ``tasks.py`` and take ids, never objects.

Every task carries an explicit ``name`` (the name beat and ``send_task`` use; today's are the module
paths, e.g. ``billing.tasks.relay_usage``) and retries only ``TRANSIENT_ERRORS``, e.g.::

    @shared_task(name="billing.tasks.invoice_cycle", autoretry_for=TRANSIENT_ERRORS, **RETRY_POLICY)

A periodic task that beat sends again within seconds needs no retry: its next run is the retry.
"""

import gc
import os
from typing import Any, Final

from celery import Celery
from celery.signals import (
    beat_init,
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)
from django.db.utils import InterfaceError, OperationalError
from kombu.exceptions import OperationalError as BrokerOperationalError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

# What is worth retrying a task for: the database or the broker (or the channel layer's Redis) was away
# for a moment: a restart, a failover, a dropped connection, or a serialization failure or deadlock,
# which PostgreSQL reports as an OperationalError. Anything else is a bug or a refusal, and a retry would
# only repeat it.
TRANSIENT_ERRORS: Final[tuple[type[Exception], ...]] = (
    OperationalError,
    InterfaceError,
    BrokerOperationalError,
    RedisConnectionError,
    RedisTimeoutError,
)
# Waits of about 1, 2, 4, 8, 16 s (full jitter), then the task fails as it would have without retries.
RETRY_POLICY: Final[dict[str, Any]] = {"retry_backoff": True, "retry_backoff_max": 60, "max_retries": 5}

app = Celery("polychip")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_init.connect
@beat_init.connect
def _refuse_demo_accounts(**_: Any) -> None:
    # Imported here: Django is set up only once the worker starts.
    from django.core.exceptions import ImproperlyConfigured

    from controlplane.production import refuse_demo_accounts

    try:
        refuse_demo_accounts()
    except ImproperlyConfigured as refusal:
        # Celery logs and swallows a signal handler's exceptions; SystemExit is not one of them.
        raise SystemExit(str(refusal)) from None


@worker_init.connect
def _count_tasks(**_: Any) -> None:
    """Task counts and runtimes for /metrics, from workers only (controlplane.taskstats)."""
    from controlplane import taskstats

    taskstats.connect_signals()


@worker_process_init.connect
def _keep_database_connections(**_: Any) -> None:
    """Each worker process keeps its connections between tasks (settings.POLYCHIP_WORKER_DB_CONN_MAX_AGE):
    the web server's settings (a connection per request) are not a worker's."""
    from django.conf import settings
    from django.db import connections

    if settings.POLYCHIP_WORKER_DB_CONN_MAX_AGE:
        for connection in connections.all():
            if connection.settings_dict.get("OPTIONS", {}).get("pool"):
                continue  # a pool keeps connections itself (and refuses a maximum age)
            connection.settings_dict["CONN_MAX_AGE"] = settings.POLYCHIP_WORKER_DB_CONN_MAX_AGE
            connection.settings_dict["CONN_HEALTH_CHECKS"] = True


def freeze_loaded_objects() -> None:
    """Move every object alive now (Django, the models, the tasks: hundreds of thousands) out of the
    cyclic garbage collector's sight. They live as long as the process, yet every collection of the
    oldest generation walked them all: an admission request took 16.5 ms of CPU with them in sight
    and 11.4 ms without, measured. What is allocated later is still collected."""
    gc.collect()
    gc.freeze()


@worker_init.connect
def _freeze_before_forking(**_: Any) -> None:
    # In the main process, before the pool forks its processes: frozen objects are never walked
    # again, so the children do not copy the pages they share with it (gc's own advice for forks).
    freeze_loaded_objects()


@worker_process_init.connect
def _freeze_what_the_child_holds(**_: Any) -> None:
    # What the main process made between freezing and forking; no collection, which would walk
    # (and so copy) every page the child shares with the main process.
    gc.freeze()


@task_prerun.connect
@task_postrun.connect
def _drop_broken_or_old_connections(sender: Any = None, **_: Any) -> None:
    """Around each task, as Django does around each request: a kept connection that broke (a
    database restart, a failover) or outlived its age is closed, and the next query opens a new one.
    Not around a task run eagerly: it runs inside its caller, maybe in the caller's transaction."""
    from django.db import close_old_connections

    if not getattr(getattr(sender, "request", None), "is_eager", False):
        close_old_connections()


@worker_ready.connect
def _start_worker_heartbeat(sender: Any = None, **_: Any) -> None:
    from controlplane import taskstats

    taskstats.start_heartbeat(str(getattr(sender, "hostname", "") or "celery"))


@worker_process_shutdown.connect
@worker_shutdown.connect
def _flush_task_counts(**_: Any) -> None:
    from controlplane import taskstats

    taskstats.on_shutdown()


@task_prerun.connect
def _bind_task(sender: Any = None, task_id: str = "", args: Any = None, **_: Any) -> None:
    """Each task's log lines carry its name, and the job when the task works on one (its first argument)."""
    from controlplane import logs, taskstats

    taskstats.on_prerun(task_id)

    logs.clear()
    first = args[0] if args else None
    job = first if isinstance(first, int) and str(getattr(sender, "name", "")).startswith("jobs.") else None
    logs.bind(task=getattr(sender, "name", ""), **({"job": job} if job is not None else {}))


@task_postrun.connect
def _unbind_task(sender: Any = None, task_id: str = "", state: str | None = None, **_: Any) -> None:
    from controlplane import logs, taskstats

    taskstats.on_postrun(sender, task_id, state)
    logs.clear()
