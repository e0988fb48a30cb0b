"""Warm standby ranks (runtime.backends.local.standby): real processes, no control plane.

A restart's ranks run in standbys that were started before the failure; a claimed rank's output and
exit code reach its supervisor; a standby that dies is replaced; a claim whose environment differs
in what a process reads at start-up is refused; a pool of 0 keeps no process; stopping the pool
leaves no process behind.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.backends.base import Phase
from runtime.backends.local import LocalBackend
from runtime.backends.local import standby as standby_module
from runtime.backends.local.procs import pid_alive
from runtime.backends.local.sandbox import RunAs
from runtime.comm.link import LinkEmulation
from runtime.inventory import Pool
from runtime.jobspec import CheckpointSpec
from tests.processes import processes_mentioning
from tests.runtime.conftest import wait_for, wait_until_final, warm_pool
from tests.runtime.test_recovery import _events, _losses, _request

pytestmark = pytest.mark.runtime


def _standby_pids(pool_dir: Path) -> dict[int, float]:
    """The pool's waiting standbys: pid -> when it was started."""
    return {int(s["pid"]): float(s["started_at"]) for s in standby_module.pool_state(pool_dir).get("standbys", [])}


def _pool_full(pool_dir: Path, size: int) -> bool:
    return len(_standby_pids(pool_dir)) >= size


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory, demo_pool: Pool) -> Iterator[tuple[Path, LocalBackend]]:
    """A pool of two standbys in a short folder (a Unix socket's path is limited), stopped at the end."""
    backend = LocalBackend(tmp_path_factory.mktemp("sb") / "runs", demo_pool.local_profiles, standby_ranks=2)
    pool_dir = backend.standby_dir
    warm_pool(backend, 2)
    yield pool_dir, backend
    assert backend.stop_standby()
    assert wait_for(lambda: not processes_mentioning(str(pool_dir)), timeout_s=15), "the pool left processes behind"


def _claim(
    pool_dir: Path, backend: LocalBackend, tmp_path: Path, env: dict[str, str] | None = None
) -> tuple[standby_module.StandbyProc | None, str, Path]:
    """Claim a standby for the rank launcher with a config that does not exist (it exits 2 at once)."""
    err_path = tmp_path / "stderr"
    out_read, out_write = os.pipe()
    with open(err_path, "wb") as err:
        proc, why = standby_module.claim(
            pool_dir,
            backend.python,
            "runtime.backends.local.rank",
            ["--config", str(tmp_path / "missing.json"), "--speed", "1.0"],
            env if env is not None else {**backend.standby_env(), "HOME": str(tmp_path)},
            tmp_path,
            out_write,
            err.fileno(),
        )
    os.close(out_write)
    os.close(out_read)
    return proc, why, err_path


def test_a_claimed_standby_runs_the_rank_launcher_and_its_exit_code_comes_back(
    pool: tuple[Path, LocalBackend], tmp_path: Path
) -> None:
    pool_dir, backend = pool
    before = _standby_pids(pool_dir)
    proc, why, err_path = _claim(pool_dir, backend, tmp_path)

    assert proc is not None, why
    assert proc.pid in before  # a process that was waiting, not a new one
    assert proc.wait(timeout=30) == 2  # the worker's EXIT_BAD_CONFIG, relayed by the pool
    assert "unusable config" in err_path.read_text()  # its stderr went where the claimer said
    # It is replaced at once (a fork of the warm pool), by a process of its own.
    assert wait_for(lambda: _pool_full(pool_dir, 2) and proc.pid not in _standby_pids(pool_dir), timeout_s=10)


def test_a_claim_whose_environment_differs_at_start_up_is_refused(
    pool: tuple[Path, LocalBackend], tmp_path: Path
) -> None:
    pool_dir, backend = pool
    before = _standby_pids(pool_dir)
    env = {**backend.standby_env(), "OMP_NUM_THREADS": "4"}  # read when torch starts: a fresh rank must
    proc, why, _ = _claim(pool_dir, backend, tmp_path, env)

    assert proc is None
    assert "OMP_NUM_THREADS" in why
    assert _standby_pids(pool_dir) == before  # nothing was used up


def test_a_standby_that_dies_is_replaced(pool: tuple[Path, LocalBackend]) -> None:
    pool_dir, _ = pool
    victim = min(_standby_pids(pool_dir))
    replaced = int(standby_module.pool_state(pool_dir)["replaced"])
    os.kill(victim, signal.SIGKILL)

    assert wait_for(lambda: _pool_full(pool_dir, 2) and victim not in _standby_pids(pool_dir), timeout_s=10)
    assert int(standby_module.pool_state(pool_dir)["replaced"]) == replaced + 1


def test_ranks_in_a_network_namespace_or_with_variables_of_their_job_never_use_a_standby(
    make_backend: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    """A job's own variables (its keys, say) must never pass through the pool, whose memory every later
    standby copies, on their way to another tenant's rank."""
    backend = make_backend(standby_ranks=2)
    plain = _request("plain", 2, tmp_path, CheckpointSpec())
    with_env = _request("keys", 2, tmp_path, CheckpointSpec(), env={"API_KEY": "tenant-secret"})
    assert not backend._standby_usable(plain, LinkEmulation("netns", 1.0))
    assert not backend._standby_usable(with_env, LinkEmulation())
    assert not standby_module.pool_running(backend.standby_dir)  # and no pool was started for them


def test_a_claim_as_a_jobs_user_goes_only_to_a_pool_that_says_it_honours_one(tmp_path: Path) -> None:
    # A pool of an earlier version ignores the user and would run the rank as root.
    (tmp_path / standby_module.STATE_FILE).write_text(json.dumps({"pid": 1, "standbys": []}))
    proc, why = standby_module.claim(
        tmp_path, "python", "runtime.backends.local.rank", [], {}, tmp_path, 1, 2, run_as=RunAs(2_000_001, 2_000_001)
    )
    assert proc is None and "cannot run a rank as the job's user" in why


@pytest.mark.parametrize("run_as", [RunAs(0, 0), RunAs(1000, 1000), RunAs(2_000_001, 0)], ids=str)
def test_a_standby_runs_as_no_one_but_a_jobs_own_user(
    pool: tuple[Path, LocalBackend], tmp_path: Path, run_as: RunAs
) -> None:
    """Root forks the standbys: a claim may turn one into a job's user (``sandbox.identity_for``),
    never into root, a login user or a system group."""
    pool_dir, backend = pool
    before = _standby_pids(pool_dir)
    proc, why = standby_module.claim(
        pool_dir,
        backend.python,
        "runtime.backends.local.rank",
        ["--config", str(tmp_path / "missing.json"), "--speed", "1.0"],
        {**backend.standby_env(), "HOME": str(tmp_path)},
        tmp_path,
        1,
        2,
        run_as=run_as,
    )
    assert proc is None
    assert "a job's own user only" in why
    assert _standby_pids(pool_dir) == before  # nothing was used up


def test_a_pool_of_zero_keeps_no_process(make_backend: Callable[..., LocalBackend], tmp_path: Path) -> None:
    backend = make_backend(standby_ranks=0)
    handle = backend.provision(_request("cold", 2, tmp_path, CheckpointSpec(), steps=3))
    observation = wait_until_final(backend, handle, timeout_s=120)

    assert observation.phase == Phase.SUCCEEDED, observation.reason
    assert not backend.standby_dir.exists()
    status = json.loads((Path(handle["run_dir"]) / "status.json").read_text())
    assert all("standby" not in r for r in status["ranks"])


def _status(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "status.json").read_text())


def test_a_restart_runs_in_standbys_started_before_the_failure(
    tmp_path_factory: pytest.TempPathFactory, demo_pool: Pool
) -> None:
    root = tmp_path_factory.mktemp("sbr")
    backend = LocalBackend(
        root / "runs", demo_pool.local_profiles, sample_time_ms=0.1, grace_s=3.0, telemetry_files=True, standby_ranks=4
    )
    pool_dir = backend.standby_dir
    spec = CheckpointSpec(weights_every=10, optimizer_every=10)
    try:
        handle = backend.provision(_request("job", 3, root, spec, steps=100_000))  # starts the pool
        run_dir = Path(handle["run_dir"])
        assert wait_for(lambda: len(_losses(run_dir)) > 12, timeout_s=120)
        # Four: the restart's three ranks and its rendezvous store, all started before the kill.
        assert wait_for(lambda: _pool_full(pool_dir, 4), timeout_s=120), standby_module.pool_state(pool_dir)
        waiting = _standby_pids(pool_dir)
        victim = next(r["pid"] for r in _status(run_dir)["ranks"] if r["rank"] == 1)
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        failed = wait_until_final(backend, handle, timeout_s=60)
        assert failed.phase == Phase.FAILED and failed.failure is not None and failed.failure.rank == 1
        last = max(_losses(run_dir))

        restart = backend.provision(_request("job-a1", 3, root, spec, steps=last + 20))
        observation = wait_until_final(backend, restart, timeout_s=120)

        assert observation.phase == Phase.SUCCEEDED, observation.reason
        next_run = Path(restart["run_dir"])
        ranks = _status(next_run)["ranks"]
        assert all(r.get("standby") for r in ranks), _status(next_run).get("standby_note")
        assert {r["pid"] for r in ranks} <= set(waiting)  # processes that were waiting before the kill
        assert all(waiting[r["pid"]] < killed_at for r in ranks)
        restored = [e for e in _events(next_run) if e["kind"] == "restored"]
        assert restored and restored[0]["step"] >= 10
        assert max(_losses(next_run)) == last + 20
    finally:
        for run in ("job", "job-a1"):
            backend.teardown({"backend": "local", "run_dir": str(backend.runs_dir / run), "job_id": run})
        backend.stop_standby()
    assert wait_for(lambda: not processes_mentioning(str(pool_dir)), timeout_s=15), "the pool left processes behind"


def test_a_standby_rank_whose_supervisor_is_killed_is_stopped(
    tmp_path_factory: pytest.TempPathFactory, demo_pool: Pool
) -> None:
    """A fresh rank gets SIGTERM when its supervisor dies; a rank in a standby gets it from the pool.

    A pool of one serves the store and both ranks: a claimed standby is replaced by a fork in
    milliseconds, before the supervisor's next claim."""
    root = tmp_path_factory.mktemp("sbk")
    backend = LocalBackend(root / "runs", demo_pool.local_profiles, sample_time_ms=0.1, grace_s=3.0, standby_ranks=1)
    pool_dir = backend.standby_dir
    try:
        warm_pool(backend, 1)
        handle = backend.provision(_request("orphan", 2, root, CheckpointSpec(), steps=100_000))
        run_dir = Path(handle["run_dir"])
        assert wait_for(lambda: (run_dir / "heartbeat.rank1").exists(), timeout_s=60)
        ranks = _status(run_dir)["ranks"]
        assert all(r.get("standby") for r in ranks), _status(run_dir).get("standby_note")
        assert "standby_note" not in _status(run_dir)  # the store's process was warm too
        supervisor = _status(run_dir)["supervisor_pid"]
        os.kill(supervisor, signal.SIGKILL)

        alive = [r["pid"] for r in ranks]
        assert wait_for(lambda: not [p for p in alive if pid_alive(p)], timeout_s=30), (
            [p for p in alive if pid_alive(p)],
            standby_module.pool_state(pool_dir),
        )
    finally:
        backend.teardown({"backend": "local", "run_dir": str(backend.runs_dir / "orphan"), "job_id": "orphan"})
        backend.stop_standby()
    assert wait_for(lambda: not processes_mentioning(str(pool_dir)), timeout_s=15), processes_mentioning(str(pool_dir))
