"""Pure pieces of the local backend: step padding, live speed changes, run-dir bookkeeping.

No process is started here; observe and teardown are exercised on hand-made run directories.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime.backends.base import LaunchRequest, Phase, RankPlacement
from runtime.backends.local import LocalBackend
from runtime.backends.local.emulation import SpeedSource, make_padding_hook, padding_seconds, parse_speed
from runtime.jobspec import WorkloadSpec
from runtime.worker import StepInfo

PROFILES = {"fast": {"relative_speed": 1.0}, "slow": {"relative_speed": 0.25}, "plain": {}}


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _request(
    job_id: str = "job-1", flavors: tuple[str, ...] = ("fast", "slow"), ranks: tuple[int, ...] = ()
) -> LaunchRequest:
    ranks = ranks or tuple(range(len(flavors)))
    return LaunchRequest(
        job_id=job_id,
        placements=tuple(RankPlacement(r, f"n/{r}", f, "n") for r, f in zip(ranks, flavors, strict=True)),
        workload=WorkloadSpec(steps=3, global_batch=8),
        telemetry_url=None,
        telemetry_token="",
        artifacts_dir="/nonexistent",
    )


@pytest.mark.parametrize(
    ("samples", "ms", "speed", "elapsed", "expected"),
    [
        (32, 0.5, 1.0, 0.0, 0.016),
        (32, 0.5, 0.32, 0.01, 0.04),  # 32 * 0.5 ms / 0.32 = 50 ms, 10 ms already spent
        (32, 0.5, 1.0, 0.5, 0.0),  # compute already took longer: no padding
        (0, 0.5, 0.5, 0.0, 0.0),
        (10, 0.0, 0.5, 0.0, 0.0),
    ],
)
def test_padding_tops_a_step_up_to_its_emulated_time(
    samples: int, ms: float, speed: float, elapsed: float, expected: float
) -> None:
    assert padding_seconds(samples, ms, speed, elapsed) == pytest.approx(expected)


def test_padding_needs_a_positive_speed() -> None:
    with pytest.raises(ValueError, match="relative_speed"):
        padding_seconds(1, 0.5, 0.0, 0.0)


def test_the_hook_sleeps_the_difference() -> None:
    clock, slept = FakeClock(), list[float]()
    hook = make_padding_hook(1.0, SpeedSource(0.5), clock=clock, sleep=slept.append)
    clock.now = 100.004  # 4 ms since the step began
    hook(StepInfo(step=1, total_steps=9, samples=10, compute_time_s=0.004, started_at=100.0))
    assert slept == [pytest.approx(0.016)]  # 10 * 1 ms / 0.5 = 20 ms in all
    clock.now = 100.5
    hook(StepInfo(step=2, total_steps=9, samples=10, compute_time_s=0.5, started_at=100.0))
    assert len(slept) == 1


@pytest.mark.parametrize(("text", "value"), [("0.5", 0.5), (" 2\n", 2.0), ("0", None), ("-1", None), ("x", None)])
def test_speed_file_content(text: str, value: float | None) -> None:
    assert parse_speed(text) == value
    assert parse_speed("nan") is None and parse_speed("inf") is None


def test_the_speed_file_is_reread_at_most_every_half_second(tmp_path: Path) -> None:
    clock, path = FakeClock(), tmp_path / "speed.rank0"
    source = SpeedSource(0.32, path, clock=clock)
    assert source.current() == 0.32  # no file: the profile's speed
    path.write_text("0.8")
    clock.now += 0.2
    assert source.current() == 0.32  # read less than 0.5 s ago
    clock.now += 0.4
    assert source.current() == 0.8
    path.write_text("garbage")
    clock.now += 0.6
    assert source.current() == 0.8  # an unusable value keeps the last good one
    path.unlink()
    clock.now += 0.6
    assert source.current() == 0.8


def test_provision_rejects_bad_requests_and_creates_nothing(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "runs", PROFILES)
    with pytest.raises(ValueError, match="job_id"):
        backend.provision(_request(job_id="../escape"))
    with pytest.raises(ValueError, match="'tpu' has no local profile"):
        backend.provision(_request(flavors=("fast", "tpu")))
    with pytest.raises(ValueError, match=r"ranks must be 0\.\.n-1"):
        backend.provision(_request(ranks=(0, 2)))
    with pytest.raises(ValueError, match="relative_speed"):
        LocalBackend(tmp_path / "runs", {"bad": {"relative_speed": 0}}).provision(_request(flavors=("bad",)))
    assert not (tmp_path / "runs").exists()


def test_provision_of_a_claimed_job_returns_the_same_handle_without_launching(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "runs", PROFILES)
    run_dir = tmp_path / "runs" / "job-1"
    run_dir.mkdir(parents=True)
    (run_dir / "launch.lock").write_text("{}")
    handle = backend.provision(_request())
    assert handle == {"backend": "local", "run_dir": str(run_dir.resolve()), "job_id": "job-1"}
    assert sorted(p.name for p in run_dir.iterdir()) == ["launch.lock"]


def _run_dir(tmp_path: Path, name: str = "job-1") -> tuple[LocalBackend, dict[str, str], Path]:
    backend = LocalBackend(tmp_path / "runs", PROFILES)
    run_dir = backend.runs_dir / name
    run_dir.mkdir(parents=True)
    return backend, {"backend": "local", "run_dir": str(run_dir), "job_id": name}, run_dir


def test_observe_reads_the_run_dir(tmp_path: Path) -> None:
    backend, handle, run_dir = _run_dir(tmp_path)
    assert backend.observe({**handle, "run_dir": str(tmp_path / "elsewhere")}).phase == Phase.GONE
    assert backend.observe(handle).phase == Phase.GONE  # no launch was ever claimed here
    (run_dir / "launch.lock").write_text("{}")
    assert backend.observe(handle).phase == Phase.PENDING
    old = time.time() - 3600
    os.utime(run_dir / "launch.lock", (old, old))
    stuck = backend.observe(handle)
    assert stuck.phase == Phase.FAILED and "never started" in stuck.reason

    status = {"phase": "succeeded", "reason": "", "ranks": [{"rank": 0, "pid": 11, "exit_code": 0}]}
    (run_dir / "status.json").write_text(json.dumps(status))
    done = backend.observe(handle)
    assert done.phase == Phase.SUCCEEDED and done.ranks[0].exit_code == 0


def test_a_final_status_waits_for_its_supervisor_to_exit(tmp_path: Path) -> None:
    # The supervisor writes its final word, then exits: until it has, the job still has a process.
    backend, handle, run_dir = _run_dir(tmp_path)
    (run_dir / "launch.lock").write_text("{}")
    exiting = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(run_dir)])
    try:
        (run_dir / "supervisor.pid").write_text(f"{exiting.pid}\n")
        status = {"phase": "succeeded", "reason": "", "updated_at": time.time(), "ranks": []}
        (run_dir / "status.json").write_text(json.dumps(status))
        observation = backend.observe(handle)
        assert (observation.phase, observation.reason) == (Phase.RUNNING, "exiting: succeeded")

        # A supervisor hung in its exit long after its final word does not hold the job back.
        (run_dir / "status.json").write_text(json.dumps({**status, "updated_at": time.time() - 60}))
        assert backend.observe(handle).phase == Phase.SUCCEEDED
        (run_dir / "status.json").write_text(json.dumps(status))
    finally:
        exiting.kill()
        exiting.wait()
    assert backend.observe(handle).phase == Phase.SUCCEEDED


def test_a_supervisor_that_died_silently_means_failed(tmp_path: Path) -> None:
    backend, handle, run_dir = _run_dir(tmp_path)
    (run_dir / "launch.lock").write_text("{}")
    (run_dir / "supervisor.pid").write_text(f"{os.getpid()}\n")  # alive, but not a supervisor of this run
    (run_dir / "supervisor.err").write_text("Traceback...\nMemoryError\n")
    (run_dir / "status.json").write_text(json.dumps({"phase": "running", "ranks": [{"rank": 0, "pid": None}]}))
    observation = backend.observe(handle)
    assert observation.phase == Phase.FAILED
    assert "died without a final status" in observation.reason and "MemoryError" in observation.reason


def test_teardown_of_nothing_is_safe_and_records_the_end(tmp_path: Path) -> None:
    backend, handle, run_dir = _run_dir(tmp_path)
    backend.teardown({**handle, "run_dir": str(tmp_path / "missing")})
    (run_dir / "launch.lock").write_text("{}")
    backend.teardown(handle)
    backend.teardown(handle)
    observation = backend.observe(handle)
    assert observation.phase == Phase.FAILED and observation.reason == "torn down"


def test_teardown_keeps_the_cause_of_an_earlier_failure(tmp_path: Path) -> None:
    backend, handle, run_dir = _run_dir(tmp_path)
    (run_dir / "launch.lock").write_text("{}")
    (run_dir / "supervisor.pid").write_text("999999999\n")  # beyond any pid_max: long dead
    backend.teardown(handle)
    observation = backend.observe(handle)
    assert observation.phase == Phase.FAILED and "died without a final status" in observation.reason


def test_teardown_keeps_a_success(tmp_path: Path) -> None:
    backend, handle, run_dir = _run_dir(tmp_path)
    (run_dir / "launch.lock").write_text("{}")
    (run_dir / "status.json").write_text(json.dumps({"phase": "succeeded", "ranks": []}))
    backend.teardown(handle)
    assert backend.observe(handle).phase == Phase.SUCCEEDED


def test_a_foreign_handle_is_refused(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path, PROFILES)
    with pytest.raises(ValueError, match="not a local backend handle"):
        backend.observe({"backend": "kubernetes", "name": "x"})


def test_set_speed_writes_the_file_the_rank_rereads(tmp_path: Path) -> None:
    backend, handle, run_dir = _run_dir(tmp_path)
    backend.set_speed(handle, 1, 0.5)
    assert parse_speed((run_dir / "speed.rank1").read_text()) == 0.5
    with pytest.raises(ValueError):
        backend.set_speed(handle, 1, -2.0)
