"""Walking-skeleton figures: demo job wall time, WebSocket push latency, test tier wall times.

    python bench/skeleton.py [--quick]

Starts Polychip on the embedded default (SQLite, filesystem broker, in-memory channel layer, local
backend) in a scratch directory on a free port, exactly as `make demo` does, then:
- demo_job_wall_s: submission of the demo job to `succeeded`, seen by a REST client (median of trials);
- ws_push_latency_ms_*: a transition's event row written in the database to its push arriving at a
  signed-in WebSocket client (both clocks are this host's);
- tests_*_s: wall time of each test tier, run as `make test-<tier>` against PostgreSQL and Redis
  (--quick runs none of them and prints null).
The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import requests
import websockets

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, bench/ heads sys.path, and bench/kubernetes.py would shadow the kubernetes client.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from controlplane.cli.api import Api as Client  # noqa: E402
from controlplane.cli.server import DEMO_SPEC, DEMO_USER, follow  # noqa: E402
from tests.stack import portal_session  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(env: dict[str, str], *args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "controlplane.cli", *args], env=env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL
    )


async def measure_push(url: str, session: requests.Session, client: Client, samples: int) -> list[float]:
    """Each unplaceable job makes two transitions (queued, cancelled); time each one's push."""
    cookie = "; ".join(f"{k}={v}" for k, v in session.cookies.items())
    latencies: list[float] = []
    async with websockets.connect(
        url.replace("http", "ws") + "/ws/jobs/", additional_headers={"Cookie": cookie, "Origin": url}
    ) as ws:
        assert json.loads(await ws.recv())["type"] == "hello"
        assert json.loads(await ws.recv())["type"] == "snapshot"
        await asyncio.sleep(0.3)  # let the relay take its starting cursor
        never_fits = {**DEMO_SPEC, "name": "push-probe", "devices": 64, "wait_for_capacity": True}
        while len(latencies) < samples:
            job = await asyncio.to_thread(client.submit, never_fits)
            await asyncio.to_thread(client.cancel, job["id"])
            seen = 0
            while seen < 2:
                message = json.loads(await asyncio.wait_for(ws.recv(), timeout=10))
                received = time.time()
                if message.get("type") != "job_event" or message["event"]["job"] != job["id"]:
                    continue
                if message["event"]["kind"] != "transition":
                    continue
                written = datetime.fromisoformat(message["event"]["created_at"]).timestamp()
                latencies.append((received - written) * 1000)
                seen += 1
    return latencies[:samples]


def run_tier(tier: str) -> float:
    """Wall time of `make test-<tier>`: the same environment and services as `make test`."""
    started = time.monotonic()
    result = subprocess.run(
        ["make", "--no-print-directory", f"test-{tier}", "PYTEST_ARGS=-q -p no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    elapsed = time.monotonic() - started
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr[-300:]
    print(f"  tests/{tier}: {elapsed:.1f} s  ({summary})", flush=True)
    if result.returncode != 0:
        raise SystemExit(f"tests/{tier} failed; fix them before measuring:\n{result.stdout[-3000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick", action="store_true", help="one demo trial, 20 push samples, no test tiers (under a minute)"
    )
    args = parser.parse_args()
    trials, samples = (1, 20) if args.quick else (3, 200)

    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="polychip-bench-") as scratch:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = {
            k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "CELERY_BROKER_URL", "CHANNEL_REDIS_URL"}
        }
        env.update(POLYCHIP_VAR_DIR=scratch, POLYCHIP_PUBLIC_URL=url)
        print(f"embedded default in {scratch}, port {port}", flush=True)
        cli(env, "demo", "--no-job", "--port", str(port))
        try:
            client = Client(url, (Path(scratch) / "demo-token").read_text().strip())
            walls = []
            for trial in range(trials):
                started = time.monotonic()
                job = client.submit(DEMO_SPEC)
                job = follow(client, job["id"], timeout_s=600) if trial == 0 else _quiet_follow(client, job["id"])
                walls.append(time.monotonic() - started)
                if job["state"] != "succeeded":
                    raise SystemExit(f"demo job ended {job['state']}: {job['failure_reason']}")
                print(f"  demo trial {trial + 1}: {walls[-1]:.2f} s", flush=True)
            figures["demo_job_wall_s"] = round(statistics.median(walls), 2)

            latencies = asyncio.run(
                measure_push(
                    url,
                    portal_session(url, DEMO_USER, (Path(scratch) / "demo-password").read_text().strip()),
                    client,
                    samples,
                )
            )
            latencies.sort()
            figures["ws_push_latency_ms_p50"] = round(statistics.median(latencies), 1)
            figures["ws_push_latency_ms_p95"] = round(latencies[int(0.95 * (len(latencies) - 1))], 1)
            figures["ws_push_samples"] = len(latencies)
        finally:
            cli(env, "down")

    for tier in ("unit", "integration", "runtime", "e2e"):
        if args.quick:
            # The tiers take minutes whatever the trials; --quick leaves them out (null).
            print(f"  tests/{tier}: not run with --quick", flush=True)
            figures[f"tests_{tier}_s"] = None
            continue
        figures[f"tests_{tier}_s"] = round(run_tier(tier), 1)
    print(json.dumps(figures))


def _quiet_follow(client: Client, job_id: int) -> dict[str, Any]:
    while True:
        job = client.job(job_id)
        if job["state"] in {"succeeded", "failed", "cancelled"}:
            return job
        time.sleep(0.2)


if __name__ == "__main__":
    main()
