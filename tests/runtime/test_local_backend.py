"""The local backend end to end: real gloo processes, emulated device speeds, failures, teardown."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from runtime.backends.base import LaunchRequest, Phase, RankPlacement
from runtime.backends.local import LocalBackend
from runtime.backends.local.procs import pid_alive
from runtime.jobspec import WorkloadSpec
from tests.runtime.conftest import DEMO_POOL, REPO, processes_mentioning, wait_for, wait_until_final

pytestmark = pytest.mark.runtime


def _request(job_id: str, flavors: list[str], tmp_path: Path, **workload: Any) -> LaunchRequest:
    placements = tuple(
        RankPlacement(rank=i, device_id=f"{flavor}-node/{i}", flavor=flavor, node=f"{flavor}-node")
        for i, flavor in enumerate(flavors)
    )
    return LaunchRequest(
        job_id=job_id,
        placements=placements,
        workload=WorkloadSpec(**workload),
        telemetry_url=None,
        telemetry_token="",
        artifacts_dir=str(tmp_path / "artifacts" / job_id),
    )


def _events(run_dir: Path, rank: int) -> list[dict[str, Any]]:
    path = run_dir / f"telemetry.rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_two_chip_job_trains_to_a_low_loss(make_backend: Callable[..., LocalBackend], tmp_path: Path) -> None:
    backend = make_backend(telemetry_files=True)
    request = _request("mixed-1", ["h100-sxm", "a100-sxm"], tmp_path, steps=200, global_batch=96, lr=0.05)
    handle = backend.provision(request)
    assert handle == {"backend": "local", "run_dir": str(backend.runs_dir / "mixed-1"), "job_id": "mixed-1"}
    assert backend.provision(request) == handle  # idempotent: no second launch

    observation = wait_until_final(backend, handle, timeout_s=120)
    assert observation.phase == Phase.SUCCEEDED, observation.reason
    assert [(r.rank, r.exit_code) for r in observation.ranks] == [(0, 0), (1, 0)]

    run_dir = Path(handle["run_dir"])
    for rank in (0, 1):
        events = _events(run_dir, rank)
        steps = [e for e in events if e["kind"] == "step"]
        assert [e["step"] for e in steps] == list(range(1, 201))
        assert all(e["job"] == "mixed-1" and e["rank"] == rank and e["samples"] >= 1 for e in steps)
        assert {e["kind"] for e in events} >= {"started", "heartbeat", "step", "finished"}
    steps = [e for e in _events(run_dir, 0) if e["kind"] == "step"]
    first, last10 = steps[0]["loss"], statistics.fmean(e["loss"] for e in steps[-10:])
    assert 2.0 < first < 2.7  # ten classes, untrained: about ln(10)
    assert last10 < 0.5 * first and last10 < 0.6, (first, last10)
    # No score in the request: the first split is equal, and the dynamic balancer then follows the
    # measured speeds (h100 1.0, a100 0.32); every step's split covers the global batch.
    ranks = [[e for e in _events(run_dir, r) if e["kind"] == "step"] for r in (0, 1)]
    assert ranks[0][0]["samples"] == ranks[1][0]["samples"] == 48
    assert all(a["samples"] + b["samples"] == 96 for a, b in zip(*ranks, strict=True))
    assert ranks[0][-1]["samples"] > 48
    # Every rank reports the same global loss.
    assert [e["loss"] for e in _events(run_dir, 1) if e["kind"] == "step"] == [e["loss"] for e in steps]

    finished = next(e for e in _events(run_dir, 0) if e["kind"] == "finished")
    artifact = Path(request.artifacts_dir) / "model.pt"
    assert finished["artifact"] == str(artifact) and artifact.exists()
    state = torch.load(artifact, weights_only=True)
    assert state["0.weight"].shape == (64, 32)
    # The a100 profile (relative speed 0.32) pads its own compute: 0.1 ms / 0.32 per sample at least,
    # so its own speed is about 3,200 samples/s whatever its share of the batch.
    slow = [e for e in _events(run_dir, 1) if e["kind"] == "step"]
    assert all(e["own_time_s"] >= e["samples"] * 0.0001 / 0.32 for e in slow)
    assert statistics.median(e["samples_per_s"] for e in slow) <= 3200
    assert processes_mentioning(str(run_dir)) == []


def test_a_failing_rank_fails_the_job_and_teardown_leaves_nothing(
    make_backend: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    backend = make_backend(worker_overrides={1: {"fail_at_step": 3}})
    handle = backend.provision(_request("fails-1", ["h100-sxm", "tpu-v4"], tmp_path, steps=500))

    observation = wait_until_final(backend, handle, timeout_s=120)
    assert observation.phase == Phase.FAILED
    assert observation.reason.startswith("rank 1 exited with code 1"), observation.reason
    assert "injected failure at step 3" in observation.reason
    codes = {r.rank: r.exit_code for r in observation.ranks}
    assert codes[1] == 1 and codes[0] not in (None, 0)

    run_dir = Path(handle["run_dir"])
    backend.teardown(handle)
    backend.teardown(handle)  # safe twice
    assert processes_mentioning(str(run_dir)) == []
    assert backend.observe(handle).phase == Phase.FAILED  # the cause stays on record


def test_teardown_stops_a_running_job(make_backend: Callable[..., LocalBackend], tmp_path: Path) -> None:
    backend = make_backend()
    handle = backend.provision(_request("long-1", ["a100-sxm", "ascend-910b"], tmp_path, steps=100_000))
    run_dir = Path(handle["run_dir"])
    assert wait_for(lambda: len(backend.observe(handle).ranks) == 2, timeout_s=30)
    observation = backend.observe(handle)
    assert observation.phase == Phase.RUNNING
    pids = [r.pid for r in observation.ranks]
    supervisor_pid = int((run_dir / "supervisor.pid").read_text())

    backend.teardown(handle)

    # A process in the middle of exiting has already lost its command line (so teardown counts it
    # gone) but is not a zombie yet: give it a moment to finish dying.
    assert wait_for(lambda: not pid_alive(supervisor_pid) and not any(pid_alive(p) for p in pids if p), timeout_s=10)
    assert processes_mentioning(str(run_dir)) == []
    after = backend.observe(handle)
    assert after.phase == Phase.FAILED and "torn down" in after.reason
    backend.teardown(handle)


_PROVISION_AND_HANG = """
import json, sys, time
from runtime.backends.base import LaunchRequest, RankPlacement
from runtime.backends.local import LocalBackend
from runtime.inventory import load_pool
from runtime.jobspec import WorkloadSpec

runs, pool_file, artifacts = sys.argv[1:4]
backend = LocalBackend(runs, load_pool(pool_file).local_profiles)
placements = tuple(RankPlacement(i, f"d/{i}", "h100-sxm", "n") for i in range(2))
request = LaunchRequest("orphan-1", placements, WorkloadSpec(steps=100000), None, "", artifacts)
print(json.dumps(backend.provision(request)), flush=True)
time.sleep(600)
"""


def test_the_supervisor_outlives_its_provisioner_and_its_death_is_seen(
    make_backend: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    backend = make_backend()
    # Provision from a process that then dies with its whole group, as a killed Celery child would.
    provisioner = subprocess.Popen(
        [sys.executable, "-c", _PROVISION_AND_HANG, str(backend.runs_dir), str(DEMO_POOL), str(tmp_path / "a")],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        start_new_session=True,
    )
    try:
        assert provisioner.stdout is not None
        handle = json.loads(provisioner.stdout.readline())
    finally:
        os.killpg(provisioner.pid, signal.SIGKILL)
        provisioner.wait()
    run_dir = Path(handle["run_dir"])
    supervisor_pid = int((run_dir / "supervisor.pid").read_text())

    assert wait_for(lambda: len(backend.observe(handle).ranks) == 2, timeout_s=30)
    assert backend.observe(handle).phase == Phase.RUNNING
    assert pid_alive(supervisor_pid, str(run_dir))

    # A supervisor killed outright leaves no final status: observe must not report it as running,
    # and its ranks follow it (they get SIGTERM when their parent dies).
    os.kill(supervisor_pid, signal.SIGKILL)
    assert wait_for(lambda: backend.observe(handle).phase == Phase.FAILED, timeout_s=10)
    assert "died without a final status" in backend.observe(handle).reason
    assert wait_for(lambda: processes_mentioning(str(run_dir)) == [], timeout_s=20)
    backend.teardown(handle)
    assert "died without a final status" in backend.observe(handle).reason


def test_a_busy_process_wants_cpu_and_a_stopped_one_does_not() -> None:
    """The supervisor's starvation check (issue 17, item 14) on real processes."""
    import signal
    import subprocess
    import sys
    import time

    from runtime.backends.local.procs import wants_cpu

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        deadline = time.monotonic() + 10
        while not wants_cpu(busy.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert wants_cpu(busy.pid)
        busy.send_signal(signal.SIGSTOP)
        time.sleep(0.2)
        assert not wants_cpu(busy.pid)
    finally:
        busy.kill()
        busy.wait()
    assert not wants_cpu(busy.pid)  # gone
