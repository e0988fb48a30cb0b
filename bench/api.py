"""The API and the CLI that CI pipelines use (issue 19): conformance, latency under load, idempotency.

    python bench/api.py [--quick]

- schemathesis_failures: tests/integration/test_api_fuzz.py run as it runs in `make test` (every check,
  every phase, seed 1, against a live stack, once with each of two tenants' tokens), the failures and
  errors in its JUnit reports (var/reports/schemathesis-*.xml), summed. Target: 0.
- submit_p50_ms, submit_p99_ms, list_p50_ms, list_p99_ms: a uvicorn server (as `polychip up` runs it;
  --workers N processes, as POLYCHIP_WEB_WORKERS=N, sharing a Redis for throttles and pushes)
  on a scratch PostgreSQL database (polychip_bench_api) holding 100,000 jobs of one tenant (90% ended,
  10% waiting); 16 clients on loopback, each sending a submit (1 tpu-v4: the refusal check at submit
  runs) or a list (GET /api/v1/jobs, a page of 50) in turn as fast as answers come, for 30 s (10 s
  with --quick) after a warm-up. Targets: submit p99 <= 100 ms, list p99 <= 150 ms. Beside them,
  submit_alone_p50_ms and list_alone_p50_ms: one client alone, the time of one request unqueued.
- server_cpu_ms, postgres_cpu_ms, load_cpu_ms: the CPU time (user + system, from /proc) that the server's
  processes, PostgreSQL's and this load generator spent per request during the 16-client run, and
  host_cores: with them, the most answers a second this host could give (cores / their sum) whatever
  the queueing, which bounds the latencies 16 closed-loop clients can see (Little's law: 16 / rate).
  PostgreSQL's is every postgres process of the host (the server's backends are not told apart from
  another program's), and the server's its processes alive at both readings: run it on a quiet host.
- idempotent_duplicates: 32 clients released at once with the same Idempotency-Key and body; the jobs
  created beyond the first. Target: 0.
- cli_help_s: the median wall time of `polychip --help` (the console script), 9 runs (5 with --quick).
  Target: <= 0.2 on an idle machine.
- cli_install_mb: the client install (`pip install --target DIR .`: polychip with click, httpx, rich and
  PyYAML, no server extra), the size of DIR in MiB.
The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, bench/ heads sys.path, and bench/kubernetes.py would shadow the kubernetes client.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.admission import PG  # noqa: E402
from bench.admission import setup_django as setup_scratch_django  # noqa: E402
from bench.skeleton import free_port  # noqa: E402

BENCH_DB = "polychip_bench_api"
JOBS = 100_000
CLIENTS = 16
SUBMIT = {"name": "bench-submit", "devices": 1, "flavors": ["tpu-v4"], "workload": {"steps": 10}}
UNLIMITED = "100000000/min"
REDIS = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")  # apart from make test's 14 and 15


logging.getLogger("httpx").setLevel(logging.WARNING)


def say(line: str) -> None:
    print(line, flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# --- the world: 100,000 jobs ------------------------------------------------------------------------


def seed(jobs: int) -> tuple[int, str]:
    from django.conf import settings
    from django.utils import timezone

    from jobs import services
    from jobs.models import JobState, TrainingJob
    from runtime.inventory import load_pool
    from runtime.jobspec import parse_job_spec
    from tenants import services as tenants
    from tenants.models import NAU_RESOURCE, Quota, Tenant

    services.sync_pool(load_pool(settings.POLYCHIP_POOL_FILE))
    ref = tenants.ensure_tenant_with_user(slug="acme", name="Acme", username="acme-user", password="pw-123456789")
    Tenant.objects.filter(pk=ref.id).update(max_queued_jobs=10 * jobs)
    Quota.objects.update_or_create(tenant_id=ref.id, resource=NAU_RESOURCE, defaults={"nominal": 1000})
    token = tenants.issue_token(tenant_id=ref.id, username="acme-user", name="bench").secret
    spec = parse_job_spec(SUBMIT).to_dict()
    ended = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)
    start = timezone.now() - timezone.timedelta(days=30)
    batch: list[TrainingJob] = []
    for n in range(jobs):
        state = JobState.QUEUED if n % 10 == 0 else ended[n % 3]
        batch.append(
            TrainingJob(
                tenant_id=ref.id, name=f"seeded-{n}", spec=spec, state=state, total_steps=10, job_class="synthetic-mlp"
            )
        )
        if len(batch) == 5000:
            TrainingJob.objects.bulk_create(batch)
            batch = []
    TrainingJob.objects.bulk_create(batch)
    # Spread over a month, oldest first, as a real history would be.
    TrainingJob.objects.filter(tenant_id=ref.id).update(created_at=start)
    from django.db import connection

    # What autovacuum does for a table of this age: statistics, and a visibility map for index-only scans.
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE jobs_trainingjob")
    return ref.id, token


# --- a server -----------------------------------------------------------------------------------------


def serve(
    scratch: str, workers: int = 1, *, database: str = BENCH_DB, broker: str = "memory://", cache: str = ""
) -> tuple[subprocess.Popen[bytes], str]:
    """A uvicorn server as `polychip up` runs it, on the scratch database ``database``, sending its
    tasks to ``broker`` (by default nowhere: no job is admitted or launched), throttles lifted; its
    cache is ``cache`` (a Redis URL, as POLYCHIP_CACHE_URL) where given."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CELERY_", "CHANNEL_", "POLYCHIP_"))}
    env.update(
        DATABASE_URL=f"{PG}/{database}",
        CELERY_BROKER_URL=broker,
        POLYCHIP_VAR_DIR=scratch,
        POLYCHIP_RATE_PER_TOKEN=UNLIMITED,
        POLYCHIP_RATE_PER_ADDRESS=UNLIMITED,
        POLYCHIP_PASSWORD_HASHERS="django.contrib.auth.hashers.MD5PasswordHasher",
    )
    if workers > 1:  # as `polychip up` requires for several server processes: a shared cache and channel layer
        env.update(CHANNEL_REDIS_URL=REDIS)
        cache = cache or REDIS
    if cache:
        env.update(POLYCHIP_CACHE_URL=cache)
    command = [sys.executable, "-m", "uvicorn", "controlplane.asgi:application", "--port", str(port)]
    command += ["--workers", str(workers)]
    server = subprocess.Popen([*command, "--log-level", "warning"], env=env, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).is_success:
                return server, url
        except httpx.HTTPError:
            time.sleep(0.3)
    server.kill()
    raise SystemExit("bench: the server did not start")


# --- load ---------------------------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_s(pid: int) -> float:
    """A process's CPU seconds so far (user + system), 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (fields 14, 15 of proc(5))


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            for task in Path(f"/proc/{current}/task").glob("*/children"):
                todo += [int(child) for child in task.read_text().split()]
        except OSError:  # it exited while being read
            continue
    return found


def _postgres_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def cpu_split(server_pid: int) -> dict[str, float]:
    """CPU seconds so far of the server (its worker processes too), PostgreSQL and this process."""
    return {
        "server": sum(_cpu_s(pid) for pid in _descendants(server_pid)),
        "postgres": sum(_cpu_s(pid) for pid in _postgres_pids()),
        "load": _cpu_s(os.getpid()),
    }


def load(url: str, token: str, seconds: float, clients: int = CLIENTS) -> dict[str, list[float]]:
    """``clients`` threads, each alternating a submit and a list; latencies (ms) per kind."""
    import httpx

    latencies: dict[str, list[float]] = {"submit": [], "list": []}
    errors: list[str] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def client(number: int) -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
            turn = number % 2
            while time.monotonic() < stop_at:
                kind = ("submit", "list")[turn]
                turn ^= 1
                started = time.perf_counter()
                if kind == "submit":
                    response = http.post("/api/v1/jobs", json=SUBMIT)
                else:
                    response = http.get("/api/v1/jobs", params={"limit": 50})
                took = (time.perf_counter() - started) * 1000
                with lock:
                    if response.status_code >= 300:
                        errors.append(f"{kind}: HTTP {response.status_code} {response.text[:200]}")
                    latencies[kind].append(took)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise SystemExit(f"bench: {len(errors)} requests failed, e.g. {errors[0]}")
    return latencies


def duplicates(url: str, token: str, tenant_id: int) -> int:
    """32 clients released together with one key and one body: the jobs made beyond the first."""
    import httpx

    from jobs.models import TrainingJob

    body = {**SUBMIT, "name": "bench-idempotent"}
    gate = threading.Barrier(32)
    codes: list[int] = []

    def send() -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
            gate.wait()
            codes.append(http.post("/api/v1/jobs", json=body, headers={"Idempotency-Key": "bench-race"}).status_code)

    threads = [threading.Thread(target=send) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    made = TrainingJob.objects.filter(tenant_id=tenant_id, name="bench-idempotent").count()
    say(f"idempotency: 32 racing clients, answers {sorted(set(codes))}, {made} job(s) made")
    return made - 1


# --- schemathesis, the CLI ----------------------------------------------------------------------------


def schemathesis_failures() -> int:
    reports = ROOT / "var" / "reports"
    for old in reports.glob("schemathesis-*.xml"):
        old.unlink()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CELERY_", "CHANNEL_", "POLYCHIP_", "DATABASE_"))}
    env.update(
        DATABASE_URL=f"{PG}/polychip_bench_api_fuzz",
        CELERY_BROKER_URL="redis://127.0.0.1:6379/12",
        CHANNEL_REDIS_URL="redis://127.0.0.1:6379/13",
        POLYCHIP_VAR_DIR=str(ROOT / "var" / "bench-api-fuzz"),
        POLYCHIP_PASSWORD_HASHERS="django.contrib.auth.hashers.MD5PasswordHasher",
    )
    test = "tests/integration/test_api_fuzz.py"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test], env=env, cwd=ROOT)
    found = sorted(reports.glob("schemathesis-*.xml"))
    if not found:
        raise SystemExit(f"bench: the fuzz test wrote no report (exit {done.returncode})")
    failures = 0
    for report in found:
        for suite in ET.parse(report).getroot().iter("testsuite"):
            failures += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
    say(f"schemathesis: {failures} failures in {', '.join(r.name for r in found)} (pytest exit {done.returncode})")
    return failures


def timed(command: list[str], runs: int) -> float:
    walls = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        walls.append(time.perf_counter() - started)
    return statistics.median(walls)


def install_mb() -> float:
    # setuptools builds in the source tree (build/); leave the checkout as it was.
    built_before = (ROOT / "build").exists()
    try:
        return _install_mb()
    finally:
        if not built_before:
            shutil.rmtree(ROOT / "build", ignore_errors=True)


def _install_mb() -> float:
    with tempfile.TemporaryDirectory(prefix="polychip-client-") as target:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--target", target, str(ROOT)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        size = sum(path.stat().st_size for path in Path(target).rglob("*") if path.is_file())
        names = sorted({p.name.split("-")[0] for p in Path(target).glob("*.dist-info")})
        say(f"client install: {', '.join(names)}")
    return size / 2**20


# --- the figures ---------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10 s of load instead of 30, fewer CLI runs")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="server processes (POLYCHIP_WEB_WORKERS; above 1 they share a Redis: BENCH_REDIS_URL)",
    )
    args = parser.parse_args()
    seconds, runs = (10.0, 5) if args.quick else (30.0, 9)
    figures: dict[str, Any] = {"quick": args.quick, "server_workers": args.workers}

    cli = str(Path(sys.executable).parent / "polychip")
    figures["cli_help_s"] = round(timed([cli, "--help"], runs), 3)
    say(f"polychip --help: {figures['cli_help_s']} s (median of {runs})")
    figures["cli_install_mb"] = round(install_mb(), 1)
    say(f"client install: {figures['cli_install_mb']} MiB")

    setup_scratch_django(BENCH_DB, "bench-api")
    started = time.monotonic()
    tenant_id, token = seed(JOBS)
    say(f"seeded {JOBS} jobs in {time.monotonic() - started:.0f} s")
    scratch = tempfile.mkdtemp(prefix="polychip-bench-api-")
    server, url = serve(scratch, args.workers)
    try:
        load(url, token, 3.0)  # warm-up: connections, caches, the first plans
        alone = load(url, token, seconds / 2, clients=1)
        for kind in ("submit", "list"):
            figures[f"{kind}_alone_p50_ms"] = round(percentile(alone[kind], 0.5), 1)
        say(
            f"one client alone: submit p50 {figures['submit_alone_p50_ms']} ms, "
            f"list p50 {figures['list_alone_p50_ms']} ms"
        )
        cpu_before = cpu_split(server.pid)
        latencies = load(url, token, seconds)
        cpu_after = cpu_split(server.pid)
        for kind in ("submit", "list"):
            values = latencies[kind]
            figures[f"{kind}_p50_ms"] = round(percentile(values, 0.5), 1)
            figures[f"{kind}_p99_ms"] = round(percentile(values, 0.99), 1)
            say(
                f"{kind}: {len(values)} requests from {CLIENTS} clients in {seconds:.0f} s, "
                f"p50 {figures[f'{kind}_p50_ms']} ms, p99 {figures[f'{kind}_p99_ms']} ms"
            )
        answered = sum(len(v) for v in latencies.values())
        figures["requests_per_s"] = round(answered / seconds, 1)
        for part in ("server", "postgres", "load"):
            figures[f"{part}_cpu_ms"] = round((cpu_after[part] - cpu_before[part]) / answered * 1000, 2)
        cores = os.cpu_count() or 1
        figures["host_cores"] = cores
        per_request = sum(figures[f"{part}_cpu_ms"] for part in ("server", "postgres", "load"))
        say(
            f"CPU per request: server {figures['server_cpu_ms']} ms, PostgreSQL {figures['postgres_cpu_ms']} ms, "
            f"load {figures['load_cpu_ms']} ms: at most {cores / per_request * 1000:.0f} answers/s on {cores} "
            f"cores, so {CLIENTS} clients wait at least {CLIENTS * per_request / cores:.0f} ms on average"
        )
        figures["idempotent_duplicates"] = duplicates(url, token, tenant_id)
    finally:
        server.terminate()
        server.wait(timeout=30)

    figures["schemathesis_failures"] = schemathesis_failures()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
