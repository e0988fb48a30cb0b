"""Helpers for the runtime tier: real processes, no Django, no database.

Every LocalBackend job a test starts is torn down afterwards, pass or fail, so no test leaves
processes behind.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.backends.base import Observation, Phase
from runtime.backends.local import LocalBackend, standby
from runtime.inventory import Pool, load_pool
from tests.processes import processes_mentioning  # noqa: F401  (used by the tests here)

REPO = Path(__file__).resolve().parents[2]
DEMO_POOL = REPO / "runtime" / "pools" / "demo.yaml"
FINAL = (Phase.SUCCEEDED, Phase.FAILED, Phase.STOPPED, Phase.GONE)


def wait_until_final(backend: LocalBackend, handle: dict[str, Any], timeout_s: float) -> Observation:
    deadline = time.monotonic() + timeout_s
    observation = backend.observe(handle)
    while observation.phase not in FINAL and time.monotonic() < deadline:
        time.sleep(0.25)
        observation = backend.observe(handle)
    return observation


def wait_for(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


def warm_pool(backend: LocalBackend, size: int) -> None:
    """The backend's pool of warm standbys started and full, as a restart finds it."""
    standby.start_pool(backend.standby_dir, size, backend.python, backend.standby_env())
    full = lambda: len(standby.pool_state(backend.standby_dir).get("standbys", [])) >= size  # noqa: E731
    assert wait_for(full, timeout_s=120), standby.pool_state(backend.standby_dir)


@pytest.fixture(scope="session")
def demo_pool() -> Pool:
    return load_pool(DEMO_POOL)


@pytest.fixture
def make_backend(tmp_path: Path, demo_pool: Pool) -> Iterator[Callable[..., LocalBackend]]:
    """Build LocalBackends over the demo pool's profiles; their jobs are torn down at the end."""
    made: list[LocalBackend] = []

    def make(**kwargs: Any) -> LocalBackend:
        kwargs.setdefault("sample_time_ms", 0.1)
        kwargs.setdefault("grace_s", 3.0)
        backend = LocalBackend(tmp_path / "runs", demo_pool.local_profiles, **kwargs)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        runs = backend.runs_dir
        if runs.is_dir():
            for run_dir in runs.iterdir():
                if run_dir.is_dir() and run_dir != backend.standby_dir:
                    backend.teardown({"backend": "local", "run_dir": str(run_dir), "job_id": run_dir.name})
        backend.stop_standby()  # its warm processes too, when a test kept some
