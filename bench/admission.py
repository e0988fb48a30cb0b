"""Admission figures: exactness under concurrency, cycle time at scale, fairness over a week.

    python bench/admission.py [--quick]

- overshoots, leaked_reservations, admission_p50_ms, admission_p99_ms: on PostgreSQL (a scratch
  database, polychip_bench, dropped and made again), through production's path. The project's
  Celery worker (`polychip up`'s options: prefork, 2 processes) runs the admission cycles; its
  broker is a Redis database of the bench's own (BENCH_BROKER, flushed), which also holds the cache
  that every process shares as in production (POLYCHIP_CACHE_URL: requests for admission coalesce
  through it, so a burst sends a few, not one per submission); bench/_admission_worker.py,
  loaded into it, reports each committed cycle's decisions and sends provisioning nowhere. Each
  trial starts 64 client processes (forked, each with its own connection, as a server process
  handles a request) at a barrier; each submits a job of 1, 2, 4 or 8 h100-sxm through
  ``jobs.services.submit_job``, whose commit sends a request for admission to the worker, waits for
  the worker's decision, and half of them then finish their job if it was admitted (which asks for
  a cycle too), so that quota frees up while others admit. Trials alternate two
  scenarios: ``quota``, one tenant with a quota of 8 devices; ``cohort``, two tenants of nominal 4
  that may each borrow 4 from the other, one of them also capped at 20 NAU (6 h100), with random
  priorities, so borrowing, reclaim and priority preemption race too. After a trial every job is
  ended. An overshoot is a trial in which, at some instant, a tenant held more than its cap or the
  cohort more than 8 devices, found by a sweep over the trial's allocation intervals; a leaked
  reservation is an allocation still open once every job has ended. A first burst, checked for
  overshoots but not counted in the latencies, warms the clients as a server process is warm (its
  connection open, its queries planned); its p99 is reported alone as cold_burst_p99_ms.
  Admission latency runs from the submit call to the commit of the first cycle that decided the
  job (admitted it, or left it waiting with a reason and a place in the queue); jobs_never_decided
  counts those the worker did not decide within a minute. The baseline is one client submitting
  alone, and the ratio compares the two medians. On this 2-core machine the 64 clients, the worker
  and PostgreSQL contend for the CPU, which the latency includes.
- admission_api_p50_ms, admission_api_p99_ms (and admission_api_overshoots, ..._leaked_reservations,
  ..._jobs_never_decided, ..._cold_burst_p99_ms): the same trials (same seed, same bursts) with the
  64 clients as the portal's users and CI pipelines are: threads of this process, each POSTing
  /api/v1/jobs with its tenant's token to the project's ASGI server, started as `polychip up` starts
  it (one uvicorn process, database connections pooled, throttles lifted), and waiting for the
  worker's decision; half of them then cancel their job through the API if it was admitted. The
  latency runs from the POST to the decision's commit, so it includes the server's own work on 64
  requests at once.
- burst_wall_s, burst_cpu_s, burst_host_busy_share (and admission_api_burst_*): per counted burst,
  from the barrier to the last client's report, its wall time, the CPU seconds spent by the worker's
  processes, PostgreSQL's, the API server's and the clients' (this process and its other children),
  and the share of the host's cores busy meanwhile: where the time went, and whether the host was
  saturated (read from /proc; run on a quiet host).
- submit_only_p50_ms, submit_only_p99_ms: the floor under those latencies. The same bursts (a tenth
  as many, at least 6), each client only submitting, with no worker running: from the barrier to
  its submit's return. No decision can come before the submit it decides has returned, so on this
  host admission_p99_ms cannot fall below submit_only_p99_ms whatever admission does.
- cycle_s_10k_jobs (and cycle_s_10k_jobs_aware_policy, with the placement policy production follows),
  cycle_growth_on_doubling, cycle_growth_by_count: the pure decision
  (``runtime.scheduling.schedule``) over a synthetic snapshot of 10,000 pending jobs, 200 tenants
  in 10 cohorts and 8,000 devices of 6 flavors, half of them busy, a third of that work borrowed;
  then with all counts doubled, and with each doubled alone. Growth is a ratio of median times
  (2.0 is linear). cycle_db_*: a whole cycle on PostgreSQL with 10,000 queued jobs, 200 tenants and
  8,000 free devices (lock, snapshot, decide, apply, and every waiting job's reason
  written): the first cycle admits what fits, the next one reclaims and re-decides.
- fair_share_error_*: the simulator (``runtime.simulate``) runs a week of two tenants with equal
  quotas in one cohort, one submitting in daily bursts and one around the clock, through the same
  scheduler; each tenant's device-hours are compared with its entitlement (weighted max-min
  water-filling of the pool over the demand of the moment): |got - entitled| / entitled.
The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, bench/ heads sys.path, and bench/kubernetes.py would shadow the kubernetes client.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

BENCH_DB = "polychip_bench"
PG = os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
# The broker of the bench's Celery worker (a Redis database of its own, flushed at the start).
BROKER = os.environ.get("BENCH_BROKER", "redis://127.0.0.1:6379/13")
WORKER_CONCURRENCY = 2  # as `polychip up` starts its worker (controlplane/cli/server.py)
DECISION_TIMEOUT_S = 60.0  # a job undecided this long counts in jobs_never_decided
QUOTA = 8
SIZES = (1, 2, 4, 8)
CONCURRENCY = 64


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


# --- exactness under concurrency (PostgreSQL) -----------------------------------------------------


def setup_django(db: str = BENCH_DB, var: str = "bench") -> None:
    """Django on a scratch PostgreSQL database ``db``, dropped and made again, migrated."""
    import psycopg

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (db,),
        )
        conn.execute(f"DROP DATABASE IF EXISTS {db}")
        conn.execute(f"CREATE DATABASE {db}")
    os.environ["DATABASE_URL"] = f"{PG}/{db}"
    # Requests for admission go through Redis to the bench's worker (admission_worker), which runs
    # the cycles; provisioning goes to a queue nobody consumes, and no job is launched.
    os.environ["CELERY_BROKER_URL"] = BROKER
    # As in production, every process shares a cache in Redis (POLYCHIP_CACHE_URL; here the broker's
    # database): requests for admission coalesce through it (jobs.dispatch).
    os.environ["POLYCHIP_CACHE_URL"] = BROKER
    import redis

    redis.Redis.from_url(BROKER).flushdb()
    os.environ.setdefault("POLYCHIP_VAR_DIR", str(ROOT / "var" / var))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import logging

    import django

    django.setup()
    import bench._admission_worker  # noqa: F401  (its task routes: provisioning goes nowhere)

    logging.getLogger("kombu").setLevel(logging.ERROR)
    logging.getLogger("jobs").setLevel(logging.WARNING)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


@dataclass(frozen=True)
class Scenario:
    """Who submits, and the limits no instant may exceed: per tenant, and for the cohort."""

    name: str
    tenants: tuple[int, ...]
    tenant_caps: dict[int, int]
    cohort_cap: int | None


def seed() -> tuple[Scenario, Scenario]:
    """Scenario ``quota``: one tenant, a quota of 8 h100-sxm, no cohort (the issue's case).
    Scenario ``cohort``: two tenants of nominal 4 each in a cohort, each may borrow up to 4 more;
    one also has a NAU quota of 20 (an h100 is 3.170 NAU), so NAU binds before devices do; jobs
    carry random priorities, so reclaim and priority preemption both happen under the race."""
    from django.conf import settings

    from jobs import services as jobs
    from runtime.inventory import NodeSpec, Pool, load_pool
    from tenants.models import Cohort, Quota, Tenant
    from tenants.services import ensure_tenant_with_user

    catalog = load_pool(settings.POLYCHIP_POOL_FILE).flavors
    jobs.sync_pool(Pool(flavors=catalog, nodes=tuple(NodeSpec(f"h100-{i}", "h100-sxm", 8) for i in range(3))))
    alone = ensure_tenant_with_user(slug="bench", name="Bench", username="bench", password="bench-password-1")
    Quota.objects.update_or_create(tenant_id=alone.id, resource="h100-sxm", defaults={"nominal": QUOTA})
    cohort = Cohort.objects.create(name="bench-lab")
    pair = []
    for slug in ("bench-x", "bench-y"):
        ref = ensure_tenant_with_user(slug=slug, name=slug, username=slug, password="bench-password-1")
        Tenant.objects.filter(pk=ref.id).update(cohort=cohort)
        Quota.objects.create(tenant_id=ref.id, resource="h100-sxm", nominal=4, borrowing_limit=4)
        pair.append(ref.id)
    Quota.objects.create(tenant_id=pair[0], resource="nau", nominal=20)
    return (
        Scenario("quota", (alone.id,), {alone.id: QUOTA}, None),
        # bench-x: 8 devices at most, but 20 NAU / 3.170 = 6 h100.
        Scenario("cohort", tuple(pair), {pair[0]: 6, pair[1]: 8}, 8),
    )


def api_tokens(scenarios: tuple[Scenario, ...]) -> dict[int, str]:
    """An API token for each tenant of the scenarios, issued to its user (seed names the user as the tenant)."""
    from tenants import services as tenants
    from tenants.models import Tenant

    slugs = dict(Tenant.objects.values_list("pk", "slug"))
    ids = {tenant_id for scenario in scenarios for tenant_id in scenario.tenants}
    return {
        tenant_id: tenants.issue_token(tenant_id=tenant_id, username=slugs[tenant_id], name="bench-admission").secret
        for tenant_id in sorted(ids)
    }


def max_concurrent(intervals: list[tuple[float, float, int]]) -> int:
    """The most devices held at any instant; an end at the same instant as a start comes first."""
    edges = sorted([(start, 1, n) for start, _, n in intervals] + [(end, 0, -n) for _, end, n in intervals])
    held = peak = 0
    for _, _, delta in edges:
        held += delta
        peak = max(peak, held)
    return peak


@contextlib.contextmanager
def admission_worker() -> Iterator[int]:
    """The project's Celery worker, with `polychip up`'s options, on the bench's database and broker
    for the block; bench/_admission_worker.py reports its cycles' decisions."""
    import redis

    from bench._admission_worker import READY_KEY

    broker = redis.Redis.from_url(BROKER)
    broker.delete(READY_KEY)
    log_path = ROOT / "var" / "bench" / "admission-worker.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [
        *(sys.executable, "-m", "celery", "-A", "controlplane", "--quiet", "worker", "--loglevel", "warning"),
        *("--concurrency", str(WORKER_CONCURRENCY), "--without-mingle", "--without-gossip"),
        *("--include", "bench._admission_worker", "--hostname", "bench-admission@%h"),
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while int(broker.get(READY_KEY) or 0) < WORKER_CONCURRENCY:
            if worker.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the bench's Celery worker did not start; see {log_path}")
            time.sleep(0.1)
        yield worker.pid
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def forget_decisions() -> None:
    """Between trials: the decision lists read, and provisioning nobody will consume."""
    import redis

    from bench._admission_worker import UNCONSUMED

    broker = redis.Redis.from_url(BROKER)
    stale = [*broker.scan_iter("bench:decided:*", count=1000), UNCONSUMED]
    broker.delete(*stale)


def client_process(tasks: Any, results: Any, barrier: Any) -> None:
    """One of the 64 clients: a forked process with its own database connection, as a server
    process submits a job for a request. Per trial it waits at the barrier, submits (the submit
    asks for admission through the broker, once it commits), waits for the worker's decision, and
    maybe finishes its job; it reports when it submitted, and when the decision committed (wall
    clock: shared by every process)."""
    import redis
    from django.db import connection

    from bench._admission_worker import decided_key
    from jobs import services as jobs
    from jobs.models import JobState, TrainingJob
    from runtime.jobspec import parse_job_spec

    connection.close()  # never share the parent's socket
    gc.freeze()  # what the parent made after it froze (ProcessClients), without a collection that copies it all
    decisions = redis.Redis.from_url(BROKER)
    while (task := tasks.get()) is not None:
        tenant_id, size, priority, finish, admit = task
        # wait_for_capacity: bench-x's 8-device jobs exceed its NAU cap for good; they wait (and race) rather
        # than being refused at submit.
        spec = parse_job_spec(
            {
                "name": f"bench-{size}",
                "devices": size,
                "flavors": ["h100-sxm"],
                "priority": priority,
                "wait_for_capacity": True,
            }
        )
        barrier.wait()
        started = time.time()
        job = jobs.submit_job(tenant_id=tenant_id, user_id=None, spec=spec)
        if not admit:  # the floor: a decision cannot come before the submit that it decides has returned
            results.put((job.id, started, time.time()))
            continue
        popped = decisions.blpop([decided_key(job.id)], timeout=DECISION_TIMEOUT_S)
        if finish and popped and TrainingJob.objects.filter(pk=job.id, state=JobState.ADMITTED).exists():
            jobs.finish_job(job.id, JobState.SUCCEEDED, message="bench: done")
        results.put((job.id, started, float(popped[1]) if popped else None))
    connection.close()


class ProcessClients:
    """The 64 clients as forked processes (``client_process``), each calling ``jobs.services`` on a
    database connection of its own, as 64 server processes would."""

    name = "processes"

    def __init__(self) -> None:
        import multiprocessing

        from django.db import connection

        from controlplane.celery import freeze_loaded_objects

        context = multiprocessing.get_context("fork")
        self.barrier = context.Barrier(CONCURRENCY)
        self.results = context.Queue()
        self.inboxes = [context.Queue() for _ in range(CONCURRENCY)]
        connection.close()
        # The clients stand for server processes, which start clean and freeze what they loaded (as the
        # Celery worker does, controlplane.celery). Forked from the bench's own process, each would
        # otherwise inherit all it holds (the earlier scenarios, the seeding) and walk it at every
        # collection of the oldest generation: about 0.2 s of CPU each time, which is 64 clients at
        # once a stall of seconds for every submit of the burst (the p99 of 1-8 s seen in some runs).
        freeze_loaded_objects()
        self.processes = [
            context.Process(target=client_process, args=(inbox, self.results, self.barrier)) for inbox in self.inboxes
        ]
        for process in self.processes:
            process.start()

    def burst(self, tasks: list[tuple[Any, ...]]) -> list[tuple[int, float, float | None]]:
        for inbox, task in zip(self.inboxes, tasks, strict=True):
            inbox.put(task)
        return [self.results.get(timeout=600) for _ in tasks]

    def close(self) -> None:
        for inbox in self.inboxes:
            inbox.put(None)
        for process in self.processes:
            process.join(timeout=30)


class ApiClients:
    """The 64 clients as CI pipelines and portal users are: REST API clients, each with its tenant's
    token and a keep-alive connection of its own, against the project's ASGI server as `polychip up`
    starts it (one uvicorn process, its database connections pooled), which sends each submission's
    request for admission to the bench's worker. The clients are coroutines of one event loop here:
    real ones run elsewhere, and a light load generator takes the least CPU from the server. Per
    trial they are released together, each POSTs /api/v1/jobs, waits for the worker's decision, and
    half of them cancel their job through the API if it was admitted (which frees quota and asks for
    a cycle, as a finish does). The server's throttles are lifted: 64 submissions in a burst from
    one address would otherwise be refused, and the bench measures admission, not refusals."""

    name = "api"

    def __init__(self, tokens: dict[int, str]) -> None:
        from bench.api import serve

        self.server, self.url = serve(
            str(ROOT / "var" / "bench" / "admission-api"), database=BENCH_DB, broker=BROKER, cache=BROKER
        )
        self.tokens = tokens

    async def _client(self, task: tuple[Any, ...], go: Any, ready: Any) -> tuple[int, float, float | None]:
        import httpx
        import redis.asyncio

        from bench._admission_worker import decided_key

        tenant_id, size, priority, finish, admit = task
        body = {
            "name": f"bench-{size}",
            "devices": size,
            "flavors": ["h100-sxm"],
            "priority": priority,
            "wait_for_capacity": True,
        }
        headers = {"Authorization": f"Bearer {self.tokens[tenant_id]}"}
        decisions = redis.asyncio.Redis.from_url(BROKER)
        try:
            async with httpx.AsyncClient(base_url=self.url, headers=headers, timeout=60) as http:
                try:  # the connections open before the burst, as a warm client's are
                    (await http.get("/healthz")).raise_for_status()
                    await decisions.ping()
                finally:
                    ready.release()  # a client that failed here must not hold the others at the start
                await go.wait()
                started = time.time()
                response = await http.post("/api/v1/jobs", json=body)
                if response.status_code != 201:
                    raise SystemExit(f"bench: a submit answered {response.status_code}: {response.text[:300]}")
                job_id = int(response.json()["id"])
                if not admit:
                    return job_id, started, time.time()
                popped = await decisions.blpop([decided_key(job_id)], timeout=DECISION_TIMEOUT_S)
                if finish and popped and (await http.get(f"/api/v1/jobs/{job_id}")).json()["state"] == "admitted":
                    cancel = await http.post(f"/api/v1/jobs/{job_id}/cancel")
                    if cancel.status_code not in (200, 202, 409):  # 409: it ended (or was preempted) first
                        raise SystemExit(f"bench: a cancel answered {cancel.status_code}: {cancel.text[:300]}")
                return job_id, started, float(popped[1]) if popped else None
        finally:
            await decisions.aclose()

    async def _burst(self, tasks: list[tuple[Any, ...]]) -> list[tuple[int, float, float | None]]:
        import asyncio

        go, ready = asyncio.Event(), asyncio.Semaphore(0)
        clients = [asyncio.create_task(self._client(task, go, ready)) for task in tasks]
        for _ in tasks:
            await ready.acquire()
        go.set()
        return list(await asyncio.gather(*clients))

    def burst(self, tasks: list[tuple[Any, ...]]) -> list[tuple[int, float, float | None]]:
        import asyncio

        return asyncio.run(self._burst(tasks))

    def close(self) -> None:
        self.server.terminate()
        self.server.wait(timeout=30)


def one_client_latency(scenario: Scenario, samples: int) -> float:
    """The baseline: one client alone, submit to committed decision (by the worker), median in ms."""
    import redis

    from bench._admission_worker import decided_key
    from jobs import services as jobs
    from jobs.models import JobState
    from runtime.jobspec import parse_job_spec

    decisions = redis.Redis.from_url(BROKER)
    latencies = []
    spec = parse_job_spec({"name": "baseline", "devices": 1, "flavors": ["h100-sxm"]})
    for _ in range(samples):
        started = time.time()
        job = jobs.submit_job(tenant_id=scenario.tenants[0], user_id=None, spec=spec)
        popped = decisions.blpop([decided_key(job.id)], timeout=DECISION_TIMEOUT_S)
        if popped is None:
            raise SystemExit(f"the worker decided nothing of job {job.id} in {DECISION_TIMEOUT_S:.0f} s")
        latencies.append(float(popped[1]) - started)
        jobs.finish_job(job.id, JobState.SUCCEEDED, message="bench: baseline")
    forget_decisions()
    return statistics.median(latencies) * 1000


def _host_busy_s() -> float:
    """CPU seconds the host has spent on anything but idling and waiting for I/O, all cores together."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


class BurstCpu:
    """Where the CPU of the bursts went (from /proc, a quiet host assumed): the worker's processes,
    the API server's, PostgreSQL's, and the clients' (this process and the rest of its children),
    summed over the counted bursts, with their wall time."""

    def __init__(self, worker_pid: int | None, server_pid: int | None) -> None:
        self.roots = {"worker": worker_pid, "server": server_pid}
        self.spent: dict[str, float] = defaultdict(float)
        self.bursts = 0

    def _reading(self) -> dict[str, dict[int, float]]:
        """CPU seconds so far per process of each group, and the host's busy seconds and the clock
        (under pid 0)."""
        from bench.api import _cpu_s, _descendants, _postgres_pids

        trees = {name: set(_descendants(pid)) if pid else set() for name, pid in self.roots.items()}
        ours = set(_descendants(os.getpid())) - trees["worker"] - trees["server"]
        groups = {**trees, "postgres": set(_postgres_pids()), "clients": ours}
        reading = {name: {pid: _cpu_s(pid) for pid in pids} for name, pids in groups.items()}
        reading["host"] = {0: _host_busy_s()}
        reading["wall"] = {0: time.monotonic()}
        return reading

    @contextlib.contextmanager
    def burst(self) -> Iterator[None]:
        before = self._reading()
        yield
        after = self._reading()
        for name, processes in after.items():
            # Per process: one that ended during the burst (an autovacuum worker, a closed connection's
            # backend) takes its CPU with it, and must not count as negative CPU; one that started
            # during it spent all of its CPU in it.
            earlier = before[name]
            self.spent[name] += sum(spent - earlier.get(pid, 0.0) for pid, spent in processes.items())
        self.bursts += 1

    def figures(self) -> dict[str, float]:
        per_burst = {name: round(value / max(1, self.bursts), 3) for name, value in self.spent.items()}
        wall = per_burst.pop("wall")
        cores = os.cpu_count() or 1
        return {
            "burst_wall_s": wall,
            "burst_cpu_s": {k: v for k, v in per_burst.items() if k != "host" and (k != "server" or v)},
            "burst_host_busy_share": round(per_burst["host"] / (wall * cores), 3) if wall else 0.0,
        }


def run_trials(
    scenarios: tuple[Scenario, ...],
    trials: int,
    progress: Callable[[int], None],
    clients: ProcessClients | ApiClients,
    *,
    admit: bool = True,
    worker_pid: int | None = None,
) -> dict[str, Any]:
    from jobs import services as jobs
    from jobs.models import Allocation, JobEvent, JobState, TrainingJob

    rng = random.Random(3)
    submitted_at: dict[int, float] = {}
    decided_at: dict[int, float] = {}
    overshoots = leaked = admitted_total = preempted_total = 0
    peaks: dict[str, int] = {}
    cpu = BurstCpu(worker_pid, clients.server.pid if isinstance(clients, ApiClients) else None)

    def end_everything() -> None:
        for job_id in TrainingJob.objects.exclude(state__in=["succeeded", "failed", "cancelled"]).values_list(
            "pk", flat=True
        ):
            jobs.finish_job(job_id, JobState.CANCELLED, message="bench: trial over")

    try:
        # A first burst warms each client as a server process is warm when a submit arrives (its
        # connection open, its first queries planned): 64 cold starts at once made the first burst's tail
        # 3-4x the later ones' (submit only: p99 0.94-1.18 s, then 0.22-0.39 s). Its latencies are reported
        # apart (cold_burst_p99_ms), its jobs drawn from a generator of its own (the counted trials draw
        # what they drew before it existed), and it is checked for overshoots like every trial.
        warm_rng = random.Random(97)
        cold: list[float] = []
        for trial in range(-1, trials):
            scenario = scenarios[trial % len(scenarios)]
            draw = warm_rng if trial < 0 else rng
            since = TrainingJob.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
            tasks = [
                (draw.choice(scenario.tenants), draw.choice(SIZES), draw.choice((0, 0, 5)), draw.random() < 0.5, admit)
                for _ in range(CONCURRENCY)
            ]
            burst_submitted: dict[int, float] = {}
            burst_decided: dict[int, float] = {}
            with contextlib.ExitStack() as measuring:
                if trial >= 0:
                    measuring.enter_context(cpu.burst())
                results = clients.burst(tasks)
            for job_id, started, decided in results:
                burst_submitted[job_id] = started
                if decided is not None:  # None: not decided within DECISION_TIMEOUT_S
                    burst_decided[job_id] = decided
            if trial < 0:
                cold = [burst_decided[j] - t for j, t in burst_submitted.items() if j in burst_decided]
            else:
                submitted_at.update(burst_submitted)
                decided_at.update(burst_decided)
            end_everything()
            forget_decisions()
            leaked += Allocation.objects.filter(ended_at__isnull=True).count()
            spans: dict[int, list[tuple[float, float, int]]] = {t: [] for t in scenario.tenants}
            for tenant_id, started_at, ended_at in Allocation.objects.filter(job_id__gt=since).values_list(
                "job__tenant_id", "started_at", "ended_at"
            ):
                spans[tenant_id].append((started_at.timestamp(), ended_at.timestamp(), 1))
            over = False
            for tenant_id, cap in scenario.tenant_caps.items():
                peak = max_concurrent(spans[tenant_id])
                peaks[f"{scenario.name}:{tenant_id}"] = max(peaks.get(f"{scenario.name}:{tenant_id}", 0), peak)
                over |= peak > cap
            if scenario.cohort_cap is not None:
                peak = max_concurrent([s for tenant_spans in spans.values() for s in tenant_spans])
                peaks[f"{scenario.name}:cohort"] = max(peaks.get(f"{scenario.name}:cohort", 0), peak)
                over |= peak > scenario.cohort_cap
            overshoots += over
            if trial < 0:
                continue
            admitted_total += JobEvent.objects.filter(job_id__gt=since, to_state=JobState.ADMITTED).count()
            preempted_total += sum(TrainingJob.objects.filter(pk__gt=since).values_list("preemptions", flat=True))
            progress(trial + 1)
    finally:
        clients.close()
    latencies = [decided_at[j] - submitted_at[j] for j in submitted_at if j in decided_at]
    return {
        "trials": trials,
        "overshoots": overshoots,
        "leaked_reservations": leaked,
        "admission_p50_ms": round(statistics.median(latencies) * 1000, 2),
        "admission_p99_ms": round(percentile(latencies, 99) * 1000, 2),
        "cold_burst_p99_ms": round(percentile(cold, 99) * 1000, 2),
        "admission_latency_samples": len(latencies),
        "jobs_never_decided": len(submitted_at) - len(latencies),
        "peak_devices_held": peaks,
        "jobs_submitted": trials * CONCURRENCY,
        "admissions": admitted_total,
        "preemptions": preempted_total,
        **cpu.figures(),
    }


# --- the scheduling cycle at scale (pure) ----------------------------------------------------------

FLAVORS = ("h100-sxm", "a100-sxm", "ascend-910b", "tpu-v4", "mi300x", "v100-sxm")
FLAVOR_MILLI_NAU = (3170, 1000, 1026, 881, 4183, 401)


def synthetic_snapshot(jobs: int, tenants: int, devices: int, seed: int = 11) -> Any:
    """Half the devices busy with admitted work; every tenant in one of ``tenants // 20`` cohorts,
    with a NAU quota and a device quota on two flavors; jobs of 1 to 16 devices on 1 to 3 flavors."""
    from runtime.scheduling import AdmittedJob, FreeDevice, Limit, PendingJob, Snapshot, TenantQuota

    rng = random.Random(seed)
    per_node = 8
    pool = [
        FreeDevice(f"{FLAVORS[n % len(FLAVORS)]}-{n}/{i}", f"node-{n}", FLAVORS[n % len(FLAVORS)])
        for n in range(devices // per_node)
        for i in range(per_node)
    ]
    rng.shuffle(pool)
    nominal_devices = max(1, devices // tenants)
    quotas = {}
    for t in range(tenants):
        limits = {"nau": Limit(nominal=nominal_devices * 1500, borrowing_limit=nominal_devices * 1500)}
        for flavor in rng.sample(FLAVORS, 2):
            limits[flavor] = Limit(nominal=nominal_devices // 2 + 1, lending_limit=nominal_devices // 4)
        quotas[t] = TenantQuota(tenant_id=t, cohort=f"cohort-{t % max(1, tenants // 20)}", limits=limits)
    rates = {("synthetic-mlp", f): r for f, r in zip(FLAVORS, FLAVOR_MILLI_NAU, strict=True)}
    busy, free = pool[: devices // 2], pool[devices // 2 :]
    admitted = []
    job_id = 0
    while busy:
        size = min(len(busy), rng.choice((1, 2, 4, 8)))
        held, busy = busy[:size], busy[size:]
        demand: dict[str, int] = {}
        for d in held:
            demand[d.flavor] = demand.get(d.flavor, 0) + 1
            demand["nau"] = demand.get("nau", 0) + rates[("synthetic-mlp", d.flavor)]
        job_id += 1
        admitted.append(
            AdmittedJob(
                job_id, rng.randrange(tenants), rng.choice((0, 0, 5)), 0.0, tuple(held), demand, rng.random() < 0.33
            )
        )
    pending = [
        PendingJob(
            job_id=job_id + i + 1,
            tenant_id=rng.randrange(tenants),
            priority=rng.choice((0, 0, 0, 5, 10)),
            submitted_at=float(i),
            devices=rng.choice((1, 2, 4, 8, 16)),
            flavors=tuple(rng.sample(FLAVORS, rng.randint(1, 3))),
            job_class="synthetic-mlp",
        )
        for i in range(jobs)
    ]
    history = {t: {"nau": rng.uniform(0, nominal_devices * 1500)} for t in range(tenants)}
    return Snapshot(
        now=float(jobs), tenants=quotas, pending=pending, admitted=admitted, free=free, nau_rates=rates, history=history
    )


def cycle_times(trials: int) -> dict[str, Any]:
    """The pure decision, median of ``trials``, at the base size and with each count doubled."""
    from runtime.scheduling import schedule
    from runtime.scheduling.policies import get_policy

    def median_cycle(jobs: int, tenants: int, devices: int, policy: str | None = None) -> tuple[float, int, int]:
        snapshot = synthetic_snapshot(jobs, tenants, devices)
        times = []
        for _ in range(trials):
            started = time.perf_counter()
            result = schedule(snapshot, policy=get_policy(policy) if policy else None)
            times.append(time.perf_counter() - started)
        return statistics.median(times), len(result.admissions), len(result.preemptions)

    base, admitted, preempted = median_cycle(10_000, 200, 8_000)
    # Production follows a placement policy (POLYCHIP_PLACEMENT_POLICY, default aware): its LP over the
    # queue heads is part of every cycle.
    with_policy, _, _ = median_cycle(10_000, 200, 8_000, policy="aware")
    growth = {
        "jobs": median_cycle(20_000, 200, 8_000)[0] / base,
        "tenants": median_cycle(10_000, 400, 8_000)[0] / base,
        "devices": median_cycle(10_000, 200, 16_000)[0] / base,
    }
    doubled, _, _ = median_cycle(20_000, 400, 16_000)
    return {
        "cycle_s_10k_jobs": round(base, 4),
        "cycle_s_10k_jobs_aware_policy": round(with_policy, 4),
        "cycle_growth_on_doubling": round(doubled / base, 3),
        "cycle_growth_by_count": {k: round(v, 3) for k, v in growth.items()},
        "cycle_admitted_10k": admitted,
        "cycle_preempted_10k": preempted,
    }


def db_cycle(jobs: int = 10_000, tenants: int = 200, devices: int = 8_000) -> dict[str, Any]:
    """A whole cycle on PostgreSQL (lock, snapshot, decide, apply, record every waiting job's reason
    and place) with ``jobs`` queued for ``tenants`` on ``devices`` free devices of 6 flavors: the
    first cycle admits what fits; the next reclaims what was lent to borrowers in the first (only
    work admitted before a cycle can be preempted in it) and re-decides the rest."""
    from decimal import Decimal

    from controlplane.celery import freeze_loaded_objects
    from jobs import admission
    from jobs.models import Device, DeviceHealth, Flavor, JobState, Node, TrainingJob
    from tenants.models import Cohort, Quota, Tenant

    # The cycles run here as in a Celery worker process, which froze what it had loaded when it started
    # (before the pool and the jobs below existed). Its reads were compiled by the bench's earlier parts,
    # as a worker's are by its first cycle.
    freeze_loaded_objects()
    rng = random.Random(13)
    peaks = dict(zip(FLAVORS, (989, 312, 320, 275, 1307, 125), strict=True))
    flavor_rows = {
        name: Flavor.objects.update_or_create(
            name=name,
            defaults={
                "vendor": "bench",
                "kind": "gpu",
                "model": name,
                "peak_bf16_tflops": peak,
                "memory_gib": 80,
                "interconnect": "bench",
                "interconnect_gbps": 100,
                "torch_device_type": "cpu",
                "collective_backend": "gloo",
            },
        )[0]
        for name, peak in peaks.items()
    }
    # The concurrency trials' pool leaves the count: cordoned devices are never placed on.
    Device.objects.filter(node__name__startswith="h100-").update(health=DeviceHealth.CORDONED)
    nodes = Node.objects.bulk_create(
        Node(name=f"scale-{n}", flavor=flavor_rows[FLAVORS[n % len(FLAVORS)]]) for n in range(devices // 8)
    )
    Device.objects.bulk_create(
        Device(device_id=f"{node.name}/{i}", node=node, flavor=node.flavor, index=i) for node in nodes for i in range(8)
    )
    cohorts = [Cohort.objects.create(name=f"scale-{c}") for c in range(max(1, tenants // 20))]
    tenant_rows = Tenant.objects.bulk_create(
        Tenant(slug=f"scale-{t}", name=f"scale {t}", cohort=cohorts[t % len(cohorts)]) for t in range(tenants)
    )
    per_tenant = devices // tenants
    Quota.objects.bulk_create(
        Quota(tenant=t, resource="nau", nominal=Decimal(per_tenant * 1.5), borrowing_limit=Decimal(per_tenant * 1.5))
        for t in tenant_rows
    )
    TrainingJob.objects.bulk_create(
        TrainingJob(
            tenant=rng.choice(tenant_rows),
            name="scale",
            state=JobState.QUEUED,
            priority=rng.choice((0, 0, 0, 5, 10)),
            spec={"devices": rng.choice((1, 2, 4, 8, 16)), "flavors": rng.sample(FLAVORS, rng.randint(1, 3))},
            total_steps=100,
        )
        for _ in range(jobs)
    )
    figures: dict[str, Any] = {}
    for label in ("first", "next"):
        started = time.perf_counter()
        report = admission.run_admission_cycle()
        figures[f"cycle_db_{label}_s"] = round(time.perf_counter() - started, 3)
        figures[f"cycle_db_{label}_decide_s"] = round(report.decide_s, 3)
        figures[f"cycle_db_{label}_admitted"] = len(report.admitted)
    return figures


# --- fairness over a simulated week (pure) --------------------------------------------------------

WEEK_S = 7 * 24 * 3600.0
HOUR = 3600.0


def fairness_week(half_life_h: float, seed: int = 7) -> dict[str, Any]:
    """Two tenants with a nominal quota of 16 a100-sxm each, in one cohort of 32 devices that lend
    all and may borrow all. The steady tenant submits around the clock (Poisson arrivals every 30
    minutes on average, 1 to 8 devices, 1 to 5 hours: about 22 devices of demand); the bursty one
    submits twelve jobs of 2 to 8 devices and 1 to 3 hours at 09:00 each weekday, and nothing
    else. Seeded, so every run simulates the same week."""
    from runtime.scheduling import FreeDevice, Limit, TenantQuota
    from runtime.simulate import TraceJob, simulate

    rng = random.Random(seed)
    bursty, steady = 1, 2
    pool = [FreeDevice(f"a100-{n}/{i}", f"a100-{n}", "a100-sxm") for n in range(4) for i in range(8)]
    tenants = {
        t: TenantQuota(tenant_id=t, cohort="lab", limits={"a100-sxm": Limit(nominal=16)}) for t in (bursty, steady)
    }
    trace: list[TraceJob] = []
    t = rng.expovariate(2 / HOUR)
    while t < WEEK_S:
        size, hours = rng.choice((1, 2, 4, 8)), rng.uniform(1, 5)
        trace.append(TraceJob(len(trace) + 1, steady, t, size, ("a100-sxm",), hours * HOUR))
        t += rng.expovariate(2 / HOUR)
    for day in range(5):
        for _ in range(12):
            size, hours = rng.choice((2, 4, 8)), rng.uniform(1, 3)
            trace.append(TraceJob(len(trace) + 1, bursty, (day * 24 + 9) * HOUR, size, ("a100-sxm",), hours * HOUR))
    started = time.perf_counter()
    result = simulate(
        trace, pool, tenants, {("synthetic-mlp", "a100-sxm"): 1000}, half_life_s=half_life_h * HOUR, until_s=WEEK_S
    )

    def hours(seconds: float) -> float:
        return round(seconds / HOUR, 1)

    return {
        "fair_share_error_bursty": round(result.share_error(bursty), 4),
        "fair_share_error_steady": round(result.share_error(steady), 4),
        "fair_device_hours_got_vs_entitled": {
            "bursty": [hours(result.device_seconds[bursty]), hours(result.entitled_seconds[bursty])],
            "steady": [hours(result.device_seconds[steady]), hours(result.entitled_seconds[steady])],
        },
        "fair_preemptions": result.preemptions,
        "fair_sim_cycles": result.cycles,
        "fair_sim_s": round(time.perf_counter() - started, 2),
    }


def bar(label: str, total: int) -> Callable[[int], None]:
    started = time.perf_counter()

    def show(done: int) -> None:
        width = 30
        filled = width * done // total
        elapsed = time.perf_counter() - started
        print(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {elapsed:.0f}s", end="", flush=True)
        if done == total:
            print()

    return show


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few minutes: fewer trials, same figures")
    parser.add_argument("--trials", type=int, help="concurrency trials (default 1000, 6 with --quick)")
    args = parser.parse_args()
    trials = args.trials or (6 if args.quick else 1000)

    figures: dict[str, Any] = {}
    cycles = cycle_times(trials=1 if args.quick else 5)
    print(f"scheduling cycle: {cycles}")
    fair = fairness_week(half_life_h=12.0)
    print(f"fairness over a simulated week: {fair}")

    setup_django()
    scenarios = seed()
    tokens = api_tokens(scenarios)
    with admission_worker() as worker_pid:
        baseline_ms = one_client_latency(scenarios[0], 20 if args.quick else 200)
        progress = bar("concurrency trials", trials)
        figures.update(run_trials(scenarios, trials, progress, ProcessClients(), worker_pid=worker_pid))
        progress = bar("the same bursts through the REST API", trials)
        through_api = run_trials(scenarios, trials, progress, ApiClients(tokens), worker_pid=worker_pid)
    figures["admission_api_p50_ms"] = through_api["admission_p50_ms"]
    figures["admission_api_p99_ms"] = through_api["admission_p99_ms"]
    figures["admission_api_cold_burst_p99_ms"] = through_api["cold_burst_p99_ms"]
    figures["admission_api_overshoots"] = through_api["overshoots"]
    figures["admission_api_leaked_reservations"] = through_api["leaked_reservations"]
    figures["admission_api_jobs_never_decided"] = through_api["jobs_never_decided"]
    figures["admission_api_burst_wall_s"] = through_api["burst_wall_s"]
    figures["admission_api_burst_cpu_s"] = through_api["burst_cpu_s"]
    figures["admission_api_burst_host_busy_share"] = through_api["burst_host_busy_share"]
    # The floor with no worker: nothing but the submits (the request they send waits in the broker).
    floor_trials = max(6, trials // 10)
    floor = run_trials(
        scenarios, floor_trials, bar("the same bursts, submit only", floor_trials), ProcessClients(), admit=False
    )
    figures["submit_only_p50_ms"] = floor["admission_p50_ms"]
    figures["submit_only_p99_ms"] = floor["admission_p99_ms"]
    figures["submit_only_cold_burst_p99_ms"] = floor["cold_burst_p99_ms"]
    figures["admission_p50_ms_one_client"] = round(baseline_ms, 2)
    figures["admission_p50_vs_one_client"] = round(figures["admission_p50_ms"] / baseline_ms, 2)
    print("a whole cycle on PostgreSQL with 10,000 queued jobs, 200 tenants and 8,000 devices …", flush=True)
    figures.update(db_cycle())
    figures.update(cycles)
    figures.update(fair)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
