"""The advisor's figures, for ``bench/metrics.py``: how long an advice takes, and how close its start
estimate comes to the start that admission then gives.

    python bench/_advisor.py [--quick]      # the last line printed is the JSON object

``measure(quick)`` returns ``{"advise_ms_p50": float, "advise_start_eta_error": float}``. It runs the
measurement in a child process on a scratch SQLite database in a temporary folder (the embedded
default: no server, no environment), so that the caller's Django set-up and database are untouched.

The world: a pool of four flavors (the demo catalog; 8 devices a node), tenants with NAU quotas in one
cohort (each may borrow what the others leave), a throughput table benchmarked for the one job class,
and a queue built by real admission: jobs of 1 to 8 devices submitted one by one on a virtual clock and
admitted by ``run_admission_cycle`` while they fit; the admitted ones run at the table's speed on the
devices they got, with part of their steps done; the rest wait. Full: 384 devices, 10 tenants, 420 jobs.
Quick: 192 devices, 6 tenants, 200 jobs.

- ``advise_ms_p50``: the median wall time of ``jobs.services.advise_submit`` on that world (every part:
  admission now, the forecast of the start, batch, checkpoints, comm, cost), over probe specs of 1 to 8
  devices of different tenants, priorities and flavors.
- ``advise_start_eta_error``: the median, over the probes, of ``|eta - observed| / observed_wait``. For
  each probe the world is restored (a copy of the database), the advisor asked at t0 for the probe's
  expected start (eta - t0 is its estimated wait), the probe submitted at t0, and the queue replayed on
  a virtual clock through the production code: every job ends at its planned time (its steps left at
  the speed it runs, the table's speed on the devices admission gave it, which is also what the
  advisor assumes), ``finish_job`` ends it, and ``run_admission_cycle`` runs after every batch of ends
  (and again at once after a preemption, up to 20 times at one moment) until the probe is admitted:
  ``observed`` is that moment, ``observed_wait`` = observed - t0. Speeds are exact here by construction,
  so the figure measures the advisor's model of the queue (what it replays of admission, fair share held
  as of t0, evicted jobs not brought back), not the accuracy of speed estimates: most probes come out
  exact, and the median is often 0; each probe's figures and the mean go to stderr. A probe the advisor
  gave no estimate counts as an error of 1.0; a probe that starts at once is left out (nothing to
  estimate). 8 probes quick, 10 full; the latency is timed over each of them 2 (quick) or 5 times.

Quick runs in about 25 s, full in about 2 minutes (most of it admission cycles on SQLite in the replays).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
JOB_CLASS = "synthetic-mlp"
# Per-device samples/s of the job class on one device of each flavor (the benchmark seeded).
SPEEDS = {"h100-sxm": 400.0, "a100-sxm": 130.0, "ascend-910b": 125.0, "tpu-v4": 110.0}
SIZES = (1, 1, 2, 2, 4, 8)
# Cycles at one moment before the replay calls it a preemption loop (``runtime.simulate`` has the same bound).
CYCLES_PER_INSTANT = 20


class Clock:
    """The virtual clock that ``django.utils.timezone.now`` reads while the bench runs."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def measure(quick: bool) -> dict[str, float]:
    """The two figures, measured in a child process on a scratch database (see the module's docstring)."""
    services = ("DATABASE_URL", "CELERY_", "CHANNEL_", "POLYCHIP_")
    env = {name: value for name, value in os.environ.items() if not name.startswith(services)}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), *(["--quick"] if quick else [])],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench/_advisor.py failed ({done.returncode}):\n{done.stderr[-4000:]}")
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


# --- the world ---------------------------------------------------------------------------------------


def setup_django(scratch: Path) -> None:
    os.environ.pop("DATABASE_URL", None)
    os.environ["POLYCHIP_VAR_DIR"] = str(scratch)
    # Tasks go to an in-process queue that nobody reads: the bench runs admission itself, and launches nothing.
    os.environ["CELERY_BROKER_URL"] = "memory://"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import logging

    import django

    django.setup()
    for name in ("kombu", "jobs", "billing", "django.request"):
        logging.getLogger(name).setLevel(logging.ERROR)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def build_world(clock: Clock, *, nodes_per_flavor: int, tenants: int, jobs: int, rng: random.Random) -> list[int]:
    """The pool, the tenants, the table and the queue (see the module's docstring); the tenants' ids."""
    from django.conf import settings

    from jobs import services
    from jobs.models import JobState, TrainingJob
    from runtime.inventory import NodeSpec, Pool, load_pool
    from runtime.jobspec import parse_job_spec
    from runtime.throughput import Source, ThroughputEntry
    from tenants.models import Cohort, Quota, Tenant
    from tenants.services import ensure_tenant_with_user

    catalog = load_pool(settings.POLYCHIP_POOL_FILE).flavors
    nodes = tuple(
        NodeSpec(f"{flavor}-{i}", flavor, 8, rack=f"r{i % 4}") for flavor in SPEEDS for i in range(nodes_per_flavor)
    )
    services.sync_pool(Pool(flavors=catalog, nodes=nodes))
    services.store_benchmarks(
        ThroughputEntry(JOB_CLASS, flavor, 1, speed, Source.BENCHMARK, 20) for flavor, speed in SPEEDS.items()
    )
    cohort = Cohort.objects.create(name="bench-advisor")
    pool_nau = sum(8 * nodes_per_flavor * rate for rate in (3.17, 1.0, 1.026, 0.881))
    ids = []
    for t in range(tenants):
        ref = ensure_tenant_with_user(slug=f"t{t}", name=f"t{t}", username=f"t{t}", password="bench-password-1")
        Tenant.objects.filter(pk=ref.id).update(cohort=cohort)
        Quota.objects.create(tenant_id=ref.id, resource="nau", nominal=round(pool_nau / tenants, 3))
        ids.append(ref.id)
    flavor_sets = (["h100-sxm"], ["a100-sxm", "h100-sxm"], ["ascend-910b"], ["tpu-v4", "ascend-910b"], list(SPEEDS))
    for i in range(jobs):
        clock.advance(1.0)
        spec = {
            "name": f"job-{i}",
            "devices": rng.choice(SIZES),
            "flavors": rng.choice(flavor_sets),
            "priority": rng.choice((0, 0, 0, 10)),
            "workload": {"steps": rng.randrange(300, 4000), "global_batch": rng.choice((96, 192, 384))},
        }
        services.submit_job(tenant_id=rng.choice(ids), user_id=None, spec=parse_job_spec(spec))
        started = services.run_admission_cycle().admitted
        run(started, clock, done_share=rng.random)
    queued = TrainingJob.objects.filter(state=JobState.QUEUED).count()
    assert queued > jobs // 3, f"only {queued} of {jobs} jobs wait: the queue is too short to measure"
    return ids


def gang_speed(job_id: int) -> float:
    """The samples/s a job trains at on the devices it holds: the table's per-device speeds, summed."""
    from jobs.models import Allocation

    flavors = Allocation.objects.filter(job_id=job_id, ended_at__isnull=True).values_list(
        "device__flavor__name", flat=True
    )
    return sum(SPEEDS[flavor] for flavor in flavors)


def run(job_ids: Any, clock: Clock, *, done_share: Any = None) -> None:
    """Jobs admission just started: running, at their devices' speed, with ``done_share()`` of their steps done."""
    from jobs.models import JobState, TrainingJob

    for job_id in job_ids:
        job = TrainingJob.objects.get(pk=job_id)
        done = int(job.total_steps * done_share() * 0.9) if done_share else 0
        TrainingJob.objects.filter(pk=job_id).update(
            state=JobState.RUNNING, samples_per_s=gang_speed(job_id), steps_done=done, started_at=clock.now
        )


def planned_ends(clock: Clock) -> dict[int, datetime]:
    """When each running job ends: its steps left at the speed it runs."""
    from jobs.models import JobState, TrainingJob

    rows = TrainingJob.objects.filter(state=JobState.RUNNING).values_list(
        "pk", "steps_done", "total_steps", "samples_per_s", "spec__workload__global_batch"
    )
    return {pk: clock.now + timedelta(seconds=(total - done) * batch / rate) for pk, done, total, rate, batch in rows}


# --- the figures -------------------------------------------------------------------------------------


def probes(tenant_ids: list[int], count: int, rng: random.Random) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for i in range(count):
        spec = {
            "name": f"probe-{i}",
            "devices": SIZES[i % len(SIZES)],
            "flavors": [["h100-sxm"], ["a100-sxm", "h100-sxm"], ["tpu-v4", "ascend-910b"], list(SPEEDS)][i % 4],
            # Half of them first in their tenant's queue: the estimate then rests on fair share and devices.
            "priority": 20 if i % 2 else 0,
            "workload": {"steps": 500, "global_batch": 96},
        }
        out.append((tenant_ids[i % len(tenant_ids)], spec))
    return out


def replay_until_started(clock: Clock, probe_id: int, *, max_cycles: int = 20_000) -> datetime:
    """Play the queue forward through admission until ``probe_id`` is admitted; that moment.

    After a preemption the next cycle runs at the same moment (the job that made room is admitted by
    it), at most ``CYCLES_PER_INSTANT`` times: beyond that the scheduler is evicting in a loop, and the
    replay goes on to the next end, as the forecast does."""
    from jobs import services
    from jobs.models import JobState

    ends = planned_ends(clock)
    at_this_instant = 0
    for _ in range(max_cycles):
        report = services.run_admission_cycle()
        run(report.admitted, clock)
        for job_id in report.preempted:
            ends.pop(job_id, None)
        if probe_id in report.admitted:
            return clock.now
        ends.update({pk: at for pk, at in planned_ends(clock).items() if pk in report.admitted})
        at_this_instant += 1
        if report.preempted and at_this_instant < CYCLES_PER_INSTANT:
            continue
        if report.preempted:
            print(f"  preemption loop at {clock.now:%H:%M:%S}: moving on to the next end", file=sys.stderr)
        if not ends:
            raise RuntimeError(f"probe {probe_id} never started: nothing is left to end")
        clock.now, at_this_instant = min(ends.values()), 0
        for job_id in [pk for pk, at in ends.items() if at <= clock.now]:
            services.finish_job(job_id, JobState.SUCCEEDED)
            del ends[job_id]
    raise RuntimeError(f"probe {probe_id} did not start within {max_cycles} cycles")


def copy_database(source: Path, target: Path) -> None:
    """The whole SQLite database, its write-ahead log included, with Django's connection closed."""
    import sqlite3

    from django.db import connections

    connections.close_all()
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)


def main(quick: bool) -> dict[str, float]:
    rng = random.Random(22)
    clock = Clock(T0)
    with (
        tempfile.TemporaryDirectory(prefix="polychip-advisor-") as scratch_dir,
        mock.patch("django.utils.timezone.now", clock),
    ):
        scratch = Path(scratch_dir)
        setup_django(scratch)
        from django.conf import settings

        from jobs import services
        from runtime.jobspec import parse_job_spec

        size = (
            {"nodes_per_flavor": 6, "tenants": 6, "jobs": 200}
            if quick
            else {
                "nodes_per_flavor": 12,
                "tenants": 10,
                "jobs": 420,
            }
        )
        tenant_ids = build_world(clock, rng=rng, **size)
        database = Path(settings.DATABASES["default"]["NAME"])
        world, world_time = scratch / "world.sqlite3", clock.now
        copy_database(database, world)

        cases = probes(tenant_ids, 8 if quick else 10, rng)
        latencies = []
        for tenant_id, spec in cases * (2 if quick else 5):
            started = time.perf_counter()
            services.advise_submit(tenant_id=tenant_id, spec=parse_job_spec(spec))
            latencies.append((time.perf_counter() - started) * 1000)

        errors = []
        for tenant_id, spec in cases:
            copy_database(world, database)
            clock.now = world_time
            parsed = parse_job_spec(spec)
            eta = services.advise_submit(tenant_id=tenant_id, spec=parsed).start.expected_at
            probe = services.submit_job(tenant_id=tenant_id, user_id=None, spec=parsed).id
            observed = replay_until_started(clock, probe)
            wait_s = (observed - world_time).total_seconds()
            if wait_s <= 0:
                continue  # it started at once: nothing to estimate
            error = 1.0 if eta is None else abs((eta - observed).total_seconds()) / wait_s
            errors.append(error)
            print(
                f"probe {spec['devices']} x {'|'.join(spec['flavors'])} priority {spec['priority']}: "
                f"estimated {'-' if eta is None else f'{(eta - world_time).total_seconds():,.0f} s'}, "
                f"observed {wait_s:,.0f} s, error {error:.3f}",
                file=sys.stderr,
            )
        from django.db import connections

        connections.close_all()
    if errors:
        print(f"start estimates: {len(errors)} probes, mean error {statistics.fmean(errors):.3f}", file=sys.stderr)
    return {
        "advise_ms_p50": round(statistics.median(latencies), 1),
        "advise_start_eta_error": round(statistics.median(errors), 4) if errors else 1.0,
    }


if __name__ == "__main__":
    # Run as a script, bench/ heads sys.path, and bench/kubernetes.py would shadow the kubernetes client.
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
    print(json.dumps(main(quick="--quick" in sys.argv[1:])))
