"""A running Polychip stack for the tiers that test through HTTP and WebSocket.

One `polychip up` per test module starts a real ASGI server (uvicorn), a real Celery worker and
beat, all pointed at the test database that pytest-django created and at the Redis broker and
channel layer from the environment. Tests talk to it as clients do and read the database to check
what it did.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.processes import processes_mentioning

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def stack_var(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stack's var folder: its logs, runs and (when a test trains one) failure predictor."""
    return tmp_path_factory.mktemp("var")


def stack_env(stack_var: Path, port: int) -> dict[str, str]:
    """The environment of a stack on ``port`` against the test database pytest-django created."""
    from django.db import connection

    settings_dict = connection.settings_dict
    return dict(
        os.environ,
        DATABASE_URL=(
            f"postgres://{settings_dict['USER']}@{settings_dict['HOST']}:{settings_dict['PORT']}/{settings_dict['NAME']}"
        ),
        POLYCHIP_VAR_DIR=str(stack_var),
        POLYCHIP_PUBLIC_URL=f"http://127.0.0.1:{port}",
        POLYCHIP_SWEEP_SECONDS="0.5",
        POLYCHIP_LOCAL_TELEMETRY_FILES="1",
        POLYCHIP_LOCAL_STANDBY_RANKS="2",  # as in production (tests/conftest.py turns them off in-process)
    )


CLI = [sys.executable, "-m", "controlplane.cli"]


def stack_up(env: dict[str, str], port: int) -> str:
    subprocess.run([*CLI, "up", "--port", str(port)], env=env, cwd=ROOT, check=True, timeout=120)
    return f"http://127.0.0.1:{port}"


def stack_down(env: dict[str, str]) -> list[int]:
    """`polychip down`; the pids of the stack's job processes that outlived it (there should be none)."""
    subprocess.run([*CLI, "down"], env=env, cwd=ROOT, timeout=120)
    return processes_mentioning(str(Path(env["POLYCHIP_VAR_DIR"]) / "runs"))


@contextlib.contextmanager
def running_stack(django_db_blocker: Any, env: dict[str, str], port: int) -> Iterator[str]:
    """`polychip up` with ``env`` on ``port`` for the block; `polychip down` after, and whatever job
    process outlived it killed."""
    with django_db_blocker.unblock():
        url = stack_up(env, port)
    try:
        yield url
    finally:
        # `down` stops the jobs the stack started (tests/integration/test_job_life.py checks it); a
        # leftover here would train on, detached, through the rest of the suite and slow every test.
        for pid in stack_down(env):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def stack(django_db_setup: Any, django_db_blocker: Any, stack_var: Path) -> Iterator[str]:
    port = free_port()
    env = stack_env(stack_var, port)
    try:
        with running_stack(django_db_blocker, env, port) as url:
            yield url
    finally:
        logs = Path(env["POLYCHIP_VAR_DIR"]) / "log"
        for log in sorted(logs.glob("*.log")):
            tail = log.read_text(errors="replace")[-3000:]
            if "Traceback" in tail:
                print(f"--- {log.name} (tail) ---\n{tail}")


def portal_session(url: str, username: str, password: str) -> requests.Session:
    """Sign in through the portal's login form, as a browser does; the session carries the cookie."""
    session = requests.Session()
    session.get(f"{url}/login/", timeout=10)
    response = session.post(
        f"{url}/login/",
        data={"username": username, "password": password, "csrfmiddlewaretoken": session.cookies["csrftoken"]},
        headers={"Referer": f"{url}/login/"},
        timeout=10,
    )
    if not (response.ok and "sessionid" in session.cookies):
        raise AssertionError(f"signing in as {username} failed: HTTP {response.status_code}")
    return session


class Api:
    def __init__(self, url: str, token: str | None) -> None:
        self.url = url
        self.session = requests.Session()
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"

    def get(self, path: str) -> requests.Response:
        return self.session.get(f"{self.url}{path}", timeout=30)

    def post(self, path: str, body: Any = None) -> requests.Response:
        return self.session.post(f"{self.url}{path}", json=body, timeout=30)

    def wait_for(self, job_id: int, states: set[str], timeout_s: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.get(f"/api/v1/jobs/{job_id}").json()
            if job["state"] in states:
                return job
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} stayed {job['state']} for {timeout_s} s: {job}")
            time.sleep(0.2)


@pytest.fixture
def api_for(stack: str):
    def make(token: str | None) -> Api:
        return Api(stack, token)

    return make
