"""Each pytest-xdist worker's own services (tests/workers.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.workers import MOVED_FOR, give_worker_its_own_services

BASE = {
    "CELERY_BROKER_URL": "redis://127.0.0.1:6379/14",
    "CHANNEL_REDIS_URL": "redis://127.0.0.1:6379/15",
    "POLYCHIP_VAR_DIR": "/srv/var",
}


@pytest.mark.parametrize(
    ("worker", "broker", "channels", "var"),
    [
        ("gw0", "redis://127.0.0.1:6379/14", "redis://127.0.0.1:6379/15", "/srv/var/gw0"),
        ("gw1", "redis://127.0.0.1:6379/12", "redis://127.0.0.1:6379/13", "/srv/var/gw1"),
        ("gw3", "redis://127.0.0.1:6379/8", "redis://127.0.0.1:6379/9", "/srv/var/gw3"),
    ],
)
def test_each_worker_gets_databases_and_a_folder_no_other_worker_has(worker, broker, channels, var):
    env = dict(BASE)
    give_worker_its_own_services(env, worker, default_var=Path("/unused"))
    assert (env["CELERY_BROKER_URL"], env["CHANNEL_REDIS_URL"], env["POLYCHIP_VAR_DIR"]) == (broker, channels, var)
    assert env[MOVED_FOR] == worker


def test_a_process_started_by_a_worker_moves_nothing_again():
    env = dict(BASE)
    give_worker_its_own_services(env, "gw2", default_var=Path("/unused"))
    inherited = dict(env)
    give_worker_its_own_services(env, "gw2", default_var=Path("/unused"))
    assert env == inherited


def test_without_a_var_folder_the_default_one_is_divided():
    env = {"CELERY_BROKER_URL": "redis://h:1/6"}
    give_worker_its_own_services(env, "gw1", default_var=Path("/repo/var"))
    assert env == {"CELERY_BROKER_URL": "redis://h:1/4", "POLYCHIP_VAR_DIR": "/repo/var/gw1", MOVED_FOR: "gw1"}


@pytest.mark.parametrize(
    ("url", "fix"),
    [
        ("filesystem://", "redis://host:port/<db> URL"),
        ("redis://127.0.0.1:6379/2", "would need Redis database -2"),
        ("redis://127.0.0.1:6379/4", "CHANNEL_REDIS_URL"),  # the broker could move; the channels cannot
    ],
)
def test_a_broker_that_cannot_be_divided_is_refused_by_name(url, fix):
    env = {**BASE, "CELERY_BROKER_URL": url, "CHANNEL_REDIS_URL": "redis://127.0.0.1:6379/3"}
    before = dict(env)
    with pytest.raises(ValueError, match="_URL=") as refused:
        give_worker_its_own_services(env, "gw2", default_var=Path("/unused"))
    assert fix in str(refused.value)
    assert env == before


def test_files_with_a_slow_test_are_handed_out_first_each_in_its_order():
    from tests.conftest import slow_files_first

    class Item:
        def __init__(self, path: str, slow: bool = False) -> None:
            self.path, self.slow = Path(path), slow

        def get_closest_marker(self, name: str) -> object:
            return "slow" if name == "slow" and self.slow else None

        def __repr__(self) -> str:
            return f"{self.path.name}{'*' if self.slow else ''}"

    a1, a2, b1, b2, c1 = Item("a.py"), Item("a.py"), Item("b.py"), Item("b.py", slow=True), Item("c.py")
    items = [a1, b1, c1, a2, b2]
    slow_files_first(items)  # type: ignore[arg-type]
    assert items == [b1, b2, a1, c1, a2]


def test_this_worker_runs_on_its_own_services():
    """The wiring, in the process at hand: under `make test` this runs in a worker, whose settings must be
    tests/settings.py's moved ones (a DJANGO_SETTINGS_MODULE inherited from the controller once made
    every worker read production's module, all of them on one broker)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        pytest.skip("one process (not under pytest-xdist): nothing to divide")
    from django.conf import settings

    assert settings.SETTINGS_MODULE == "tests.settings"
    assert os.environ[MOVED_FOR] == worker
    assert settings.VAR_DIR.name == worker
    assert os.environ["CELERY_BROKER_URL"] == settings.CELERY_BROKER_URL
