"""Fixtures shared by every tier: three tenants (the third must see nothing of the others')."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


def _retry_flush_on_deadlock() -> None:
    """A test with the live stack ends while the stack's worker may still be inside an admission cycle or
    an ingest. The flush's TRUNCATE then waits on the worker's locks while the worker waits on a table the
    TRUNCATE already holds; PostgreSQL breaks the cycle by failing one side, sometimes the flush. The flush
    is idempotent, so it is retried after the worker's transaction has ended."""
    from django.core.management.base import CommandError
    from django.core.management.commands import flush

    handle = flush.Command.handle

    def handle_with_retry(self: Any, **options: Any) -> Any:
        for attempt in range(4):
            try:
                return handle(self, **options)
            except CommandError as exc:
                if attempt == 3 or "deadlock" not in str(exc.__cause__ or exc).lower():
                    raise
                time.sleep(0.2 * (attempt + 1))
        return None

    flush.Command.handle = handle_with_retry  # type: ignore[method-assign]


def pytest_configure(config: pytest.Config) -> None:
    _retry_flush_on_deadlock()


# Each tier is a folder under tests/ and a marker of the same name, so one tier runs with `-m unit`,
# `-m integration`, `-m runtime`, `-m e2e` or `-m security` (or a mix: `-m "unit or runtime"`).
TIERS = ("unit", "integration", "runtime", "e2e", "security")
_TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            tier = Path(item.path).resolve().relative_to(_TESTS).parts[0]
        except ValueError:  # a test outside tests/ (a path given on the command line)
            continue
        if tier in TIERS and item.get_closest_marker(tier) is None:
            item.add_marker(getattr(pytest.mark, tier))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        slow_files_first(items)


def slow_files_first(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`make test`), the files that hold a test marked ``slow`` are handed out first: a
    worker that drew one last would run on alone for minutes while the others sat idle. Every worker
    sorts its collection the same way, as xdist requires; the order inside each group is kept."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)


@pytest.fixture(autouse=True, scope="session")
def _no_standby_ranks_in_process() -> None:
    """Warm standby ranks (runtime/backends/local/standby.py) pay for torch's import once per runs folder
    and save it on each restart after; a test's runs folder is its own, so in-process tests would each
    pay and never save. They are off in this process: tests/runtime/test_standby.py tests the pool
    itself, and the live stack (tests/stack.py) runs with them, as production does."""
    from django.conf import settings

    settings.POLYCHIP_LOCAL_STANDBY_RANKS = 0


@pytest.fixture(autouse=True)
def _no_standby_pool_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """A standby pool a test started in its own folder is stopped with the test (it would idle on for
    30 minutes, holding its memory)."""
    folder = Path(request.getfixturevalue("tmp_path")) if "tmp_path" in request.fixturenames else None
    yield
    if folder is None:
        return
    from runtime.backends.local.standby import stop_pool

    for pool_dir in folder.glob("**/.standby"):
        stop_pool(pool_dir)


@pytest.fixture(autouse=True)
def _fresh_throttle_counts() -> None:
    """The API's throttle counts live in the process's cache: each test starts with none of them."""
    from django.core.cache import cache

    cache.clear()


@dataclass(frozen=True)
class TenantFixture:
    id: int
    slug: str
    username: str
    password: str
    token: str


# Ample: the pool, not the quota, limits the fixture tenants (quota tests set their own).
FIXTURE_NAU_QUOTA = 1000


def make_tenant(slug: str, *, nau_quota: int | None = FIXTURE_NAU_QUOTA) -> TenantFixture:
    from tenants import services
    from tenants.models import NAU_RESOURCE, Quota

    password = f"{slug}-password-1"
    ref = services.ensure_tenant_with_user(slug=slug, name=slug.title(), username=f"{slug}-user", password=password)
    if nau_quota is not None:
        Quota.objects.update_or_create(tenant_id=ref.id, resource=NAU_RESOURCE, defaults={"nominal": nau_quota})
    token = services.issue_token(tenant_id=ref.id, username=f"{slug}-user", name="tests")
    return TenantFixture(id=ref.id, slug=slug, username=f"{slug}-user", password=password, token=token.secret)


@pytest.fixture
def pool(db):
    from django.conf import settings

    from jobs import services
    from runtime.inventory import load_pool

    services.sync_pool(load_pool(settings.POLYCHIP_POOL_FILE))


@pytest.fixture
def tenants(db) -> tuple[TenantFixture, TenantFixture, TenantFixture]:
    return make_tenant("acme"), make_tenant("globex"), make_tenant("initech")
