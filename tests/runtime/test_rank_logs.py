"""Each rank's output on the local backend: captured through pipes, capped per rank, read back by cursor.

The reader's own rules (rotation, cursors, long lines) are checked on logs written directly; the
capture is checked on real supervisors: LocalBackend jobs whose ranks print, and a supervisor whose
"rank" is a small program that writes 10 MB at once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from runtime.backends.base import LaunchRequest, LogLine, Phase, RankPlacement
from runtime.backends.local import LocalBackend
from runtime.backends.local.logs import (
    MAX_LINE_BYTES,
    MIN_CAP_BYTES,
    CappedLog,
    last_lines,
    rank_log,
    read_logs,
)
from runtime.jobspec import WorkloadSpec
from tests.runtime.conftest import processes_mentioning, wait_for, wait_until_final
from tests.supervised import supervise_programs

pytestmark = pytest.mark.runtime


def _all_lines(run_dir: Path, rank: int | None = None, since: str | float | None = None) -> list[LogLine]:
    lines: list[LogLine] = []
    while True:
        page = read_logs(run_dir, rank, since, limit=5000)
        lines.extend(page.lines)
        since = page.cursor
        if not page.more:
            return lines


# --- the log files and their reader -----------------------------------------------------------------


def test_a_follower_gets_every_line_exactly_once_across_rotations(tmp_path: Path) -> None:
    log = CappedLog(rank_log(tmp_path, 0), MIN_CAP_BYTES)
    cursor = None
    seen: list[int] = []
    for batch in range(60):  # about 3 MB through a 1 MiB cap: the segments rotate many times
        log.write(
            "out" if batch % 2 else "err", [b"%d-%d " % (batch, i) + b"x" * 900 for i in range(50)], 1000.0 + batch
        )
        page = read_logs(tmp_path, 0, cursor, limit=80)  # a page is smaller than a batch: the cursor carries on
        while True:
            assert page.dropped == {}  # this follower keeps up
            seen.extend(line.number for line in page.lines)
            cursor = page.cursor
            if not page.more:
                break
            page = read_logs(tmp_path, 0, cursor, limit=80)
    log.close()
    assert seen == list(range(60 * 50))
    assert rank_log(tmp_path, 0).with_name("rank0.log.1").exists()
    size = sum(p.stat().st_size for p in tmp_path.glob("rank0.log*"))
    assert size <= MIN_CAP_BYTES


def test_a_reader_that_falls_behind_is_told_how_many_lines_the_cap_dropped(tmp_path: Path) -> None:
    log = CappedLog(rank_log(tmp_path, 3), MIN_CAP_BYTES)
    log.write("out", [b"first %d" % i for i in range(10)], 1.0)
    first = read_logs(tmp_path, 3, None, limit=4)
    assert [line.text for line in first.lines] == ["first 0", "first 1", "first 2", "first 3"]
    assert first.dropped == {} and first.more
    log.write("out", [b"%d " % i + b"y" * 2000 for i in range(2000)], 2.0)  # 4 MB: most of it dropped
    log.write("err", [b"later"], 3.0)
    log.close()

    page = read_logs(tmp_path, 3, first.cursor, limit=100_000)
    kept = [line.number for line in page.lines]
    assert kept == list(range(kept[0], 2011))  # the newest lines, whole and in order
    assert page.dropped == {3: kept[0] - 4}  # exactly the lines between the cursor and what is left
    # A fresh read counts every line gone since the start.
    assert read_logs(tmp_path, 3).dropped == {3: kept[0]}
    # Lines read at or after a time: the dropped ones count only if they were that recent.
    assert read_logs(tmp_path, 3, since=2.0).dropped == {3: kept[0]}
    later = read_logs(tmp_path, 3, since=3.0)
    assert [line.text for line in later.lines] == ["later"] and later.dropped == {}


def test_long_lines_are_split_and_a_last_line_without_newline_is_kept(tmp_path: Path) -> None:
    program = (
        "import sys\n"
        f"sys.stdout.write('a' * {MAX_LINE_BYTES * 2 + 10} + '\\n')\n"
        "sys.stdout.write('crlf\\r\\n')\n"
        "sys.stderr.write('no newline at the end')\n"
    )
    supervise_programs(tmp_path, {0: program})
    lines = _all_lines(tmp_path, 0)
    assert [(line.stream, len(line.text)) for line in lines if line.stream == "out"] == [
        ("out", MAX_LINE_BYTES),
        ("out", MAX_LINE_BYTES),
        ("out", 10),
        ("out", 4),
    ]
    assert [line.text for line in lines if line.stream == "err"] == ["no newline at the end"]
    assert [line.text for line in last_lines(rank_log(tmp_path, 0), 1, stream="out")] == ["crlf"]


def test_a_cursor_that_is_not_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a log cursor"):
        read_logs(tmp_path, None, "2024-01-01")
    with pytest.raises(ValueError, match="not a log cursor"):
        read_logs(tmp_path, None, "c0-1-x-3")
    assert read_logs(tmp_path).lines == ()  # nothing captured yet: an empty page


# --- capture by a real supervisor -------------------------------------------------------------------


def _peak_rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


BURST_LINES = 100_000  # of 100 bytes each: 10 MB from one rank at once


def test_a_10_mb_burst_keeps_the_log_under_its_cap_and_the_supervisor_small(tmp_path: Path) -> None:
    run_dir = tmp_path / "burst"
    burst = (
        "import os, sys, time\n"
        f"for i in range({BURST_LINES}):\n"
        "    sys.stdout.write(f'{i:09d} ' + 'b' * 89 + '\\n')\n"
        "sys.stdout.flush()\n"
        "print('burst done', file=sys.stderr, flush=True)\n"
        "while not os.path.exists('release'):\n"  # the supervisor stays up until its memory was read
        "    time.sleep(0.05)\n"
    )
    quiet = "import time\nfor i in range(3):\n    print('quiet', i, flush=True)\n"
    cap = 2 * MIN_CAP_BYTES
    supervisor = supervise_programs(run_dir, {0: burst, 1: quiet}, cap_bytes=cap)
    try:
        # Both streams reached the log (in either order: each has its own pipe).
        last_out = f"{BURST_LINES - 1:09d} " + "b" * 89
        log = rank_log(run_dir, 0)
        assert wait_for(
            lambda: (
                [x.text for x in last_lines(log, 1, stream="out")] == [last_out]
                and [x.text for x in last_lines(log, 1, stream="err")] == ["burst done"]
            ),
            60,
        )
        peak_mib = _peak_rss_mib(supervisor.pid)
    finally:
        (run_dir / "release").write_text("")
    assert supervisor.wait(timeout=30) == 0

    # Bounded: the supervisor held a pipe's worth of the burst, never the burst.
    assert peak_mib < 200, peak_mib
    on_disk = sum(p.stat().st_size for p in run_dir.glob("rank0.log*"))
    assert on_disk <= cap, on_disk
    # Nothing was lost on the way: the lines that are left are the last ones written, whole and in
    # order, and the dropped ones are counted exactly.
    page = read_logs(run_dir, 0, limit=BURST_LINES)
    out = [line for line in page.lines if line.stream == "out"]
    first = int(out[0].text[:9])
    assert [line.text for line in out] == [f"{i:09d} " + "b" * 89 for i in range(first, BURST_LINES)]
    numbers = [line.number for line in page.lines]
    assert numbers == list(range(numbers[0], BURST_LINES + 1))  # 100,000 lines and "burst done", numbered from 0
    assert page.dropped == {0: numbers[0]} and numbers[0] > 0
    # The quiet rank lost nothing, and an all-ranks read interleaves both by time.
    assert [line.text for line in _all_lines(run_dir, 1)] == ["quiet 0", "quiet 1", "quiet 2"]
    both = _all_lines(run_dir)
    assert {line.rank for line in both} == {0, 1}
    assert [line.time for line in both] == sorted(line.time for line in both)


# --- LocalBackend jobs ------------------------------------------------------------------------------


def _request(job_id: str, tmp_path: Path, steps: int) -> LaunchRequest:
    placements = tuple(
        RankPlacement(rank=i, device_id=f"h100-node/{i}", flavor="h100-sxm", node="h100-node") for i in (0, 1)
    )
    return LaunchRequest(
        job_id=job_id,
        placements=placements,
        workload=WorkloadSpec(steps=steps, global_batch=32),
        telemetry_url=None,
        telemetry_token="",
        artifacts_dir=str(tmp_path / "artifacts" / job_id),
    )


def test_a_two_rank_jobs_output_is_served_by_rank_and_interleaved(
    make_backend: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    backend = make_backend()
    handle = backend.provision(_request("logs-ok", tmp_path, steps=20))
    assert wait_until_final(backend, handle, timeout_s=120).phase == Phase.SUCCEEDED

    run_dir = Path(handle["run_dir"])
    assert sorted(p.name for p in run_dir.glob("rank*.log*")) == ["rank0.log", "rank1.log"]
    assert not list(run_dir.glob("rank*.out")) and not list(run_dir.glob("rank*.err"))
    for rank in (0, 1):
        page = backend.logs(handle, rank=rank)
        finished = [line for line in page.lines if "finished 20 steps" in line.text]
        assert [(line.rank, line.stream) for line in finished] == [(rank, "out")], page.lines
        assert backend.logs(handle, rank=rank, since=page.cursor).lines == ()  # nothing after the end
    everything = backend.logs(handle)
    assert {line.rank for line in everything.lines} == {0, 1}
    assert "finished 20 steps" in backend.logs(handle, tail=1).lines[0].text  # a rank's last words
    assert processes_mentioning(str(run_dir)) == []


def test_a_failed_jobs_reason_quotes_the_culprits_last_lines(
    make_backend: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    backend = make_backend(worker_overrides={1: {"fail_at_step": 3}}, log_cap_bytes=MIN_CAP_BYTES)
    handle = backend.provision(_request("logs-fail", tmp_path, steps=500))
    observation = wait_until_final(backend, handle, timeout_s=120)
    assert observation.phase == Phase.FAILED

    reason = observation.reason
    headline, _, quoted = reason.partition("\n")
    assert headline.startswith("rank 1 exited with code 1: ") and "injected failure at step 3" in headline, reason
    title, _, body = quoted.partition("\n")
    stderr = [line.text for line in backend.logs(handle, rank=1).lines if line.stream == "err"]
    assert title == f"--- last {min(15, len(stderr))} lines of rank 1's stderr (run logs-fail) ---", reason
    assert body.splitlines() == stderr[-15:]  # the lines that matter, as the log has them
    assert launch_cap(Path(handle["run_dir"])) == MIN_CAP_BYTES


def launch_cap(run_dir: Path) -> int:
    cap: int = json.loads((run_dir / "launch.json").read_text())["log_cap_bytes"]
    return cap


def test_a_cap_below_the_minimum_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="log_cap_bytes"):
        LocalBackend(tmp_path, {}, log_cap_bytes=1000)


def test_lines_reach_the_log_while_the_rank_still_runs(tmp_path: Path) -> None:
    run_dir = tmp_path / "live"
    program = (
        "import os, time\nprint('hello', flush=True)\nwhile not os.path.exists('release'):\n    time.sleep(0.05)\n"
    )
    supervisor = supervise_programs(run_dir, {0: program})
    try:
        # Seen while the rank still runs (it waits for the release), not when it ends.
        assert wait_for(lambda: [x.text for x in read_logs(run_dir, 0).lines] == ["hello"], 30)
        assert supervisor.poll() is None
    finally:
        (run_dir / "release").write_text("")
    assert supervisor.wait(timeout=30) == 0
