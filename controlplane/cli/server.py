"""Running the control plane on this machine: ``polychip up``, ``down``, ``status`` and ``demo``.

The embedded default: a uvicorn ASGI server, a Celery worker and beat, started as processes of
their own (sessions of their own, logs in var/log) against SQLite or DATABASE_URL. This module needs
the server install (Django, Celery, torch through the local backend); the client commands never
import it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from controlplane.cli import exitcodes
from controlplane.cli.api import Api
from runtime.backends.local.procs import pid_alive

ROOT = Path(__file__).resolve().parents[2]
TERMINAL = {"succeeded", "failed", "cancelled"}
DEMO_USER = "demo"
OPERATOR_USER = "operator"
DEMO_SPEC: dict[str, Any] = {
    "name": "demo-mixed-mlp",
    "devices": 3,
    "flavors": ["h100-sxm", "a100-sxm"],
    "workload": {"kind": "builtin", "model": "synthetic-mlp", "steps": 300, "global_batch": 96, "lr": 0.05, "seed": 7},
}


def var_dir() -> Path:
    return Path(os.environ.get("POLYCHIP_VAR_DIR", ROOT / "var")).resolve()


def _pid_file(name: str) -> Path:
    return var_dir() / "run" / f"{name}.pid"


def _alive(pid: int) -> bool:
    # Reap it when it is our own child (`demo --stop`), so that it does not linger as a zombie.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    return pid_alive(pid)


def _running(name: str) -> int | None:
    try:
        pid = int(_pid_file(name).read_text())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _manage(*args: str) -> None:
    # S603: our interpreter and manage.py with this CLI's own arguments, no shell.
    subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], check=True, cwd=ROOT)  # noqa: S603


def _spawn(name: str, argv: Sequence[str], env: dict[str, str]) -> int:
    existing = _running(name)
    if existing:
        return existing
    log_dir = var_dir() / "log"
    log_dir.mkdir(parents=True, exist_ok=True)
    _pid_file(name).parent.mkdir(parents=True, exist_ok=True)
    with open(log_dir / f"{name}.log", "ab") as log:
        # A session of its own, so that ``down`` can stop the whole tree and a Ctrl-C in the
        # terminal that ran ``up`` does not.
        process = subprocess.Popen(  # noqa: S603 (the server commands this module builds, no shell)
            list(argv),
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    _pid_file(name).write_text(str(process.pid))
    return process.pid


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex((host, port)) == 0


def _wait_healthy(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).is_success:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(
        f"the server did not answer at {url} within {timeout_s:.0f} s; see {var_dir() / 'log' / 'server.log'}"
    )


def _web_workers() -> int:
    """POLYCHIP_WEB_WORKERS server processes (1 unless set). Several serve requests side by side, but
    each holds its own WebSocket clients and throttle counts: they need the shared channel layer
    (CHANNEL_REDIS_URL) and cache (POLYCHIP_CACHE_URL), or a pushed event would reach some clients only."""
    raw = os.environ.get("POLYCHIP_WEB_WORKERS", "1")
    if not raw.isdigit() or not 1 <= int(raw) <= 64:
        raise SystemExit(f"POLYCHIP_WEB_WORKERS: a whole number from 1 to 64, got {raw!r}")
    workers = int(raw)
    if workers > 1 and not (os.environ.get("CHANNEL_REDIS_URL") and os.environ.get("POLYCHIP_CACHE_URL")):
        raise SystemExit(
            "POLYCHIP_WEB_WORKERS above 1 needs CHANNEL_REDIS_URL and POLYCHIP_CACHE_URL (a Redis shared by the "
            "server processes for live pushes and throttle counts)"
        )
    return workers


def up(*, host: str, port: int, demo_accounts: bool = False) -> str:
    url = f"http://{host}:{port}"
    public_url = os.environ.setdefault("POLYCHIP_PUBLIC_URL", url)
    env = dict(os.environ, POLYCHIP_PUBLIC_URL=public_url, PYTHONUNBUFFERED="1")
    print("• migrating the database and loading the pool", flush=True)
    _manage("migrate", "--noinput", "-v", "0")
    _manage("load_pool")
    if demo_accounts:
        ensure_demo_accounts()

    if _running("server") is None and _port_in_use(host, port):
        raise SystemExit(f"port {port} on {host} is taken by another program; choose one with POLYCHIP_PORT")
    python = [sys.executable, "-m"]
    workers = _web_workers()
    server = (
        f"uvicorn controlplane.asgi:application --host {host} --port {port} --log-level warning --workers {workers}"
    )
    # --quiet: no banner (the logs are JSON lines); the level is POLYCHIP_LOG_LEVEL's (settings.LOGGING).
    level = os.environ.get("POLYCHIP_LOG_LEVEL", "INFO").upper()
    worker = (
        f"celery -A controlplane --quiet worker --loglevel {level} --concurrency 2 --without-mingle --without-gossip"
    )
    beat = f"celery -A controlplane --quiet beat --loglevel {level} --schedule"
    _spawn("server", [*python, *server.split()], env)
    _spawn("worker", [*python, *worker.split(), "--hostname", "polychip@%h"], env)
    _spawn("beat", [*python, *beat.split(), str(var_dir() / "celerybeat-schedule")], env)
    _wait_healthy(url)
    print(f"• Polychip is up: portal {url}/, API {url}/api/v1/, admin console {url}/admin/", flush=True)
    if not demo_accounts:
        print(
            "  no account is created: `polychip demo` makes the demo's, or create yours with\n"
            "  python manage.py ensure_operator --password-file FILE and python manage.py ensure_tenant "
            "--slug S --user U --password-file FILE --token-file FILE",
            flush=True,
        )
    print(f"  logs in {var_dir() / 'log'}; stop everything with: make down", flush=True)
    return url


def ensure_demo_accounts() -> None:
    """The demo tenant (its owner and API token) and an operator, with random passwords in var/ (0600).

    Both accounts are marked as demo accounts: a production-like start refuses to run while one exists.
    """
    print("• the demo tenant and operator (random passwords, files of mode 0600)", flush=True)
    # 16 NAU is the whole demo pool (2 h100 at 3.17 NAU each, 2 a100 at 1, 4 ascend-910b at 1.026,
    # 4 tpu-v4 at 0.881); operators change it through the API or the admin.
    _manage(
        "ensure_tenant",
        *("--user", DEMO_USER, "--demo", "--nau-quota", "16"),
        *("--password-file", str(demo_password_file()), "--token-file", str(var_dir() / "demo-token")),
    )
    _manage("ensure_operator", "--demo", "--username", OPERATOR_USER, "--password-file", str(operator_password_file()))


def demo_password_file() -> Path:
    return var_dir() / "demo-password"


def operator_password_file() -> Path:
    return var_dir() / "operator-password"


def _sign_in_lines(url: str) -> str:
    return (
        f"portal {url}/ (user {DEMO_USER}, password {demo_password_file().read_text().strip()}, "
        f"also in {demo_password_file()}); admin console {url}/admin/ (user {OPERATOR_USER}, password in "
        f"{operator_password_file()}); API token in {var_dir() / 'demo-token'}"
    )


def down() -> None:
    # Signal all three first, then wait for them together: a Celery warm shutdown takes seconds.
    stopping: dict[str, int] = {}
    for name in ("beat", "worker", "server"):
        pid = _running(name)
        _pid_file(name).unlink(missing_ok=True)
        if pid is not None:
            os.killpg(pid, signal.SIGTERM)
            stopping[name] = pid
    deadline = time.monotonic() + 15
    while any(_alive(pid) for pid in stopping.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for name, pid in stopping.items():
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
        print(f"• stopped {name} (pid {pid})")
    # The jobs' processes run in sessions of their own (they outlive a worker restart): stop them too,
    # each run as its teardown does (SIGTERM, then SIGKILL), and wait until they are gone.
    from runtime.backends.local.backend import LocalBackend

    runs = Path(os.environ.get("POLYCHIP_RUNS_DIR", var_dir() / "runs"))
    for run_dir in LocalBackend(runs, profiles={}).tear_down_every_run():
        print(f"• stopped the job processes of {Path(run_dir).name}")


def status() -> None:
    for name in ("server", "worker", "beat"):
        pid = _running(name)
        print(f"{name:7} {'running, pid ' + str(pid) if pid else 'stopped'}")


def follow(client: Api, job_id: int, timeout_s: float) -> dict[str, Any]:
    """Poll a job until it ends, printing each change of state and the progress as it goes."""
    deadline = time.monotonic() + timeout_s
    last_state, last_step = "", -1
    while True:
        job = client.job(job_id)
        progress = job["progress"]
        if job["state"] != last_state:
            detail = job["pending_reason"] or job["failure_reason"]
            print(f"  [{time.strftime('%H:%M:%S')}] {job['state']}{': ' + detail if detail else ''}", flush=True)
            last_state = job["state"]
        if progress["steps_done"] != last_step and progress["steps_done"]:
            bar = "#" * int(progress["fraction"] * 30)
            loss = job["loss"]["last"]
            print(
                f"      step {progress['steps_done']:>5}/{progress['total_steps']} [{bar:<30}] "
                f"loss {loss:.4f}  {progress['samples_per_s'] or 0:.0f} samples/s",
                flush=True,
            )
            last_step = progress["steps_done"]
        if job["state"] in TERMINAL:
            return job
        if time.monotonic() > deadline:
            raise SystemExit(f"job {job_id} did not end within {timeout_s:.0f} s (state {job['state']})")
        time.sleep(0.5)


def summarize(client: Api, job: dict[str, Any], wall_s: float) -> None:
    metered = client.usage(job["id"])
    usage, currency = metered["usage"], metered["currency"]
    devices = ", ".join(f"rank {d['rank']}: {d['device_id']} ({d['flavor']})" for d in job["devices"])
    loss = job["loss"]
    print("\n── summary ─────────────────────────────────────────────")
    print(
        f"job          {job['id']} {job['name']!r}: {job['state']}"
        + (f" ({job['failure_reason']})" if job["failure_reason"] else "")
    )
    print(f"devices      {devices}")
    print(f"steps        {job['progress']['steps_done']}/{job['progress']['total_steps']}")
    if loss["first"] is not None:
        print(f"loss         first {loss['first']:.4f} → last {loss['last']:.4f}")
    print(f"wall time    {wall_s:.1f} s from submission to {job['state']}")
    for row in usage:
        devices = f"{row['devices']} device{'s' if row['devices'] != 1 else ''}"
        print(
            f"usage        {row['flavor']}: {row['device_seconds']} device-seconds on {devices}, "
            f"{currency} {row['cost']} at list price"
        )
    if job["artifact"]:
        print(f"model        {job['artifact']}")
    print("─────────────────────────────────────────────────────────")


def demo_token() -> str:
    return (var_dir() / "demo-token").read_text().strip()


def demo(*, host: str, port: int, stop: bool, timeout_s: float, no_job: bool) -> int:
    """``polychip demo``: up with the demo accounts, the demo job followed and summarized; its exit code."""
    url = up(host=host, port=port, demo_accounts=True)
    print(f"• {_sign_in_lines(url)}", flush=True)
    if no_job:
        return exitcodes.SUCCEEDED
    try:
        with Api(url, demo_token()) as client:
            started = time.monotonic()
            job = client.submit(DEMO_SPEC)
            print(f"• submitted job {job['id']} through POST {url}/api/v1/jobs: {json.dumps(DEMO_SPEC)}", flush=True)
            try:
                job = follow(client, job["id"], timeout_s)
            except (SystemExit, KeyboardInterrupt):
                client.cancel(job["id"])  # leave no training behind
                raise
            summarize(client, job, time.monotonic() - started)
    finally:
        if stop:
            down()
    if not stop:
        print(f"\nThe servers are still up: {_sign_in_lines(url)}. Stop them with: make down")
    return exitcodes.BY_STATE.get(job["state"], exitcodes.NOT_FINISHED)
