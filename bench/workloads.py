"""Your own code on Polychip: real built-in models, python and torchrun jobs, logs, metrics, bundles.

    python bench/workloads.py [--quick]

Runtime figures (real gloo ranks under the local backend, no control plane):
- charlm.*: the built-in character LM on a mixed gang (h100-sxm + a100-sxm emulated, dynamic
  balancing): first-step training loss, final held-out loss, the gang's samples/s (median of steps);
- cnn.accuracy: the built-in digits CNN on the same mixed gang, held-out accuracy at the end;
- python_exact_max_rel_err: runtime/sdk/examples/python_sdk on 3 uneven ranks against the same script
  run alone on the same global batches: the largest ||a - b||_inf / ||b||_inf over the parameters;
- python_recovered: kill -9 of a rank at a random point after a checkpoint, the next attempt (as the
  control plane provisions it: same job, same checkpoint store, another mix of chips) resumes from
  the registered state; recovered when it succeeds with a final loss within 1% of the run alone
  (recovered / trials); tests/integration/test_user_code_stack.py shows the control plane doing it;
- torchrun_succeeded: the unmodified DDP example on 2 ranks (1 or 0).
Stack figures (Polychip on the embedded default: SQLite, filesystem broker, local backend):
- bundle_upload_mb_s: POST /api/v1/bundles of an incompressible tar.gz (median of trials);
- log_latency_ms_p50: a rank's print (it writes its clock) to the line arriving on
  GET /api/v1/jobs/{id}/logs?follow=true (same host, same clock);
- metrics_query_ms_p50: GET /api/v1/jobs/{id}/metrics?name=...&points=500 over a 100,000-step series.
The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import signal
import sqlite3
import statistics
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, bench/ heads sys.path, and bench/kubernetes.py would shadow the kubernetes client.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.hardening import _embedded_env  # noqa: E402
from bench.skeleton import cli, free_port  # noqa: E402
from runtime.backends.base import LaunchRequest, Phase, RankPlacement  # noqa: E402
from runtime.backends.local import LocalBackend  # noqa: E402
from runtime.inventory import load_pool  # noqa: E402
from runtime.jobspec import BUILTIN_MODELS, CheckpointSpec, WorkloadSpec  # noqa: E402
from runtime.recovery.checkpoint import step_of  # noqa: E402
from runtime.recovery.store import LocalStore  # noqa: E402
from tests.usercode import DDP_EXAMPLE, MIXED, SDK_EXAMPLE, make_bundle, run_alone, user_request  # noqa: E402

POOL = ROOT / "runtime" / "pools" / "demo.yaml"
GANG = ("h100-sxm", "a100-sxm")


def say(message: str) -> None:
    print(message, flush=True)


def wait_final(backend: LocalBackend, handle: dict[str, Any], timeout_s: float = 600) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        observation = backend.observe(handle)
        if observation.phase in (Phase.SUCCEEDED, Phase.FAILED, Phase.STOPPED, Phase.GONE):
            return observation
        if time.monotonic() > deadline:
            raise RuntimeError(f"{handle['job_id']} did not end in {timeout_s} s")
        time.sleep(0.2)


def wait_for(predicate: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError("condition not met")
        time.sleep(0.05)


def events(run_dir: Path, rank: int = 0) -> list[dict[str, Any]]:
    for folder in (run_dir / "work", run_dir):
        path = folder / f"telemetry.rank{rank}.jsonl"
        if path.exists():
            return [json.loads(line) for line in path.read_text().splitlines()]
    return []


def builtin(backend: LocalBackend, model: str, scratch: Path) -> dict[str, Any]:
    placements = tuple(
        RankPlacement(rank=i, device_id=f"dev/{i}", flavor=flavor, node="node") for i, flavor in enumerate(GANG)
    )
    request = LaunchRequest(
        job_id=f"bench-{model}",
        placements=placements,
        workload=WorkloadSpec(kind="builtin", model=model, **BUILTIN_MODELS[model]),
        telemetry_url=None,
        telemetry_token="",
        artifacts_dir=str(scratch / "artifacts" / model),
        balancing="dynamic",
    )
    started = time.monotonic()
    handle = backend.provision(request)
    observation = wait_final(backend, handle)
    if observation.phase != Phase.SUCCEEDED:
        raise RuntimeError(f"{model}: {observation.reason}")
    steps = [e for e in events(Path(handle["run_dir"])) if e["kind"] == "step"]
    metrics: dict[str, float] = {}
    for event in steps:
        metrics.update(event.get("metrics") or {})
    splits = {json.dumps(e["split"]) for e in steps}
    say(
        f"{model}: {len(steps)} steps in {time.monotonic() - started:.1f} s on {' + '.join(GANG)}, "
        f"{len(splits)} distinct split(s), last {steps[-1]['split']}; held-out {metrics}"
    )
    return {
        "loss_first": steps[0]["loss"],
        "metrics": metrics,
        "samples_per_s": statistics.median(e["global_samples_per_s"] for e in steps[1:]),
    }


def python_exactness(backend: LocalBackend, scratch: Path) -> float:
    import torch

    bundle = make_bundle(scratch / "exact-bundle", {"train.py": SDK_EXAMPLE.read_text()})
    handle = backend.provision(user_request("bench-exact", scratch, bundle))
    observation = wait_final(backend, handle)
    if observation.phase != Phase.SUCCEEDED:
        raise RuntimeError(observation.reason)
    alone, _ = run_alone(SDK_EXAMPLE, scratch / "exact-alone")
    gang = torch.load(scratch / "artifacts" / "bench-exact" / "model.pt", weights_only=True)
    reference = torch.load(alone, weights_only=True)
    errors = [float((gang[k] - v).abs().max() / v.abs().max().clamp_min(1e-12)) for k, v in reference.items()]
    say(f"python on 3 uneven ranks against one process: max relative error {max(errors):.2e}")
    return max(errors)


def recovery_trials(backend: LocalBackend, scratch: Path, trials: int, rng: random.Random) -> tuple[int, int]:
    bundle = make_bundle(scratch / "kill-bundle", {"train.py": SDK_EXAMPLE.read_text()})
    _, alone_lines = run_alone(SDK_EXAMPLE, scratch / "kill-alone")
    alone = last_loss(alone_lines)
    spec = CheckpointSpec(weights_every=10, optimizer_every=10, keep=3)
    recovered = 0
    for trial in range(trials):
        key = f"bench-kill-{trial}"
        first = backend.provision(user_request(f"{key}-a0", scratch, bundle, checkpoint=spec, job_key=key))
        store = LocalStore(str(scratch / "checkpoints" / key))
        wanted = 10 * rng.randint(1, 6)  # kill after the checkpoint of step 10..60 of 120

        def saved(store: LocalStore = store, wanted: int = wanted) -> bool:
            return any((step_of(name) or 0) >= wanted for name in store.names())

        wait_for(saved, timeout_s=300)
        time.sleep(rng.uniform(0.0, 0.5))
        status = json.loads((Path(first["run_dir"]) / "status.json").read_text())
        victim = rng.choice([r for r in status["ranks"] if r["pid"]])
        os.kill(victim["pid"], signal.SIGKILL)
        wait_final(backend, first)
        second = backend.provision(
            user_request(f"{key}-a1", scratch, bundle, checkpoint=spec, job_key=key, flavors=MIXED[:2])
        )
        observation = wait_final(backend, second)
        lines = [line.text for line in backend.logs(second, limit=100_000).lines]
        resumed = next((line for line in lines if line.startswith("resumed at step")), "no resume")
        ok = observation.phase == Phase.SUCCEEDED and "resumed" in resumed
        loss = last_loss(lines) if ok else float("nan")
        ok = ok and abs(loss - alone) <= 0.01 * alone
        recovered += ok
        say(f"kill trial {trial}: rank {victim['rank']} killed; {resumed}; final loss {loss:.4f} vs {alone:.4f} alone")
    return recovered, trials


def last_loss(lines: list[str]) -> float:
    import re

    losses = [float(m.group(1)) for line in lines if (m := re.search(r"^step \d+: loss ([0-9.]+)", line))]
    return losses[-1] if losses else float("nan")


def torchrun(backend: LocalBackend, scratch: Path) -> int:
    bundle = make_bundle(scratch / "ddp-bundle", {"train.py": DDP_EXAMPLE.read_text()})
    request = user_request("bench-ddp", scratch, bundle, kind="torchrun", flavors=GANG, args=("--steps", "40"))
    observation = wait_final(backend, backend.provision(request))
    say(f"torchrun DDP example on 2 ranks: {observation.phase.value}")
    return int(observation.phase == Phase.SUCCEEDED)


# -- the stack ------------------------------------------------------------------------------------

LOGGER = """
import time
import torch
from runtime import sdk

with sdk.init() as ctx:
    model = torch.nn.Linear(4, 1)
    ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
    for step in ctx.steps():
        for lo, hi in ctx.slices():
            ctx.backward(model(torch.ones(hi - lo, 4)).sum())
        ctx.step()
        print(f"PING {ctx.rank} {time.time():.6f}", flush=True)
        time.sleep(0.15)
"""


def upload(url: str, token: str, data: bytes) -> dict[str, Any]:
    response = requests.post(
        f"{url}/api/v1/bundles",
        data=data,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/gzip"},
        timeout=120,
    )
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def blob_bundle(megabytes: int, rng: random.Random) -> bytes:
    buffer = io.BytesIO()
    payload = rng.randbytes(megabytes * 2**20)
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        info = tarfile.TarInfo("weights.bin")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def stack_figures(quick: bool, rng: random.Random) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="polychip-bench-workloads-") as scratch:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = _embedded_env(scratch, url, POLYCHIP_SWEEP_SECONDS="0.5")
        cli(env, "demo", "--no-job", "--port", str(port))
        try:
            token = (Path(scratch) / "demo-token").read_text().strip()
            rates = []
            for _ in range(1 if quick else 3):
                data = blob_bundle(16 if quick else 32, rng)
                started = time.perf_counter()
                upload(url, token, data)
                rates.append(len(data) / 2**20 / (time.perf_counter() - started))
            figures["bundle_upload_mb_s"] = round(statistics.median(rates), 1)
            say(f"bundle upload: {[round(r, 1) for r in rates]} MB/s")
            figures.update(log_latency(url, token, quick))
            figures["metrics_query_ms_p50"] = metrics_query(url, token, Path(scratch), quick)
        finally:
            cli(env, "down")
    return figures


def log_latency(url: str, token: str, quick: bool) -> dict[str, Any]:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        data = LOGGER.encode()
        info = tarfile.TarInfo("logger.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    bundle = upload(url, token, buffer.getvalue())["bundle"]
    headers = {"Authorization": f"Bearer {token}"}
    spec = {
        "name": "bench-logs",
        "devices": 2,
        "flavors": list(GANG),
        "workload": {"kind": "python", "bundle": bundle, "entrypoint": "logger.py", "steps": 30 if quick else 80},
    }
    job = requests.post(f"{url}/api/v1/jobs", json=spec, headers=headers, timeout=30)
    job.raise_for_status()
    job_id = job.json()["id"]
    latencies: list[float] = []
    with requests.get(
        f"{url}/api/v1/jobs/{job_id}/logs",
        params={"follow": "true", "format": "jsonl"},
        headers=headers,
        stream=True,
        timeout=(10, 120),
    ) as stream:
        stream.raise_for_status()
        for raw in stream.iter_lines():
            received = time.time()
            if not raw:
                continue
            record = json.loads(raw)
            text = record.get("line", "")
            if text.startswith("PING "):
                latencies.append((received - float(text.split()[2])) * 1000)
    final = requests.get(f"{url}/api/v1/jobs/{job_id}", headers=headers, timeout=30).json()
    say(
        f"logs: {len(latencies)} lines followed from job {job_id} ({final['state']}); latency ms "
        f"p50 {statistics.median(latencies):.0f}, max {max(latencies):.0f}"
    )
    return {"log_latency_ms_p50": round(statistics.median(latencies), 1), "log_lines_followed": len(latencies)}


def metrics_query(url: str, token: str, scratch: Path, quick: bool) -> float:
    """A 100,000-step series for the last job, written straight into the embedded database (the
    fixture), then read through the API as a chart would."""
    headers = {"Authorization": f"Bearer {token}"}
    job_id = requests.get(f"{url}/api/v1/jobs", headers=headers, timeout=30).json()["jobs"][0]["id"]
    db = sqlite3.connect(scratch / "polychip.sqlite3", timeout=30)
    now = time.strftime("%Y-%m-%d %H:%M:%S")
    rows = [(job_id, "bench_series", step, 1.0 / step + 0.01 * (step % 7), 0, now) for step in range(1, 100_001)]
    with db:
        db.executemany(
            "INSERT INTO jobs_metricpoint (job_id, name, step, value, attempt, recorded_at) VALUES (?, ?, ?, ?, ?, ?)",
            rows,
        )
    db.close()
    timings = []
    for _ in range(10 if quick else 40):
        started = time.perf_counter()
        response = requests.get(
            f"{url}/api/v1/jobs/{job_id}/metrics",
            params={"name": "bench_series", "points": 500},
            headers=headers,
            timeout=30,
        )
        timings.append((time.perf_counter() - started) * 1000)
        response.raise_for_status()
    series = response.json()["series"][0]
    say(
        f"metrics: {series['total_points']} points read as {len(series['points'])} "
        f"(downsampled {series['downsampled']}); ms p50 {statistics.median(timings):.1f}"
    )
    return round(statistics.median(timings), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer trials (about 3 minutes)")
    args = parser.parse_args()
    rng = random.Random(18)
    profiles = load_pool(POOL).local_profiles
    figures: dict[str, Any] = {"quick": args.quick}
    with tempfile.TemporaryDirectory(prefix="polychip-bench-runtime-") as folder:
        scratch = Path(folder)
        backend = LocalBackend(scratch / "runs", profiles, sample_time_ms=0.2, telemetry_files=True)
        try:
            charlm = builtin(backend, "charlm", scratch)
            figures["charlm.loss_first"] = round(charlm["loss_first"], 4)
            figures["charlm.loss_final"] = round(charlm["metrics"]["val_loss"], 4)
            figures["charlm.samples_per_s"] = round(charlm["samples_per_s"], 1)
            cnn = builtin(backend, "digits-cnn", scratch)
            figures["cnn.accuracy"] = round(cnn["metrics"]["val_accuracy"], 4)
            figures["python_exact_max_rel_err"] = python_exactness(backend, scratch)
            recovered, trials = recovery_trials(backend, scratch, 1 if args.quick else 3, rng)
            figures["python_recovered"] = f"{recovered}/{trials}"
            figures["torchrun_succeeded"] = torchrun(backend, scratch)
        finally:
            backend.tear_down_every_run()
    figures.update(stack_figures(args.quick, rng))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
