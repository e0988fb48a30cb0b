"""Hardening figures (issue 17): hostile input, a flooding tenant, guessed passwords, a loaded host.

    python bench/hardening.py [--quick]

- fuzz_requests, fuzz_5xx: a seeded run of malformed and oversized input over every route of the URL
  router (path parameters, query strings, bodies: deep nesting, NUL and lone surrogates, numbers past
  their columns, wrong types, broken JSON, other content types), as nobody, as a tenant's owner (an API
  token), as an operator (a session) and as a job's worker (its ingest token), in process against a
  scratch PostgreSQL database (polychip_bench_hardening, dropped and made again). A 5xx is a failure.
- ingest_poison_accepted: telemetry figures beyond what the job's devices can do (1e300 samples/s, 9x the
  flavor's benchmark, a faster flavor claimed than the device held, a 2**31 step) that were accepted.
- tenant_flood_cycle_ms beside baseline_cycle_ms: the median admission cycle with three tenants of 20
  waiting jobs each, then with one of them holding 10,000 (2,000 with --quick) waiting jobs.
- login_lockout_after: the wrong password at which the portal's sign-in locks (429 from then on, for the
  right password too).
- start_grace_kills, healthy_devices_marked_failed, stray_processes_after_down: the embedded default
  (`polychip demo --no-job` in a scratch folder) on a host loaded with 8 CPU-bound processes (4 with
  --quick); 5 jobs (2) of 2 devices; a start-grace kill is an attempt that failed before its ranks
  reported; then `polychip down`, and the processes of its runs still alive.
- platform_failures_billed: usage records, of attempts that a device or the platform ended (a SIGKILL
  nobody on the platform sent, a lost heartbeat, a lost run; 6 trials, 30 without --quick, through the
  recovery path the observe sweep takes), that carry no credit.
- restore_loss_gap_max (and _median, restore_trials): 10 kill trials (4 with --quick) on the embedded
  default, SIGKILL of one rank at a random step or right after a checkpoint step (the saver writing),
  recovery alone; the final model's loss over the whole training set against an uninterrupted run's, as
  |L_trial - L_reference| / L_reference. Target: at most 0.01.
The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, bench/ heads sys.path, and bench/kubernetes.py would shadow the kubernetes client.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.admission import setup_django as setup_scratch_django  # noqa: E402
from bench.skeleton import cli, free_port  # noqa: E402
from tests.processes import processes_mentioning  # noqa: E402

BENCH_DB = "polychip_bench_hardening"
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def say(line: str) -> None:
    print(line, flush=True)


def setup_django() -> None:
    os.environ["POLYCHIP_PASSWORD_HASHERS"] = "django.contrib.auth.hashers.MD5PasswordHasher"
    # The fuzz sends thousands of requests from one address: the throttles would answer most of them
    # 429 before the view read them, which is not what is being measured.
    os.environ["POLYCHIP_RATE_PER_TOKEN"] = os.environ["POLYCHIP_RATE_PER_ADDRESS"] = "1000000/min"
    os.environ["POLYCHIP_RATE_INGEST_PER_JOB"] = "1000000/min"
    setup_scratch_django(BENCH_DB, "bench-hardening")
    import logging

    for name in ("django.request", "django.security", "kombu", "jobs", "axes"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


# --- the world the requests meet ---------------------------------------------------------------


def seed_world() -> dict[str, Any]:
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from jobs import services as jobs
    from jobs.models import Allocation, Device, JobState, TrainingJob
    from runtime.inventory import load_pool
    from runtime.jobspec import parse_job_spec
    from runtime.throughput import Source, ThroughputEntry
    from tenants import services as tenants

    jobs.sync_pool(load_pool(settings.POLYCHIP_POOL_FILE))
    jobs.store_benchmarks([ThroughputEntry("synthetic-mlp", "tpu-v4", 1, 250.0, Source.BENCHMARK, 40)])
    refs = []
    for slug in ("acme", "globex", "initech"):
        ref = tenants.ensure_tenant_with_user(slug=slug, name=slug, username=f"{slug}-user", password="pw-123456789")
        refs.append(ref)
    token = tenants.issue_token(tenant_id=refs[0].id, username="acme-user", name="bench").secret
    operator = get_user_model().objects.create_user("op", password="pw-123456789", is_staff=True, is_superuser=True)
    spec = parse_job_spec({"name": "running", "devices": 1, "flavors": ["tpu-v4"], "workload": {"steps": 100}})
    view = jobs.submit_job(tenant_id=refs[0].id, user_id=None, spec=spec)
    TrainingJob.objects.filter(pk=view.id).update(state=JobState.RUNNING)
    device = Device.objects.filter(flavor__name="tpu-v4").order_by("device_id").first()
    if device is None:
        raise SystemExit("bench: the pool has no tpu-v4")
    Allocation.objects.create(job_id=view.id, device=device, rank=0, started_at=timezone.now())
    job = TrainingJob.objects.get(pk=view.id)
    return {"tenants": refs, "token": token, "operator": operator, "job": job, "ingest": jobs.ingest_token(job)}


def routes() -> list[tuple[str, set[str]]]:
    from django.urls import URLPattern, URLResolver, get_resolver

    out: list[tuple[str, set[str]]] = []

    def walk(patterns: Any, prefix: str = "") -> None:
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                if route == "admin/":
                    out.append(("admin/login/", {"GET", "POST"}))
                    out.append(("admin/jobs/trainingjob/", {"GET", "POST"}))
                else:
                    walk(pattern.url_patterns, route)
            elif isinstance(pattern, URLPattern):
                cls = getattr(pattern.callback, "cls", None) or getattr(pattern.callback, "view_class", None)
                methods = {m.upper() for m in ("get", "post", "put", "patch", "delete") if cls and hasattr(cls, m)}
                out.append((route, methods or {"GET", "POST"}))

    walk(get_resolver().url_patterns)
    return out


# --- what the fuzz sends ------------------------------------------------------------------------


def _path(route: str, rng: random.Random, job_id: int) -> str:
    import re

    def value(match: re.Match[str]) -> str:
        kind = match.group(1)
        if kind == "int":
            return str(rng.choice([job_id, 1, 2, 0, 10**6, 2**31, 2**63, 10**30]))
        return rng.choice(["x", "a" * 300, "%00", "..", "%ED%A0%80"])

    return "/" + re.sub(r"<(?:(\w+):)?\w+>", value, route)


def _text(rng: random.Random) -> str:
    return rng.choice(
        [
            "x",
            "",
            "a" * rng.choice([64, 300, 5000]),
            "\x00",
            "a\x00b",
            "\ud800",
            "ok\udfff",
            "é漢字🚀",
            "<script>alert(1)</script>",
            "../../etc/passwd",
            "' OR 1=1 --",
            " ",
        ]
    )


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(10 if depth < 3 else 7)
    if kind == 0:
        return rng.choice([0, 1, -1, 2**31, 2**63, -(2**63) - 1, 10**30, 1.5, -0.0, 1e308])
    if kind == 1:
        return _text(rng)
    if kind == 2:
        return rng.choice([True, False, None])
    if kind in (3, 4, 5, 6):
        return rng.choice(["read", "submit", "h100-sxm", "tpu-v4", "synthetic-mlp", "2026-01", "nau", "50"])
    if kind in (7, 8):
        return {_field(rng): _value(rng, depth + 1) for _ in range(rng.randrange(4))}
    return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]


FIELDS = (
    "name", "devices", "flavors", "workload", "steps", "global_batch", "priority", "checkpoint", "events",
    "kind", "rank", "ts", "step", "samples_per_s", "artifact", "scopes", "expires_at", "expires_in_days",
    "nominal", "resource", "quotas", "cohort", "slug", "fair_share_weight", "max_queued_jobs",
    "soft_budget", "hard_budget", "currency", "period", "limit", "offset", "comm", "min_devices",
)  # fmt: skip


def _field(rng: random.Random) -> str:
    return rng.choice(FIELDS) if rng.random() < 0.85 else _text(rng)


def _body(rng: random.Random) -> tuple[bytes, str]:
    """A request body and its content type."""
    kind = rng.randrange(12)
    if kind == 0:
        depth = rng.choice([40, 1000, 100_000])
        return ("[" * depth + "]" * depth).encode(), "application/json"
    if kind == 1:
        return b'{"name": "a\\u0000b", "events": [{"kind": "step", "rank": 0, "ts": 1, "step": 1}]}', "application/json"
    if kind == 2:
        return b'{"name": "\\ud800", "scopes": ["\\udfff"]}', "application/json"
    if kind == 3:
        return b'{"steps": 1e400, "devices": 99999999999999999999999, "offset": -1}', "application/json"
    if kind == 4:
        return rng.choice(
            [b"{", b"null", b"[]", b'"x"', b"", b"\xff\xfe\x00", b"NaN", b'{"a": NaN}']
        ), "application/json"
    if kind == 5:
        return b"name=%00&devices=1e999", "application/x-www-form-urlencoded"
    if kind == 6:
        return b"plain text", "text/plain"
    if kind == 7:
        events = [
            {"kind": "step", "rank": _value(rng), "ts": _value(rng), "step": _value(rng), "samples_per_s": _value(rng)}
        ]
        return json.dumps({"events": events}).encode(), "application/json"
    body = {_field(rng): _value(rng) for _ in range(rng.randrange(1, 6))}
    return json.dumps(body, allow_nan=True).encode(), "application/json"


def _query(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return ""
    pairs = []
    for _ in range(rng.randrange(1, 4)):
        key = rng.choice(["limit", "offset", "state", "flavor", "job_class", "period", "format", "page", "x"])
        val = rng.choice(["1", "-1", "9223372036854775808", "9" * 5000, "%00", "%ED%A0%80", "csv", "json", "abc"])
        pairs.append(f"{key}={val}")
    return "?" + "&".join(pairs)


def fuzz(world: dict[str, Any], requests: int, seed: int = 17) -> tuple[int, int, list[str]]:
    from django.test import Client

    rng = random.Random(seed)
    table = routes()
    operator = Client(raise_request_exception=False)
    operator.force_login(world["operator"])
    identities = {
        "nobody": Client(raise_request_exception=False),
        "owner": Client(raise_request_exception=False, headers={"Authorization": f"Bearer {world['token']}"}),
        "operator": operator,
        "worker": Client(raise_request_exception=False, headers={"Authorization": f"Bearer {world['ingest']}"}),
    }
    sent = errors = 0
    examples: list[str] = []
    for i in range(requests):
        route, methods = table[i % len(table)]
        method = rng.choice(sorted(methods | {rng.choice(METHODS)}))
        who = rng.choice(sorted(identities))
        path = _path(route, rng, world["job"].pk) + _query(rng)
        body, content_type = _body(rng)
        client = identities[who]
        call = getattr(client, method.lower())
        try:
            response = call(path, data=body, content_type=content_type) if method != "GET" else call(path)
            status = response.status_code
        except Exception as exc:  # the test client raised instead of answering: count it as a 5xx
            status = 599
            detail = repr(exc)[:200]
        else:
            streaming = getattr(response, "streaming", False)
            detail = "(streamed)" if streaming else response.content[:200].decode(errors="replace")
            if streaming:
                for _ in response.streaming_content:  # read it all: an error may come mid-stream
                    pass
        sent += 1
        if status >= 500:
            errors += 1
            if len(examples) < 10:
                examples.append(f"{status} {method} {path[:120]} as {who}: {detail}")
    return sent, errors, examples


# --- poison, flood, lockout -----------------------------------------------------------------------


def ingest_poison(world: dict[str, Any]) -> int:
    """Poison sent by the worker of a running job the fuzz never touched (the fuzz may cancel its own)."""
    from django.test import Client
    from django.utils import timezone

    from jobs import services as jobs
    from jobs.models import Allocation, Device, JobState, TrainingJob
    from runtime.jobspec import parse_job_spec

    spec = parse_job_spec({"name": "poisoned", "devices": 1, "flavors": ["tpu-v4"], "workload": {"steps": 100}})
    view = jobs.submit_job(tenant_id=world["tenants"][1].id, user_id=None, spec=spec)
    TrainingJob.objects.filter(pk=view.id).update(state=JobState.RUNNING)
    device = Device.objects.filter(flavor__name="tpu-v4").order_by("-device_id").first()
    if device is None:
        raise SystemExit("bench: the pool has no tpu-v4")
    Allocation.objects.create(job_id=view.id, device=device, rank=0, started_at=timezone.now())
    job = TrainingJob.objects.get(pk=view.id)
    worker = Client(headers={"Authorization": f"Bearer {jobs.ingest_token(job)}"}, raise_request_exception=False)
    url = f"/api/v1/ingest/jobs/{job.pk}/telemetry"
    honest = {
        "kind": "step",
        "rank": 0,
        "ts": time.time(),
        "step": 4,
        "loss": 1.0,
        "samples": 8,
        "samples_per_s": 200.0,
    }
    if worker.post(url, {"events": [honest]}, content_type="application/json").status_code != 200:
        raise SystemExit("bench: the honest telemetry of the poisoned job was refused")

    def step(**extra: Any) -> dict[str, Any]:
        return {"kind": "step", "rank": 0, "ts": time.time(), "step": 5, "loss": 1.0, "samples": 8, **extra}

    poisons = [
        step(samples_per_s=1e300),
        step(samples_per_s=9 * 250.0),
        step(samples_per_s=4000.0, flavor="h100-sxm"),
        step(samples_per_s=100.0, global_samples_per_s=1e12),
        step(samples_per_s=100.0, predicted=[1e9]),
        {"kind": "straggler", "rank": 0, "ts": time.time(), "step": 5, "straggler_rank": 0,
         "measured_samples_per_s": 1e9, "expected_samples_per_s": 1.0},
        step(step=2**31),
        step(samples_per_s=float("1e16")),
        {"kind": "finished", "rank": 0, "ts": time.time(), "artifact": "../../../../etc/shadow"},
    ]  # fmt: skip
    accepted = 0
    for event in poisons:
        response = worker.post(url, {"events": [event]}, content_type="application/json")
        if response.status_code < 400:
            accepted += 1
            say(f"  accepted poison: {json.dumps(event)[:160]}")
    return accepted


def platform_failures_billed(world: dict[str, Any], trials: int) -> int:
    """Usage records of attempts a device's failure ended (a rank killed by SIGKILL, a lost heartbeat,
    the run lost) that carry no credit: each trial a running job on two devices, failed through the
    recovery path the observe sweep takes."""
    from django.utils import timezone

    from billing.models import UsageRecord
    from jobs import recovery
    from jobs import services as jobs
    from jobs.models import Allocation, Device, DeviceHealth, JobState, TrainingJob
    from runtime.backends.base import Failure, Observation, Phase
    from runtime.jobspec import parse_job_spec

    billed = 0
    causes = [("signal", -9), ("heartbeat", None), (None, None)]
    for trial in range(trials):
        Device.objects.update(health=DeviceHealth.HEALTHY)
        free = list(Device.objects.filter(flavor__name="h100-sxm", allocations__isnull=True).order_by("device_id")[:2])
        if len(free) < 2:
            Allocation.objects.filter(device__flavor__name="h100-sxm", ended_at__isnull=True).update(
                ended_at=timezone.now()
            )
            free = list(Device.objects.filter(flavor__name="h100-sxm").order_by("device_id")[:2])
        spec = parse_job_spec({"name": f"killed-{trial}", "devices": 2, "flavors": ["h100-sxm"], "max_restarts": 0})
        view = jobs.submit_job(tenant_id=world["tenants"][2].id, user_id=None, spec=spec)
        TrainingJob.objects.filter(pk=view.id).update(state=JobState.RUNNING)
        for rank, device in enumerate(free):
            Allocation.objects.create(job_id=view.id, device=device, rank=rank, started_at=timezone.now())
        cause, code = causes[trial % len(causes)]
        seen = (Failure(rank=1, cause=cause, detected_at=time.time(), exit_code=code),) if cause else ()
        observation = Observation(phase=Phase.FAILED, failure=seen[0] if seen else None, failures=seen)
        recovery.handle_failure(view.id, 0, observation, reason="" if seen else "the backend no longer knows this run")
        billed += UsageRecord.objects.filter(job_id=view.id, credit_reason="").count()
    return billed


def cycle_ms(cycles: int) -> float:
    from jobs import services as jobs

    times = []
    for _ in range(cycles):
        started = time.perf_counter()
        jobs.run_admission_cycle()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def flood(world: dict[str, Any], flood_jobs: int, cycles: int) -> tuple[float, float]:
    from django.utils import timezone

    from jobs.models import JobState, TrainingJob
    from runtime.jobspec import parse_job_spec

    spec = parse_job_spec({"name": "q", "devices": 64, "flavors": ["tpu-v4"], "workload": {"steps": 10}}).to_dict()

    def queue(tenant_id: int, count: int) -> None:
        now = timezone.now()
        TrainingJob.objects.bulk_create(
            TrainingJob(
                tenant_id=tenant_id, name=f"q-{i}", spec=spec, state=JobState.QUEUED, total_steps=10,
                priority=0, job_class="synthetic-mlp", created_at=now,
            )
            for i in range(count)
        )  # fmt: skip

    for ref in world["tenants"]:
        queue(ref.id, 20)
    cycle_ms(2)  # warm
    baseline = cycle_ms(cycles)
    queue(world["tenants"][0].id, flood_jobs)
    cycle_ms(1)  # the first cycle after the flood writes its jobs' reasons
    return baseline, cycle_ms(cycles)


def lockout_after() -> int:
    """The wrong password at which the sign-in locks (answers 429 from then on, right password included)."""
    from django.test import Client

    client = Client(REMOTE_ADDR="203.0.113.66")
    for attempt in range(1, 101):
        response = client.post("/login/", {"username": "globex-user", "password": "wrong"})
        if response.status_code == 429:
            right = client.post("/login/", {"username": "globex-user", "password": "pw-123456789"})
            if right.status_code != 429:
                raise SystemExit("bench: the right password signed in during the lockout")
            return attempt
    return 100


# --- a loaded host, on the embedded default -------------------------------------------------------


def _embedded_env(scratch: str, url: str, **extra: str) -> dict[str, str]:
    """The environment of a stack on the embedded default in ``scratch``: none of this process's
    database, broker or settings (setup_django changed them for the in-process part)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DATABASE_URL", "CELERY_", "CHANNEL_", "POLYCHIP_", "DJANGO_"))
    }
    env.update(POLYCHIP_VAR_DIR=scratch, POLYCHIP_PUBLIC_URL=url, **extra)
    return env


def _busy_loaders(count: int) -> Iterator[subprocess.Popen[bytes]]:
    for _ in range(count):
        yield subprocess.Popen([sys.executable, "-c", "while True: pass"])


def loaded_host(jobs_count: int, loaders: int) -> dict[str, Any]:
    from controlplane.cli.api import Api as Client

    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="polychip-bench-hardening-") as scratch:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = _embedded_env(scratch, url)
        cli(env, "demo", "--no-job", "--port", str(port))
        busy = list(_busy_loaders(loaders))
        try:
            client = Client(url, (Path(scratch) / "demo-token").read_text().strip())
            spec = {"devices": 2, "flavors": ["ascend-910b", "tpu-v4"], "workload": {"steps": 40, "global_batch": 32}}
            ids = [client.submit({**spec, "name": f"loaded-{i}"})["id"] for i in range(jobs_count)]
            deadline = time.monotonic() + 900
            final: dict[int, dict[str, Any]] = {}
            while len(final) < len(ids) and time.monotonic() < deadline:
                for job_id in ids:
                    if job_id not in final and (job := client.job(job_id))["state"] in ("succeeded", "failed"):
                        final[job_id] = job
                time.sleep(1)
        finally:
            for process in busy:
                process.kill()
                process.wait()
        for job_id, job in sorted(final.items()):
            say(f"  job {job_id}: {job['state']}, {job['restarts']} restart(s) {job['failure_reason'] or ''}")
        db = sqlite3.connect(Path(scratch) / "polychip.sqlite3")
        messages = [m for (m,) in db.execute("SELECT message FROM jobs_jobevent WHERE kind = 'recovery'")]
        # A restart after ranks were killed while starting, and a job that ended failed for it.
        killed = [m for m in messages if "start-up grace" in m or ("heartbeat" in m and "failure detected" in m)]
        gave_up = [j for j in final.values() if "start-up grace" in (j["failure_reason"] or "")]
        figures["start_grace_kills"] = len(killed) + len(gave_up)
        figures["loaded_jobs_succeeded"] = sum(1 for j in final.values() if j["state"] == "succeeded")
        figures["loaded_jobs"] = len(ids)
        figures["healthy_devices_marked_failed"] = db.execute(
            "SELECT COUNT(*) FROM jobs_device WHERE health = 'failed'"
        ).fetchone()[0]
        db.close()
        # A long job, then `polychip down`: nothing of it may outlive the stack.
        client.submit({**spec, "name": "long", "workload": {"steps": 100_000}})
        deadline = time.monotonic() + 120
        while not processes_mentioning(str(Path(scratch) / "runs")) and time.monotonic() < deadline:
            time.sleep(0.5)
        cli(env, "down")
        left = processes_mentioning(str(Path(scratch) / "runs"))
        figures["stray_processes_after_down"] = len(left)
        for pid in left:
            os.kill(pid, 9)
    return figures


RESTORE_SPEC: dict[str, Any] = {
    "name": "restore",
    "devices": 3,
    "flavors": ["ascend-910b"],
    "workload": {"steps": 120, "global_batch": 96, "seed": 5, "lr": 0.05},
    "checkpoint": {"weights_every": 10, "keep": 3},  # the defaults otherwise: every save holds both
    "max_restarts": 3,
}


def _final_loss_on_the_training_set(artifact: str) -> float:
    """The loss of a job's saved model over its whole synthetic training set (not the last batch's)."""
    import torch
    import torch.nn.functional as F

    from runtime.worker.workload import SyntheticDataset, build_student

    workload = RESTORE_SPEC["workload"]
    model = build_student(64, workload["seed"])
    model.load_state_dict(torch.load(artifact, map_location="cpu", weights_only=True))
    data = SyntheticDataset(workload["seed"], workload["global_batch"])
    with torch.no_grad():
        return float(F.cross_entropy(model(data.inputs), data.labels))


def _step_of_run(run_dir: Path) -> int:
    last = 0
    for path in run_dir.glob("telemetry.rank*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("kind") == "step":
                last = max(last, int(event["step"]))
    return last


def restore_trials(trials: int) -> dict[str, Any]:
    """Kill a rank of a running job at random steps and right after checkpoint steps (the background
    saver is then writing), let recovery bring it back, and compare the final model's loss over the
    whole training set with an uninterrupted run's: |L_trial - L_reference| / L_reference."""
    from controlplane.cli.api import Api as Client

    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="polychip-bench-restore-") as scratch:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = _embedded_env(scratch, url, POLYCHIP_LOCAL_TELEMETRY_FILES="1")
        cli(env, "demo", "--no-job", "--port", str(port))
        gaps: list[float] = []
        try:
            client = Client(url, (Path(scratch) / "demo-token").read_text().strip())

            def finish(job_id: int) -> dict[str, Any]:
                deadline = time.monotonic() + 300
                while (job := client.job(job_id))["state"] not in ("succeeded", "failed", "cancelled"):
                    if time.monotonic() > deadline:
                        raise SystemExit(f"bench: job {job_id} did not end in 300 s")
                    time.sleep(0.3)
                return job

            reference = finish(client.submit({**RESTORE_SPEC, "name": "reference"})["id"])
            if reference["state"] != "succeeded":
                raise SystemExit(f"bench: the reference job ended {reference['state']}")
            reference_loss = _final_loss_on_the_training_set(reference["artifact"])
            say(f"  reference: loss over the training set {reference_loss:.5f}")
            chooser = random.Random(23)
            for trial in range(trials):
                # Every other kill lands right after a checkpoint step, while the saver writes.
                kill_at = chooser.randint(12, 100) if trial % 2 == 0 else 10 * chooser.randint(2, 9)
                job_id = client.submit({**RESTORE_SPEC, "name": f"trial-{trial}"})["id"]
                runs = Path(scratch) / "runs"
                deadline = time.monotonic() + 120
                run_dir = None
                while time.monotonic() < deadline:
                    found = sorted(runs.glob(f"job-{job_id}-*"))
                    if found and _step_of_run(found[0]) >= kill_at:
                        run_dir = found[0]
                        break
                    time.sleep(0.02)
                if run_dir is None:
                    raise SystemExit(f"bench: trial {trial} never reached step {kill_at}")
                status = json.loads((run_dir / "status.json").read_text())
                pid = next(r["pid"] for r in status["ranks"] if r["rank"] == trial % 3)
                os.kill(pid, 9)
                job = finish(job_id)
                if job["state"] != "succeeded":
                    raise SystemExit(f"bench: trial {trial} ended {job['state']}: {job['failure_reason']}")
                loss = _final_loss_on_the_training_set(job["artifact"])
                gap = abs(loss - reference_loss) / reference_loss
                restored = (job["recovery"] or {}).get("restored") or {}
                gaps.append(gap)
                say(
                    f"  trial {trial}: rank {trial % 3} killed at step >= {kill_at}; restored step "
                    f"{restored.get('step')} (optimizer state of step {restored.get('optimizer_step')}); "
                    f"final loss {loss:.5f}, relative gap {gap:.5f}"
                )
                subprocess.run(
                    [sys.executable, "manage.py", "device_health", "--return-failed"],
                    env=env,
                    cwd=ROOT,
                    check=True,
                    capture_output=True,
                )
        finally:
            cli(env, "down")
    figures["restore_trials"] = len(gaps)
    figures["restore_loss_gap_max"] = round(max(gaps), 5) if gaps else None
    figures["restore_loss_gap_median"] = round(statistics.median(gaps), 5) if gaps else None
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests, a smaller flood, 2 loaded jobs")
    args = parser.parse_args()
    sizes = (5000, 2000, 3, 2, 4, 4) if args.quick else (20000, 10000, 7, 5, 8, 10)
    requests, flood_jobs, cycles, jobs_count, loaders, restore_count = sizes
    setup_django()
    world = seed_world()
    figures: dict[str, Any] = {"quick": args.quick}

    started = time.monotonic()
    sent, errors, examples = fuzz(world, requests)
    took = time.monotonic() - started
    say(f"fuzz: {sent} requests over {len(routes())} routes, {errors} answered 5xx ({took:.0f} s)")
    for line in examples:
        say(f"  {line}")
    figures["fuzz_requests"], figures["fuzz_5xx"] = sent, errors

    figures["ingest_poison_accepted"] = ingest_poison(world)
    say(f"poison: {figures['ingest_poison_accepted']} of 9 accepted")

    baseline, flooded = flood(world, flood_jobs, cycles)
    figures["baseline_cycle_ms"], figures["tenant_flood_cycle_ms"] = round(baseline, 1), round(flooded, 1)
    figures["tenant_flood_jobs"] = flood_jobs
    say(f"admission cycle: {baseline:.1f} ms, {flooded:.1f} ms with one tenant's {flood_jobs} waiting jobs")

    figures["login_lockout_after"] = lockout_after()
    say(f"sign-in: locked out after {figures['login_lockout_after']} wrong passwords")

    say(f"a loaded host: {loaders} CPU-bound processes, {jobs_count} jobs of 2 devices")
    figures["platform_failures_billed"] = platform_failures_billed(world, 6 if args.quick else 30)
    billed = figures["platform_failures_billed"]
    say(f"usage of attempts a device or the platform ended, billed without credit: {billed}")
    figures.update(loaded_host(jobs_count, loaders))
    say(f"kill trials: {restore_count} kills at random steps and right after checkpoint steps")
    figures.update(restore_trials(restore_count))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
