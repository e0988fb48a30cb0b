"""The integration tier runs the production topology against PostgreSQL and Redis (see tests/stack.py)."""

from __future__ import annotations

import pytest
import redis

from tests.stack import api_for, stack, stack_var  # noqa: F401  (fixtures shared with the e2e tier)


@pytest.fixture
def sent(monkeypatch) -> list[tuple]:
    """Tasks that the jobs app would enqueue once its transaction commits, recorded instead of sent."""
    from jobs import dispatch

    tasks: list[tuple] = []
    monkeypatch.setattr(dispatch, "after_commit", lambda name, *args: tasks.append((name, *args)))
    return tasks


@pytest.fixture
def stops(monkeypatch) -> list[tuple[dict, str]]:
    """Runs that recovery asks to checkpoint and stop, as (backend handle, reason): no rank runs."""
    from jobs import moving, recovery

    asked: list[tuple[dict, str]] = []

    class Backend:
        def request_stop(self, handle: dict, reason: str) -> None:
            asked.append((handle, reason))

    monkeypatch.setattr(recovery, "get_backend", lambda: Backend())
    monkeypatch.setattr(moving, "get_backend", lambda: Backend())
    return asked


@pytest.fixture(scope="session", autouse=True)
def _require_services() -> None:
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    if "postgresql" not in engine:
        pytest.fail("the integration tier runs on PostgreSQL: set DATABASE_URL (make test does)")
    if not settings.CELERY_BROKER_URL.startswith("redis"):
        pytest.fail("the integration tier runs Celery on Redis: set CELERY_BROKER_URL (make test does)")
    # Drop messages that an interrupted earlier run left behind.
    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
