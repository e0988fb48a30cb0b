"""0009 carries each job's run state from the job row to attempt rows, and back."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("jobs", "0008_device_health")]
AFTER = [("jobs", "0009_attempts")]


def _migrate(targets: list[tuple[str, str]]):
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    executor.loader.build_graph()
    return executor.loader.project_state(targets).apps


@pytest.fixture
def old_apps(transactional_db):
    apps = _migrate(BEFORE)
    yield apps
    _migrate(executor_leaves())


def executor_leaves() -> list[tuple[str, str]]:
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


def test_run_state_moves_to_attempts_and_back(old_apps, tenants):
    TrainingJob = old_apps.get_model("jobs", "TrainingJob")
    old_handle, live_handle = {"run_dir": "/runs/a0"}, {"run_dir": "/runs/a2"}
    asked = 1_700_000_000.5
    preempted = TrainingJob.objects.create(
        tenant_id=tenants[0].id,
        name="moved",
        spec={"name": "moved", "devices": 2, "flavors": ["a100-sxm"]},
        state="running",
        attempt=2,
        backend_handle=live_handle,
        stop_requested="node n1 drained",
        pending_teardowns=[old_handle],
        rank_stats={"0": {"step": 5}, "balance": {"split": [[1, 2]]}, "comm": {"ran": {"policy": "none"}}},
        recovery={
            "stopping": {json.dumps(old_handle, sort_keys=True): asked},
            "previous_devices": ["gpu-a100-0/0"],
            "frozen_at": asked + 10,
            "restored": {"step": 4},
        },
    )

    apps = _migrate(AFTER)
    Job, Attempt = apps.get_model("jobs", "TrainingJob"), apps.get_model("jobs", "JobAttempt")
    job = Job.objects.get(pk=preempted.pk)
    assert (job.rank_stats, job.balance_stats, job.comm_stats) == (
        {"0": {"step": 5}},
        {"split": [[1, 2]]},
        {"ran": {"policy": "none"}},
    )
    assert job.recovery == {"restored": {"step": 4}}
    attempts = {a.number: a for a in Attempt.objects.filter(job_id=job.pk)}
    assert sorted(attempts) == [1, 2]
    current, earlier = attempts[2], attempts[1]
    assert (current.backend_handle, current.stop_requested, current.previous_devices) == (
        live_handle,
        "node n1 drained",
        ["gpu-a100-0/0"],
    )
    assert (earlier.backend_handle, earlier.torn_down_at) == (old_handle, None)
    assert earlier.stop_asked_at == datetime.fromtimestamp(asked, UTC)
    assert (earlier.ended_as, earlier.ended_at) == ("recovering", datetime.fromtimestamp(asked + 10, UTC))

    _migrate(BEFORE)
    back = TrainingJob.objects.get(pk=preempted.pk)
    assert (back.backend_handle, back.stop_requested, back.pending_teardowns) == (
        live_handle,
        "node n1 drained",
        [old_handle],
    )
    assert back.rank_stats == preempted.rank_stats
    assert back.recovery == preempted.recovery
