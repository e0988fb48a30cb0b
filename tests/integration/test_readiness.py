"""``/readyz`` through a real stack whose PostgreSQL and Redis are this test's own, stopped and started
under it: the first probe after a part goes names it, and the stack is ready again once it is back."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.stack import CLI, ROOT, free_port

pytestmark = [pytest.mark.integration]

POSTGRES_USER = "postgres"


class PrivatePostgres:
    """A PostgreSQL cluster of its own in a temporary folder (run as the postgres user: it refuses root)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="polychip-readyz-pg-"))
        shutil.chown(self.dir, POSTGRES_USER)
        self.port = free_port()
        self._as_postgres = ["runuser", "-u", POSTGRES_USER, "--"] if os.geteuid() == 0 else []
        subprocess.run(
            [*self._as_postgres, "initdb", "-D", str(self.dir / "data"), "-U", "postgres", "--auth=trust"],
            check=True,
            capture_output=True,
            timeout=120,
        )

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1"
        subprocess.run(
            [
                *self._as_postgres,
                "pg_ctl",
                "-D",
                str(self.dir / "data"),
                "-o",
                options,
                "-l",
                str(self.dir / "log"),
                "-w",
                "start",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def stop(self) -> None:
        subprocess.run(
            [*self._as_postgres, "pg_ctl", "-D", str(self.dir / "data"), "-m", "fast", "-w", "stop"],
            check=False,
            capture_output=True,
            timeout=60,
        )

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class PrivateRedis:
    def __init__(self) -> None:
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                import socket

                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            time.sleep(0.05)
        raise RuntimeError("the private Redis did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


@pytest.fixture
def private_stack(tmp_path: Path) -> Iterator[tuple[str, PrivatePostgres, PrivateRedis]]:
    postgres, redis = PrivatePostgres(), PrivateRedis()
    postgres.start()
    redis.start()
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CELERY_", "CHANNEL_"))},
        "DATABASE_URL": postgres.url,
        "CELERY_BROKER_URL": f"redis://127.0.0.1:{redis.port}/0",
        "CHANNEL_REDIS_URL": f"redis://127.0.0.1:{redis.port}/1",
        "POLYCHIP_VAR_DIR": str(tmp_path / "var"),
        "POLYCHIP_PUBLIC_URL": f"http://127.0.0.1:{port}",
    }
    try:
        subprocess.run([*CLI, "up", "--port", str(port)], env=env, cwd=ROOT, check=True, timeout=180)
        yield f"http://127.0.0.1:{port}", postgres, redis
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            postgres.start()  # `down` reads the database: bring it back if a failure left it stopped
        if redis.process is None:
            redis.start()
        subprocess.run([*CLI, "down"], env=env, cwd=ROOT, timeout=120, check=False)
        redis.stop()
        postgres.remove()


def _probe(url: str) -> tuple[int, dict[str, Any]]:
    response = requests.get(f"{url}/readyz", timeout=5)
    return response.status_code, response.json()


def _ready_again(url: str, timeout_s: float = 15) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        status, body = _probe(url)
        if status == 200 or time.monotonic() > deadline:
            assert status == 200, body
            return body
        time.sleep(0.2)


def test_readyz_names_the_part_that_is_gone_at_the_first_probe_and_recovers(private_stack):
    url, postgres, redis = private_stack
    status, body = _probe(url)
    assert status == 200 and body["status"] == "ready", body
    assert {c["name"] for c in body["checks"]} == {"database", "migrations", "broker", "channel_layer"}
    assert requests.get(f"{url}/healthz", timeout=5).json() == {"status": "ok"}

    postgres.stop()
    status, body = _probe(url)
    assert status == 503 and body["status"] == "not ready", body
    assert body["failing"][0].startswith("database: "), body
    assert requests.get(f"{url}/healthz", timeout=5).status_code == 200  # the process still lives

    postgres.start()
    _ready_again(url)

    redis.stop()
    status, body = _probe(url)
    assert status == 503, body
    assert [line.split(":")[0] for line in body["failing"]] == ["broker", "channel_layer"], body

    redis.start()
    assert _ready_again(url)["failing"] == []
