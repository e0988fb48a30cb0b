"""Monitoring at scale: what a scrape of /metrics costs with 1,000 jobs on 8,000 devices, how many series
it holds, the advisor's speed and accuracy, and how many log lines a job's life leaves.

    python bench/metrics.py [--quick]      # the last line printed is the JSON object

- ``series_total``, ``scrape_ms_p50``, ``scrape_ms_p99``, ``label_overflow``: a scratch PostgreSQL
  database holds 8,000 devices of 6 flavors (each with a health reading, error totals, most with a
  predictor score, some cordoned or failed, with health events), 50 tenants with quotas (half of them
  with budgets, their spend rated as beat's budget check does), and 1,000 jobs submitted as the API
  stores them; one admission cycle places what fits, the placed
  run with the figures their telemetry would leave (throughput, loss, balance, exchange), a tenth of
  the others ended, and every Celery task has counts. A scrape is the whole of the collector's work,
  what ``/metrics`` does, ``controlplane.metrics.scrape`` (every query and the text), timed in this process
  ``trials`` times, the first included. The series
  are the sample lines of the text; ``label_overflow`` is the overflow gauge's total in the last scrape.
- ``advise_ms_p50`` and ``advise_start_eta_error``: ``bench/_advisor.py`` (its docstring says how).
- ``log_lines_per_job``: ``polychip demo --no-job`` on the embedded default (SQLite, filesystem broker,
  local backend) at the default log level, then the demo job submitted and followed to ``succeeded``;
  the lines every process (server, worker, beat) wrote from submit to the end, over the jobs run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

DEVICES = 8_000
TENANTS = 50
JOBS = 1_000
TARGET_SCRAPE_P99_MS = 500


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def seed_world() -> dict[str, int]:
    """The scale world (see the module's docstring); returns what it made."""
    from django.utils import timezone

    from bench.admission import FLAVORS
    from billing import services as billing
    from billing.models import BillingAccount
    from controlplane.celery import app
    from controlplane.models import TaskCounter
    from controlplane.taskstats import RUNTIME_BUCKETS
    from jobs import admission
    from jobs.models import Device, DeviceEvent, DeviceHealth, Flavor, JobAttempt, JobState, Node, TrainingJob
    from tenants.models import Cohort, Quota, Tenant

    rng = random.Random(17)
    vendors = ("nvidia", "nvidia", "huawei", "google", "amd", "nvidia")
    flavors = {
        name: Flavor.objects.create(
            name=name,
            vendor=vendor,
            kind="gpu",
            model=name,
            peak_bf16_tflops=300 + 100 * n,
            memory_gib=80,
            interconnect="bench",
            interconnect_gbps=100,
            torch_device_type="cpu",
            collective_backend="gloo",
        )
        for n, (name, vendor) in enumerate(zip(FLAVORS, vendors, strict=True))
    }
    nodes = Node.objects.bulk_create(
        Node(name=f"node-{n:04d}", flavor=flavors[FLAVORS[n % len(FLAVORS)]]) for n in range(DEVICES // 8)
    )
    health = [DeviceHealth.HEALTHY] * 97 + [DeviceHealth.CORDONED] * 2 + [DeviceHealth.FAILED]
    Device.objects.bulk_create(
        Device(
            device_id=f"{node.name}/{i}",
            node=node,
            flavor=node.flavor,
            index=i,
            memory_gib=80,
            health=rng.choice(health),
            last_reading=[rng.uniform(40, 80), rng.uniform(100, 600), rng.randint(0, 2), rng.randint(0, 1), 0.02],
            readings_at=timezone.now(),
            ecc_errors_total=rng.randint(0, 500),
            pcie_errors_total=rng.randint(0, 50),
            failure_score=rng.random() if rng.random() < 0.8 else None,
        )
        for node in nodes
        for i in range(8)
    )
    cordoned = Device.objects.exclude(health=DeviceHealth.HEALTHY)
    DeviceEvent.objects.bulk_create(
        DeviceEvent(device=d, kind=DeviceEvent.Kind.HEALTH, from_health="healthy", to_health=d.health, by="ops")
        for d in cordoned
    )
    cohort = Cohort.objects.create(name="bench-metrics")
    tenants = Tenant.objects.bulk_create(
        Tenant(slug=f"tenant-{t:02d}", name=f"Tenant {t}", cohort=cohort) for t in range(TENANTS)
    )
    Quota.objects.bulk_create(
        Quota(tenant=t, resource="nau", nominal=Decimal(200), borrowing_limit=Decimal(200)) for t in tenants
    )
    BillingAccount.objects.bulk_create(
        BillingAccount(tenant=t, soft_budget=Decimal(5000), hard_budget=Decimal(8000)) for t in tenants[::2]
    )
    TrainingJob.objects.bulk_create(
        TrainingJob(
            tenant=rng.choice(tenants),
            name=f"job-{n}",
            state=JobState.QUEUED,
            priority=rng.choice((-5, 0, 0, 0, 10)),
            spec={
                "devices": rng.choice((1, 2, 4, 8, 16)),
                "flavors": rng.sample(FLAVORS, rng.randint(1, 3)),
                "workload": {"kind": "builtin", "model": "synthetic-mlp", "global_batch": 96},
            },
            total_steps=1000,
        )
        for n in range(JOBS)
    )
    admission.run_admission_cycle()
    placed = list(TrainingJob.objects.filter(state=JobState.ADMITTED).values_list("pk", flat=True))
    now = timezone.now()
    TrainingJob.objects.filter(pk__in=placed).update(
        state=JobState.RUNNING,
        attempt=1,
        steps_done=400,
        samples_per_s=1500.0,
        last_loss=0.8,
        balance_stats={"efficiency": 0.97},
        comm_stats={"last_step": {"step": 400, "collective_s": 0.02, "comm_bytes_cross": 4_000_000}},
    )
    JobAttempt.objects.filter(job_id__in=placed).update(first_step_at=now - timedelta(minutes=10))
    queued = list(TrainingJob.objects.filter(state=JobState.QUEUED).values_list("pk", flat=True))
    TrainingJob.objects.filter(pk__in=queued[::10]).update(state=JobState.SUCCEEDED)
    app.loader.import_default_modules()
    TaskCounter.objects.bulk_create(
        TaskCounter(
            task=name,
            succeeded=1000,
            failed=3,
            runtime_sum_s=50.0,
            runtime_buckets=[min(1003, 100 * (i + 1)) for i in range(len(RUNTIME_BUCKETS))] + [1003],
        )
        for name in sorted(app.tasks)
        if not name.startswith("celery.")
    )
    billing.check_budgets_now()  # what beat does every 30 s: the budgeted tenants' spend, for the scrape
    return {"devices": Device.objects.count(), "tenants": len(tenants), "running": len(placed)}


def scrape_figures(trials: int) -> dict[str, Any]:
    from bench.admission import setup_django

    setup_django(db="polychip_bench_metrics", var="bench-metrics")
    world = seed_world()
    from controlplane.metrics import scrape

    times, text = [], ""
    for trial in range(trials):
        started = time.perf_counter()
        text = scrape().decode()
        times.append((time.perf_counter() - started) * 1000)
        print(f"  scrape {trial + 1}/{trials}: {times[-1]:.0f} ms", flush=True)
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    overflow = sum(
        float(line.rsplit(" ", 1)[1]) for line in samples if line.startswith("polychip_metrics_label_overflow{")
    )
    print(f"  world: {world}; {len(text) / 1e6:.1f} MB of text", flush=True)
    return {
        "series_total": len(samples),
        "scrape_ms_p50": round(statistics.median(times), 1),
        "scrape_ms_p99": round(percentile(times, 99), 1),
        "label_overflow": int(overflow),
    }


def log_lines_per_job(jobs: int) -> float:
    from bench.skeleton import _quiet_follow, cli, free_port
    from controlplane.cli.api import Api as Client
    from controlplane.cli.server import DEMO_SPEC

    with tempfile.TemporaryDirectory(prefix="polychip-bench-logs-") as scratch:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in {"DATABASE_URL", "CELERY_BROKER_URL", "CHANNEL_REDIS_URL", "POLYCHIP_LOG_LEVEL"}
        }
        env.update(POLYCHIP_VAR_DIR=scratch, POLYCHIP_PUBLIC_URL=url)
        cli(env, "demo", "--no-job", "--port", str(port))
        logs = Path(scratch) / "log"

        def lines() -> list[str]:
            return [line for log in sorted(logs.glob("*.log")) for line in log.read_text(errors="replace").splitlines()]

        try:
            client = Client(url, (Path(scratch) / "demo-token").read_text().strip())
            counts = []
            for _ in range(jobs):
                before = set(lines())
                job = _quiet_follow(client, client.submit(DEMO_SPEC)["id"])
                if job["state"] != "succeeded":
                    raise SystemExit(f"demo job ended {job['state']}: {job['failure_reason']}")
                time.sleep(2)  # teardown and metering finish after the state changes
                new = [line for line in lines() if line not in before]
                counts.append(len(new))
                print(f"  demo job {job['id']}: {counts[-1]} log lines", flush=True)
                for line in new:
                    print(f"    {line[:160]}", flush=True)
        finally:
            cli(env, "down")
    return round(statistics.mean(counts), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10 scrapes, one demo job, the advisor's quick world")
    args = parser.parse_args()
    trials, jobs = (10, 1) if args.quick else (40, 3)

    figures: dict[str, Any] = {"quick": args.quick}
    print("log lines of a demo job (embedded default, default level)", flush=True)
    figures["log_lines_per_job"] = log_lines_per_job(jobs)
    print("the advisor (bench/_advisor.py)", flush=True)
    from bench._advisor import measure

    figures.update(measure(args.quick))
    print(f"scrapes of /metrics: {JOBS} jobs, {TENANTS} tenants, {DEVICES} devices (PostgreSQL)", flush=True)
    figures.update(scrape_figures(trials))
    figures["scrape_p99_target_met"] = figures["scrape_ms_p99"] <= TARGET_SCRAPE_P99_MS
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
