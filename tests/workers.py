"""Services of one pytest-xdist worker: `make test` runs the suite in several processes (gw0, gw1, ...),
and each must have Redis databases and a var folder of its own, as pytest-django gives each a database
of its own (``test_polychip_gw1``). Without that, gw1's live stack would take the Celery tasks that
gw0's stack sent, and one worker's opening flush of the broker (tests/integration/conftest.py) would
drop the other's.

Worker ``gwN`` moves both Redis databases N pairs down (``/14`` and ``/15`` become ``/12`` and ``/13``
for gw1) and puts its var folder under ``<var>/gwN``. The environment records the worker it was moved
for, so that a process a worker starts, which inherits the moved environment, moves nothing again.
"""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from pathlib import Path

MOVED_FOR = "POLYCHIP_TEST_WORKER"  # the worker whose services this environment names already
REDIS_URLS = ("CELERY_BROKER_URL", "CHANNEL_REDIS_URL")


def redis_db_moved_down(url: str, pairs: int, name: str) -> str:
    match = re.fullmatch(r"(redis://[^/]+)/(\d+)", url)
    if match is None:
        raise ValueError(f"{name}={url!r}: parallel tests need a redis://host:port/<db> URL (or run with -n 0)")
    db = int(match.group(2)) - 2 * pairs
    if db < 0:
        raise ValueError(f"{name}={url!r}: worker {pairs} would need Redis database {db}; name higher databases")
    return f"{match.group(1)}/{db}"


def give_worker_its_own_services(env: MutableMapping[str, str], worker: str, default_var: Path) -> None:
    """Point ``env`` at worker ``gwN``'s own Redis databases and var folder, once."""
    if env.get(MOVED_FOR) == worker:
        return
    index = int(worker.removeprefix("gw"))
    moved = {name: redis_db_moved_down(env[name], index, name) for name in REDIS_URLS if name in env}
    moved["POLYCHIP_VAR_DIR"] = str(Path(env.get("POLYCHIP_VAR_DIR", default_var)) / worker)
    env.update(moved, **{MOVED_FOR: worker})
