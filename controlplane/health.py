"""Health probes: ``/healthz`` says the process lives; ``/readyz`` says whether it can do its work now.

Readiness asks each part the control plane needs, each within about a second so that one probe answers
in time (a probe's default timeout is 1 s on Kubernetes; deploy/kubernetes/base/web.yaml gives 3):

- ``database``: a ``SELECT 1`` on the default connection (a broken connection is closed, so that the
  next probe connects afresh rather than reporting the old failure for ever);
- ``migrations``: none of the code's migrations is unapplied (once true, remembered for the process);
- ``broker``: Celery's broker accepts a connection (the embedded filesystem broker: its folders exist);
- ``channel_layer``: the Redis behind Channels answers PING (the in-memory layer is always there).

Each failing part is named with what went wrong (the error's first line: no credentials are in them).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, JsonResponse

TIMEOUT_S = 1.0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    ms: float


def _timed(name: str, probe: Callable[[], str]) -> Check:
    started = time.perf_counter()
    try:
        detail, ok = probe(), True
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        detail, ok = f"{type(exc).__name__}: {first}"[:300], False
    return Check(name, ok, detail, round((time.perf_counter() - started) * 1000, 1))


def _database() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError:
        connection.close()  # the next probe connects again
        raise
    return connection.vendor


_migrated = False


def _migrations() -> str:
    global _migrated
    if not _migrated:
        executor = MigrationExecutor(connection)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
        if plan:
            names = ", ".join(f"{m.app_label}.{m.name}" for m, _ in plan[:3])
            raise RuntimeError(f"{len(plan)} migration(s) not applied ({names}); run manage.py migrate")
        _migrated = True
    return "applied"


def _broker() -> str:
    url = settings.CELERY_BROKER_URL
    if url.startswith("filesystem://"):
        folders = settings.CELERY_BROKER_TRANSPORT_OPTIONS
        for key in ("data_folder_in", "data_folder_out"):
            if not Path(str(folders[key])).is_dir():
                raise RuntimeError(f"the broker's folder {folders[key]} is missing")
        return "filesystem"
    from controlplane.celery import app

    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=TIMEOUT_S)
        return str(conn.transport_cls)


def _channel_layer() -> str:
    url = settings.CHANNEL_REDIS_URL
    if not url:
        return "in-memory"
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=TIMEOUT_S, socket_timeout=TIMEOUT_S)
    try:
        client.ping()
    finally:
        client.close()
    return "redis"


PARTS: tuple[tuple[str, Callable[[], str]], ...] = (
    ("database", _database),
    ("migrations", _migrations),
    ("broker", _broker),
    ("channel_layer", _channel_layer),
)


def readiness() -> list[Check]:
    """Every part's check; migrations are not asked while the database does not answer."""
    checks: list[Check] = []
    for name, probe in PARTS:
        if name == "migrations" and not checks[0].ok:
            checks.append(Check(name, False, "not checked: the database does not answer", 0.0))
            continue
        checks.append(_timed(name, probe))
    return checks


def healthz(request: HttpRequest) -> JsonResponse:
    """The process lives (a liveness probe: nothing else is asked)."""
    return JsonResponse({"status": "ok"})


def readyz(request: HttpRequest) -> JsonResponse:
    """200 when every part answers, else 503 naming each part that does not (a readiness probe)."""
    checks = readiness()
    failing = [f"{c.name}: {c.detail}" for c in checks if not c.ok]
    body = {
        "status": "not ready" if failing else "ready",
        "failing": failing,
        "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail, "ms": c.ms} for c in checks],
    }
    return JsonResponse(body, status=503 if failing else 200)
