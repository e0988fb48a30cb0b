"""Loaded into the Celery worker that bench/admission.py starts (``celery ... --include bench._admission_worker``).

The worker is the project's own (``polychip up``'s options), and it runs the admission cycles as in
production: each submission's request arrives through the Redis broker. This module only reports,
for the bench's clients, when each cycle committed and which jobs it decided: one Redis list per
job (``bench:decided:ID``), whose first entry is the wall-clock time of the first deciding commit.
It also sends provisioning and teardown to a queue nobody consumes (``UNCONSUMED``): no job runs.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery.signals import worker_process_init

from controlplane.celery import app
from jobs import dispatch

UNCONSUMED = "bench-unconsumed"
READY_KEY = "bench:worker-processes-ready"
# The tasks an admission sends on: they go nowhere (the bench measures deciding, not launching).
ROUTES = {name: {"queue": UNCONSUMED} for name in (dispatch.PROVISION, dispatch.TEARDOWN, dispatch.FAN_OUT)}


def decided_key(job_id: int) -> str:
    return f"bench:decided:{job_id}"


app.conf.task_routes = ROUTES


@worker_process_init.connect
def _listen(**_: Any) -> None:
    """In each worker process (forked, Django set up): report every committed cycle's decisions."""
    from jobs import services

    client = redis.Redis.from_url(os.environ["CELERY_BROKER_URL"])

    def on_cycle(report: Any) -> None:
        now = time.time()
        pipe = client.pipeline(transaction=False)
        for job_id in report.decided:
            pipe.rpush(decided_key(job_id), now)
        pipe.execute()

    services.cycle_listeners.append(on_cycle)
    client.incr(READY_KEY)
