"""Recovery at the runtime level: real gloo ranks under the local backend, no control plane.

What a restarted attempt restores, whatever world size saved it; a corrupt newest checkpoint is
skipped; a rank that goes silent is detected by its heartbeats; a stop request ends every rank
after one full checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runtime.backends.base import LaunchRequest, Phase, RankPlacement
from runtime.backends.local import LocalBackend
from runtime.jobspec import CheckpointSpec, WorkloadSpec
from runtime.recovery.checkpoint import checkpoint_name
from runtime.recovery.store import LocalStore
from tests.runtime.conftest import wait_for, wait_until_final

pytestmark = pytest.mark.runtime

WORKLOAD = WorkloadSpec(steps=60, global_batch=96, seed=11, lr=0.05)
FLAVORS = ["h100-sxm", "a100-sxm", "ascend-910b", "tpu-v4"]


def _request(job_id: str, ranks: int, tmp_path: Path, spec: CheckpointSpec, **workload: Any) -> LaunchRequest:
    placements = tuple(
        RankPlacement(rank=i, device_id=f"dev/{i}", flavor=FLAVORS[i % len(FLAVORS)], node="node") for i in range(ranks)
    )
    return LaunchRequest(
        job_id=job_id,
        placements=placements,
        workload=WorkloadSpec(**{**WORKLOAD.__dict__, **workload}),
        telemetry_url=None,
        telemetry_token="",
        artifacts_dir=str(tmp_path / "artifacts" / job_id),
        checkpoint=spec,
        checkpoint_url=str(tmp_path / "checkpoints"),
    )


def _events(run_dir: Path, rank: int = 0) -> list[dict[str, Any]]:
    path = run_dir / f"telemetry.rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _losses(run_dir: Path) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in _events(run_dir) if e["kind"] == "step"}


def _run(backend: LocalBackend, request: LaunchRequest) -> Path:
    handle = backend.provision(request)
    observation = wait_until_final(backend, handle, timeout_s=120)
    assert observation.phase == Phase.SUCCEEDED, observation.reason
    return Path(handle["run_dir"])


@pytest.mark.parametrize("resume_ranks", [2, 4])
def test_a_checkpoint_saved_on_three_ranks_resumes_on_another_world_size_with_the_same_data_order(
    make_backend: Callable[..., LocalBackend], tmp_path: Path, resume_ranks: int
) -> None:
    backend = make_backend(telemetry_files=True)
    every = CheckpointSpec(weights_every=10, optimizer_every=10, keep=10)
    reference = _losses(_run(backend, _request("reference", 3, tmp_path / "ref", every)))

    # The first attempt runs 35 steps on 3 ranks (its checkpoints: 10, 20, 30)...
    _run(backend, _request("first", 3, tmp_path, every, steps=35))
    assert LocalStore(tmp_path / "checkpoints").names()[-1] == checkpoint_name(30)
    # ... and the next one goes on from step 30 on another number of ranks of other flavors.
    resumed_dir = _run(backend, _request("second", resume_ranks, tmp_path, every))
    [restored] = [e for e in _events(resumed_dir) if e["kind"] == "restored"]
    assert (restored["step"], restored["optimizer_step"]) == (30, 30)
    assert (restored["saved_world_size"], restored["world_size"]) == (3, resume_ranks)

    losses = _losses(resumed_dir)
    assert sorted(losses) == list(range(31, 61))
    # Weights, optimizer state and data order all continue: every later step's global-batch loss is
    # the uninterrupted run's (up to the float order of a different split). A skipped or repeated
    # sample would change the batch and its loss by far more.
    for step, loss in losses.items():
        assert loss == pytest.approx(reference[step], rel=1e-4, abs=1e-6), step


def test_a_corrupt_newest_checkpoint_is_skipped_and_the_one_before_restored(
    make_backend: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    backend = make_backend(telemetry_files=True)
    spec = CheckpointSpec(weights_every=10, optimizer_every=10, keep=5)
    _run(backend, _request("first", 3, tmp_path, spec, steps=40))
    newest = tmp_path / "checkpoints" / checkpoint_name(40) / "weights.pt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte, as a bad disk would do
    newest.write_bytes(bytes(data))

    resumed_dir = _run(backend, _request("second", 2, tmp_path, spec, steps=50))
    [restored] = [e for e in _events(resumed_dir) if e["kind"] == "restored"]
    assert restored["step"] == 30
    assert [s["checkpoint"] for s in restored["skipped"]] == [checkpoint_name(40)]
    assert "sha256" in restored["skipped"][0]["reason"] or "checksum" in restored["skipped"][0]["reason"]


def test_a_rank_that_stops_sending_heartbeats_is_killed_and_named(
    make_backend: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    backend = make_backend(telemetry_files=True, heartbeat_timeout_s=2.0)
    spec = CheckpointSpec(weights_every=10, optimizer_every=10)
    handle = backend.provision(_request("silent", 3, tmp_path, spec, steps=100_000))
    run_dir = Path(handle["run_dir"])
    assert wait_for(lambda: (run_dir / "heartbeat.rank1").exists() and len(_losses(run_dir)) > 3, timeout_s=60)
    pid = next(r["pid"] for r in json.loads((run_dir / "status.json").read_text())["ranks"] if r["rank"] == 1)

    stopped_at = time.time()
    os.kill(pid, signal.SIGSTOP)  # alive, sockets open, silent: a wedged device
    observation = wait_until_final(backend, handle, timeout_s=60)

    assert observation.phase == Phase.FAILED
    assert observation.failure is not None
    assert (observation.failure.rank, observation.failure.cause) == (1, "heartbeat")
    # Its last heartbeat came up to a second before the stop; the supervisor declares it after 2 s of silence.
    assert 1.0 <= observation.failure.detected_at - stopped_at < 6.0
    assert "rank 1 sent no heartbeat for 2 s" in observation.reason


def test_two_ranks_killed_at_once_are_both_reported(make_backend: Callable[..., LocalBackend], tmp_path: Path) -> None:
    """Issue 17, item 19: every rank that failed on its own is in the observation, not only the first;
    the rank the supervisor then stopped (SIGTERM) is not."""
    backend = make_backend(telemetry_files=True)
    spec = CheckpointSpec(weights_every=10, optimizer_every=10)
    handle = backend.provision(_request("two-down", 3, tmp_path, spec, steps=100_000))
    run_dir = Path(handle["run_dir"])
    assert wait_for(lambda: len(_losses(run_dir)) > 3, timeout_s=60)
    pids = {r["rank"]: r["pid"] for r in json.loads((run_dir / "status.json").read_text())["ranks"]}
    os.kill(pids[0], signal.SIGKILL)
    os.kill(pids[2], signal.SIGKILL)
    observation = wait_until_final(backend, handle, timeout_s=60)

    assert observation.phase == Phase.FAILED
    assert sorted((f.rank, f.cause, f.exit_code) for f in observation.failures) == [
        (0, "signal", -signal.SIGKILL),
        (2, "signal", -signal.SIGKILL),
    ]
    assert all(f.device_suspect for f in observation.failures)
    assert observation.failure is not None and observation.failure.rank in (0, 2)


def test_a_stop_request_ends_every_rank_after_one_full_checkpoint(
    make_backend: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    backend = make_backend(telemetry_files=True)
    spec = CheckpointSpec(weights_every=1000, optimizer_every=1000)
    handle = backend.provision(_request("drained", 3, tmp_path, spec, steps=100_000))
    run_dir = Path(handle["run_dir"])
    assert wait_for(lambda: len(_losses(run_dir)) > 5, timeout_s=60)

    backend.request_stop(handle, "node drained by a test")
    observation = wait_until_final(backend, handle, timeout_s=60)

    assert observation.phase == Phase.STOPPED, observation.reason
    assert [r.exit_code for r in observation.ranks] == [4, 4, 4]
    last = max(_losses(run_dir))
    assert LocalStore(tmp_path / "checkpoints").names() == [checkpoint_name(last)]
    [stopped] = [e for e in _events(run_dir) if e["kind"] == "stopped"]
    assert "node drained by a test" in stopped["reason"]
