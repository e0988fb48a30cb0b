"""The integration tier runs the production topology against PostgreSQL and Redis (see tests/stack.py)."""

from __future__ import annotations

import pytest
import redis

from tests.stack import api_for, stack, stack_var  # noqa: F401  (fixtures shared with the e2e tier)


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
