"""Admission figures: exactness under concurrency, cycle time at scale, fairness over a week.

    python bench/admission.py [--quick]

- overshoots, leaked_reservations, admission_p50_ms, admission_p99_ms: on PostgreSQL (a scratch
  database, polychip_bench, dropped and made again), each trial starts 64 threads at a barrier;
  each submits a job of 1, 2, 4 or 8 devices against a tenant quota of 8 through
  ``jobs.services.submit_job`` and runs an admission cycle, as the Celery task would, and half of
  them then finish their job if it was admitted, so that quota frees up while others admit. After a
  trial every job is ended. An overshoot is any instant at which the tenant held more than 8
  devices, found by a sweep over the trial's allocation intervals; a leaked reservation is an
  allocation still open once every job has ended. Admission latency is the client's time from
  the submit call to the end of the admission cycle it triggered (queued behind the other
  cycles for the admission lock), whether the job was admitted or left waiting with a reason.
- cycle_s_10k_jobs, cycle_growth_on_doubling: the pure scheduling cycle (``runtime.scheduling``)
  over a synthetic snapshot of 10,000 pending jobs, 200 tenants in 10 cohorts and 8,000 devices of
  6 flavors, half of them busy; then with each count doubled. Growth is the ratio of the two
  median cycle times (2.0 would be linear).
- fair_share_error_*: the simulator (``runtime.simulate``) runs a week of two tenants with equal
  quotas in one cohort, one submitting in daily bursts and one steadily, through the same
  scheduler; each tenant's device-hours are compared with its entitlement (max-min water-filling
  of the pool over the demand of the moment): |got - entitled| / entitled.
The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BENCH_DB = "polychip_bench"
PG = os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
QUOTA = 8
SIZES = (1, 2, 4, 8)
CONCURRENCY = 64


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


# --- exactness under concurrency (PostgreSQL) -----------------------------------------------------


def setup_django() -> None:
    import psycopg

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (BENCH_DB,),
        )
        conn.execute(f"DROP DATABASE IF EXISTS {BENCH_DB}")
        conn.execute(f"CREATE DATABASE {BENCH_DB}")
    os.environ["DATABASE_URL"] = f"{PG}/{BENCH_DB}"
    # Tasks are published to an in-process queue that nobody consumes: the bench itself runs the
    # admission cycles, and no job is launched.
    os.environ["CELERY_BROKER_URL"] = "memory://"
    os.environ.setdefault("POLYCHIP_VAR_DIR", str(ROOT / "var" / "bench"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def seed() -> int:
    from django.conf import settings

    from jobs import services as jobs
    from runtime.inventory import NodeSpec, Pool, load_pool
    from tenants.models import Quota
    from tenants.services import ensure_tenant_with_user

    catalog = load_pool(settings.POLYCHIP_POOL_FILE).flavors
    jobs.sync_pool(Pool(flavors=catalog, nodes=tuple(NodeSpec(f"h100-{i}", "h100-sxm", 8) for i in range(3))))
    tenant = ensure_tenant_with_user(slug="bench", name="Bench", username="bench", password="bench-password-1")
    Quota.objects.update_or_create(tenant_id=tenant.id, resource="h100-sxm", defaults={"nominal": QUOTA})
    return tenant.id


def max_concurrent(intervals: list[tuple[float, float, int]]) -> int:
    """The most devices held at any instant; an end at the same instant as a start comes first."""
    edges = sorted([(start, 1, n) for start, _, n in intervals] + [(end, 0, -n) for _, end, n in intervals])
    held = peak = 0
    for _, _, delta in edges:
        held += delta
        peak = max(peak, held)
    return peak


def run_trials(tenant_id: int, trials: int, progress: Callable[[int], None]) -> dict[str, Any]:
    from django.db import connection

    from jobs import services as jobs
    from jobs.models import Allocation, JobState, TrainingJob
    from runtime.jobspec import parse_job_spec

    rng = random.Random(3)
    latencies: list[float] = []
    lock = threading.Lock()
    overshoots = leaked = admitted_total = 0
    peak_seen = 0

    def client(size: int, finish: bool, barrier: threading.Barrier) -> None:
        spec = parse_job_spec({"name": f"bench-{size}", "devices": size, "flavors": ["h100-sxm"]})
        barrier.wait()
        started = time.perf_counter()
        job = jobs.submit_job(tenant_id=tenant_id, user_id=None, spec=spec)
        jobs.admit_queued_jobs()
        elapsed = time.perf_counter() - started
        with lock:
            latencies.append(elapsed)
        if finish:
            jobs.finish_job(job.id, JobState.SUCCEEDED, message="bench: done")

    def end_everything() -> None:
        for job_id in TrainingJob.objects.exclude(state__in=["succeeded", "failed", "cancelled"]).values_list(
            "pk", flat=True
        ):
            jobs.finish_job(job_id, JobState.CANCELLED, message="bench: trial over")

    with ThreadPoolExecutor(max_workers=CONCURRENCY) as pool:
        for trial in range(trials):
            since = TrainingJob.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
            barrier = threading.Barrier(CONCURRENCY)
            futures = [pool.submit(client, rng.choice(SIZES), rng.random() < 0.5, barrier) for _ in range(CONCURRENCY)]
            for future in futures:
                future.result()
            end_everything()
            leaked += Allocation.objects.filter(ended_at__isnull=True).count()
            spans = [
                (a.started_at.timestamp(), a.ended_at.timestamp(), 1)
                for a in Allocation.objects.filter(job_id__gt=since)
            ]
            peak = max_concurrent(spans)
            peak_seen = max(peak_seen, peak)
            overshoots += peak > QUOTA
            admitted_total += TrainingJob.objects.filter(pk__gt=since, admitted_at__isnull=False).count()
            progress(trial + 1)
        pool.map(lambda _: connection.close(), range(CONCURRENCY))
    return {
        "trials": trials,
        "overshoots": overshoots,
        "leaked_reservations": leaked,
        "admission_p50_ms": round(statistics.median(latencies) * 1000, 2),
        "admission_p99_ms": round(percentile(latencies, 99) * 1000, 2),
        "peak_devices_held": peak_seen,
        "jobs_admitted": admitted_total,
        "jobs_submitted": trials * CONCURRENCY,
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
            AdmittedJob(job_id, rng.randrange(tenants), rng.choice((0, 0, 5)), 0.0, tuple(held), demand, False)
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
    return Snapshot(now=float(jobs), tenants=quotas, pending=pending, admitted=admitted, free=free, nau_rates=rates)


def cycle_times(trials: int) -> dict[str, Any]:
    from runtime.scheduling import schedule

    def median_cycle(scale: int) -> tuple[float, int]:
        snapshot = synthetic_snapshot(10_000 * scale, 200 * scale, 8_000 * scale)
        times = []
        admitted = 0
        for _ in range(trials):
            started = time.perf_counter()
            result = schedule(snapshot)
            times.append(time.perf_counter() - started)
            admitted = len(result.admissions)
        return statistics.median(times), admitted

    base, admitted = median_cycle(1)
    doubled, admitted_doubled = median_cycle(2)
    return {
        "cycle_s_10k_jobs": round(base, 4),
        "cycle_s_20k_jobs": round(doubled, 4),
        "cycle_growth_on_doubling": round(doubled / base, 3),
        "cycle_admitted_10k": admitted,
        "cycle_admitted_20k": admitted_doubled,
    }


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
    parser.add_argument("--quick", action="store_true", help="under a minute: fewer trials, same figures")
    parser.add_argument("--trials", type=int, help="concurrency trials (default 1000, 20 with --quick)")
    args = parser.parse_args()
    trials = args.trials or (20 if args.quick else 1000)

    figures: dict[str, Any] = {}
    cycles = cycle_times(trials=3 if args.quick else 7)
    print(f"scheduling cycle: {cycles}")
    fair = fairness_week(half_life_h=12.0)
    print(f"fairness over a simulated week: {fair}")

    setup_django()
    tenant_id = seed()
    figures.update(run_trials(tenant_id, trials, bar("concurrency trials", trials)))
    figures.update(cycles)
    figures.update(fair)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
