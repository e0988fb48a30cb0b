"""The standby pool's pure parts: which environments a standby may take over, how a supervisor reads a
claimed rank's exit, and when a host cannot have a pool (runtime.backends.local.standby)."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

from runtime.backends.local import standby


def test_only_variables_read_after_the_hand_over_may_differ() -> None:
    startup = {"PYTHONPATH": "/src", "OMP_NUM_THREADS": "1", "HOME": "/pool", "AWS_REGION": "a"}
    late = {**startup, "HOME": "/job", "POLYCHIP_JOB_ID": "j", "AWS_REGION": "b", "AWS_ACCESS_KEY_ID": "k"}
    assert standby.env_mismatch(startup, late) == []
    # Read at start-up by Python or torch, or a job's own variable that might be: a fresh process.
    assert standby.env_mismatch(startup, {**startup, "OMP_NUM_THREADS": "4"}) == ["OMP_NUM_THREADS"]
    assert standby.env_mismatch(startup, {**startup, "EPOCHS": "3"}) == ["EPOCHS"]
    without = dict(startup)
    del without["PYTHONPATH"]
    assert standby.env_mismatch(startup, without) == ["PYTHONPATH"]


def test_the_exit_code_the_pool_relays_is_the_ranks() -> None:
    pool_end, supervisor_end = socket.socketpair()
    proc = standby.StandbyProc(supervisor_end, os.getpid(), "", 0.0)
    assert proc.poll() is None  # nothing yet: it runs
    pool_end.sendall(b"exit -9")
    assert proc.poll() is None  # half a line
    pool_end.sendall(b"\n")
    assert proc.poll() == -signal.SIGKILL
    assert proc.wait(timeout=1) == -signal.SIGKILL
    pool_end.close()


def test_a_rank_whose_pool_vanished_without_a_word_counts_as_terminated() -> None:
    pool_end, supervisor_end = socket.socketpair()
    proc = standby.StandbyProc(supervisor_end, 2**22 + 12345, "no such process", 0.0)
    pool_end.close()
    assert proc.poll() == standby.LOST_CODE == -signal.SIGTERM


def test_a_pool_folder_too_deep_for_a_unix_socket_has_no_pool(tmp_path: Path) -> None:
    assert standby.unavailable_reason(tmp_path / "runs" / ".standby") is None or len(str(tmp_path)) > 80
    deep = tmp_path / ("x" * 120) / ".standby"
    reason = standby.unavailable_reason(deep)
    assert reason is not None and "exceed" in reason


def test_a_claim_without_a_pool_is_refused_with_the_reason(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    try:
        proc, why = standby.claim(
            tmp_path, "python", "runtime.backends.local.rank", [], {}, tmp_path, write_end, write_end
        )
    finally:
        os.close(read_end)
        os.close(write_end)
    assert proc is None
    assert "no standby pool" in why
