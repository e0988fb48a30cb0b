"""Dynamic balancing on the local backend: when one rank's speed halves mid-run, the split follows."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from runtime.backends.base import LaunchRequest, Phase, RankPlacement
from runtime.backends.local import LocalBackend
from runtime.backends.local.bench import step_events
from runtime.jobspec import WorkloadSpec
from tests.runtime.conftest import processes_mentioning, wait_for, wait_until_final

pytestmark = pytest.mark.runtime

SPEEDS = {"chip-1x": 0.25, "chip-2x": 0.5, "chip-4x": 1.0}
GLOBAL_BATCH = 96
STEPS = 160
SLOW_AFTER_STEP = 50
# After the slowed rank's own speed shows the change, the split must follow within this many steps
# (EWMA 0.3 and patience 3 need about 5; the rest is margin for a shared 2-core host).
ADAPT_WITHIN = 15


def _steps(run_dir: Path, rank: int) -> list[dict[str, Any]]:
    return step_events(run_dir / f"telemetry.rank{rank}.jsonl")


def _all_events(run_dir: Path, rank: int) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / f"telemetry.rank{rank}.jsonl").read_text().splitlines()]


def test_the_split_follows_a_rank_that_slows_down(tmp_path: Path) -> None:
    backend = LocalBackend(
        tmp_path / "runs",
        {flavor: {"relative_speed": speed} for flavor, speed in SPEEDS.items()},
        sample_time_ms=0.5,
        telemetry_files=True,
        grace_s=3.0,
    )
    placements = tuple(
        RankPlacement(rank=i, device_id=f"n/{i}", flavor=flavor, node="n", score=speed * 4)
        for i, (flavor, speed) in enumerate(SPEEDS.items())
    )
    request = LaunchRequest(
        job_id="drift-1",
        placements=placements,
        workload=WorkloadSpec(steps=STEPS, global_batch=GLOBAL_BATCH, lr=0.05, hidden=32),
        telemetry_url=None,
        telemetry_token="",
        artifacts_dir=str(tmp_path / "artifacts"),
        balancing="dynamic",
    )
    handle = backend.provision(request)
    run_dir = Path(handle["run_dir"])
    try:
        assert wait_for(lambda: len(_steps(run_dir, 0)) >= SLOW_AFTER_STEP, timeout_s=90, interval_s=0.02)
        backend.set_speed(handle, 2, 0.5)  # the 4x chip halves
        observation = wait_until_final(backend, handle, timeout_s=120)
        assert observation.phase == Phase.SUCCEEDED, observation.reason
    finally:
        backend.teardown(handle)
    assert processes_mentioning(str(run_dir)) == []

    ranks = [_steps(run_dir, r) for r in range(3)]
    assert all([e["step"] for e in steps] == list(range(1, STEPS + 1)) for steps in ranks)
    splits = [e["split"] for e in ranks[0]]
    for step, split in enumerate(splits):
        # No sample lost or repeated, no rank idle, and every rank trained on what the split said.
        assert sum(map(sum, split)) == GLOBAL_BATCH
        for rank in range(3):
            samples = sum(chunk[rank] for chunk in split)
            assert samples >= 1
            assert ranks[rank][step]["samples"] == samples, (step + 1, rank)

    # The step from which rank 2's own speed shows the halving (the speed file is re-read every 0.5 s):
    # the first of three slow steps in a row, as the balancer's patience asks, so that one step slowed by
    # the shared host before the change does not start the clock early.
    before = statistics.median(e["samples_per_s"] for e in ranks[2][10:SLOW_AFTER_STEP])
    after = ranks[2][SLOW_AFTER_STEP - 5 :]
    slowed = next(
        e["step"]
        for i, e in enumerate(after)
        if all(later["samples_per_s"] < 0.75 * before for later in after[i : i + 3])
    )
    share_before = sum(chunk[2] for chunk in splits[slowed - 2])
    adapted = next(
        (i + 1 for i in range(slowed - 1, STEPS) if sum(chunk[2] for chunk in splits[i]) < share_before), None
    )
    assert adapted is not None, "the split never followed the slowed rank"
    assert adapted - slowed <= ADAPT_WITHIN, (slowed, adapted)

    rebalanced = [e for e in _all_events(run_dir, 0) if e["kind"] == "rebalanced"]
    assert any(e["step"] >= slowed for e in rebalanced)
    for event in rebalanced:
        assert sum(map(sum, event["new_split"])) == GLOBAL_BATCH and event["reason"]
        assert event["steps_since_drift"] >= 1
    last = ranks[0][-1]
    assert 0 < last["efficiency"] <= 1.0 and len(last["predicted"]) == 3
