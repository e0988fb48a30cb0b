"""Named points of the usage relay's flush, where a crash test can hold the process (test-only).

In production ``POLYCHIP_CRASH_POINTS`` is unset and ``reached`` returns at once: a no-op. The crash
trials (tests/billing_crash.py) give each worker and relay a folder of its own in that variable, so
that every trial kills the process at a stage of the flush chosen in advance, not at a random
instant. To hold the process at the ``skip + 1``-th arrival at a point, the test writes (atomically)
a file named ``arm`` into the folder::

    {"id": "trial-17", "point": "posted", "skip": 2}

The arrival that matches renames ``arm`` to ``held`` (a rename succeeds once, so one arm holds one
process once: a redelivered task runs through) and waits while ``held`` exists. Meanwhile the test
reads the process's state, kills it or cuts its database connection, then deletes ``held``.

The points, in the order a batch reaches them (``billing.services.post_outbox_batch``):
- ``claimed``: outbox rows locked (``FOR UPDATE SKIP LOCKED``), nothing written yet;
- ``posted``: the ledger entries inserted, the outbox rows not yet deleted;
- ``outbox_deleted``: the outbox rows deleted, the transaction not yet committed;
- ``committed``: the batch committed; a Celery task has not returned (nor been acknowledged) yet, a
  relay has not started its next batch.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

ENV = "POLYCHIP_CRASH_POINTS"
POINTS = ("claimed", "posted", "outbox_deleted", "committed")
HOLD_LIMIT_S = 300  # a process whose test went away without releasing it carries on after this

POLL_MS = 2  # how often a held process looks whether it was released (integers: billing/ names no floats)

_arrivals: dict[tuple[str, str], int] = {}


def reached(point: str) -> None:
    """The flush is at ``point``; hold here if a crash test armed it (a no-op unless ``ENV`` is set)."""
    folder = os.environ.get(ENV)
    if folder:
        _hold_if_armed(Path(folder), point)


def _hold_if_armed(folder: Path, point: str) -> None:
    arm = folder / "arm"
    try:
        plan = json.loads(arm.read_text())
    except (OSError, ValueError):
        return
    if plan.get("point") != point:
        return
    key = (str(plan.get("id")), point)
    _arrivals[key] = arrival = _arrivals.get(key, 0) + 1
    if arrival <= int(plan.get("skip", 0)):
        return
    held = folder / "held"
    try:
        arm.rename(held)
    except OSError:  # another process (or arrival) took it
        return
    deadline = time.monotonic() + HOLD_LIMIT_S
    while held.exists() and time.monotonic() < deadline:
        time.sleep(POLL_MS / 1000)
