"""Recovery through the real stack: kill -9 a rank, and the control plane brings the job back by itself.

Each test runs real gloo ranks under the local backend, with the ASGI server, a Celery worker and beat
(tests/stack.py), against PostgreSQL and Redis. Telemetry files are on in the stack, so a test can read
what a killed attempt's ranks did last.
"""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path
from typing import Any

import pytest

from billing.models import UsageRecord
from jobs import services
from jobs.models import Device, DeviceHealth, JobEvent, TrainingJob
from tests.attempts import handle_of, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

WEIGHTS_EVERY = 10
SPEC = {
    "name": "it-recover",
    "devices": 3,
    "flavors": ["ascend-910b"],
    "workload": {"steps": 120, "global_batch": 96, "seed": 5, "lr": 0.05},
    # Every save holds the optimizer state (the default): a restore gives the state of one step.
    "checkpoint": {"weights_every": WEIGHTS_EVERY, "keep": 3},
    "max_restarts": 2,
}
FINAL = {"succeeded", "failed", "cancelled"}


def _run_dir(job_id: int) -> Path:
    handle = wait_until(lambda: handle_of(job_id), what="a launched run")
    return Path(handle["run_dir"])


def _events(run_dir: Path, rank: int, kind: str = "step") -> list[dict[str, Any]]:
    path = run_dir / f"telemetry.rank{rank}.jsonl"
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue  # the line being written right now
    return [e for e in events if e["kind"] == kind]


def _last_step(run_dir: Path) -> int:
    return max((e["step"] for rank in range(8) for e in _events(run_dir, rank)), default=0)


def _last_saved(run_dir: Path) -> int:
    """The step of the newest checkpoint that rank 0 reported committed (it saves, the others do not)."""
    return max((e["step"] for e in _events(run_dir, 0, "checkpoint")), default=0)


def _kill(run_dir: Path, rank: int) -> None:
    status = json.loads((run_dir / "status.json").read_text())
    pid = next(r["pid"] for r in status["ranks"] if r["rank"] == rank)
    os.kill(pid, signal.SIGKILL)  # a device lost mid-step


def _final_loss(job: dict[str, Any]) -> float:
    return float(job["loss"]["last"])


def _messages(job_id: int, kind: str = "recovery") -> list[str]:
    return list(JobEvent.objects.filter(job_id=job_id, kind=kind).order_by("pk").values_list("message", flat=True))


def _return_devices() -> None:
    """The operator returns every device that recovery marked failed."""
    failed = list(Device.objects.filter(health=DeviceHealth.FAILED).values_list("device_id", flat=True))
    if failed:
        services.set_device_health(failed, DeviceHealth.HEALTHY, by="test operator")


@pytest.mark.slow
@pytest.mark.timeout(900)  # ten kills, each with its restart: about five minutes here
def test_killing_a_rank_ten_times_recovers_each_time_within_a_weights_interval_and_the_loss(api_for, tenants, pool):
    api = api_for(tenants[0].token)
    reference_id = api.post("/api/v1/jobs", {**SPEC, "name": "it-reference"}).json()["id"]
    reference = api.wait_for(reference_id, FINAL, timeout_s=120)
    assert reference["state"] == "succeeded", reference
    first, last = float(reference["loss"]["first"]), _final_loss(reference)

    chooser = random.Random(7)
    for trial in range(10):
        victim = trial % 3  # ranks 0, 1 and 2 in turn: rank 0 four times
        kill_at = chooser.randint(15, 95)
        job_id = api.post("/api/v1/jobs", {**SPEC, "name": f"it-trial-{trial}"}).json()["id"]
        run_dir = _run_dir(job_id)
        reached = lambda run_dir=run_dir, kill_at=kill_at: _last_step(run_dir) >= kill_at  # noqa: E731
        wait_until(reached, timeout_s=90, what="the kill step")
        _kill(run_dir, victim)

        job = api.wait_for(job_id, FINAL, timeout_s=120)
        assert job["state"] == "succeeded", (trial, job["failure_reason"], _messages(job_id))
        assert job["restarts"] == 1 and job["attempt"] == 1, (trial, job["restarts"], job["attempt"])
        # What is lost: the killed run's last step (its survivors flush their telemetry as they exit)
        # against the step the next attempt restored. Saves are written in the background while
        # training goes on (runtime/recovery/checkpoint.py), a save waits for the one still being
        # written, and rank 0 asks for the save of step N after step N's all-reduce. So once the run
        # went past interval boundary N, the save of N - 1 interval was committed, and the one of N
        # too unless the kill cut it short: the restore is from one of the two. A run killed right at
        # N (the survivors logged step N, rank 0 not yet past its save) may be one interval further
        # back. Rank 0's report of a commit can itself be cut short by the kill, so a reported save
        # is a lower bound only; what must never happen is a reported save passed over.
        restored = job["recovery"]["restored"]
        reached = _last_step(run_dir)
        passed = (reached - 1) - (reached - 1) % WEIGHTS_EVERY  # the newest boundary the run went past
        allowed = {passed, passed - WEIGHTS_EVERY} | ({reached} if reached % WEIGHTS_EVERY == 0 else set())
        saved = _last_saved(run_dir)
        assert restored["step"] >= saved, (trial, saved, restored)
        assert restored["step"] in allowed, (trial, reached, saved, restored)
        # The state of one step: the optimizer's momentum from the step the weights are from.
        assert restored["optimizer_step"] == restored["step"], (trial, restored)
        # The same final loss as the uninterrupted run, as a share of the loss reduction.
        gap = (_final_loss(job) - last) / (first - last)
        assert abs(gap) <= 0.01, (trial, _final_loss(job), last, gap)

        messages = _messages(job_id)
        assert messages[0].startswith(f"failure detected: rank {victim} was killed by SIGKILL"), messages
        assert any(m.startswith("device ") and "marked failed" in m for m in messages), messages
        assert any(m.startswith(f"restored step {restored['step']} on 3 rank(s)") for m in messages), messages
        assert any(m.startswith("training continues") for m in messages), messages
        transitions = list(
            JobEvent.objects.filter(job_id=job_id, kind="transition").values_list("from_state", "to_state")
        )
        assert ("running", "recovering") in transitions and ("recovering", "admitted") in transitions
        # Both attempts are metered, each allocation once.
        assert UsageRecord.objects.filter(job_id=job_id).count() == 6
        _return_devices()


def test_a_job_that_fails_more_than_max_restarts_ends_failed_with_the_reason(api_for, tenants, pool):
    api = api_for(tenants[0].token)
    spec = {**SPEC, "workload": {**SPEC["workload"], "steps": 100_000}, "max_restarts": 1}
    job_id = api.post("/api/v1/jobs", spec).json()["id"]
    first_run = _run_dir(job_id)
    wait_until(lambda: _last_step(first_run) >= 5, what="the first attempt's steps")
    _kill(first_run, 1)

    wait_until(lambda: TrainingJob.objects.get(pk=job_id).attempt == 1 and handle_of(job_id))
    second_run = _run_dir(job_id)
    assert second_run != first_run
    wait_until(lambda: _last_step(second_run) >= 5, what="the second attempt's steps")
    _kill(second_run, 2)

    job = api.wait_for(job_id, FINAL, timeout_s=60)
    assert job["state"] == "failed"
    assert "rank 2 was killed by SIGKILL" in job["failure_reason"]
    assert "gave up after 1 restart(s) (max_restarts 1)" in job["failure_reason"]
    assert job["restarts"] == 1


def test_a_job_shrinks_to_min_devices_and_grows_back_when_the_device_returns(api_for, tenants, pool):
    api = api_for(tenants[0].token)
    spec = {
        "name": "it-shrink",
        "devices": 2,
        "min_devices": 1,
        "flavors": ["h100-sxm"],  # the pool has two
        "workload": {"steps": 600, "global_batch": 64, "seed": 2},
        "checkpoint": {"weights_every": 10, "optimizer_every": 20},
    }
    job_id = api.post("/api/v1/jobs", spec).json()["id"]
    run_dir = _run_dir(job_id)
    wait_until(lambda: _last_step(run_dir) >= 20, what="steps before the kill")
    _kill(run_dir, 1)

    # The killed device is marked failed; one h100 is left, so the job goes on alone.
    wait_until(lambda: TrainingJob.objects.get(pk=job_id).attempt == 1 and _job_devices(job_id) == 1, what="the shrink")
    assert any("shrunk by 1" in m for m in _messages(job_id, "transition")), _messages(job_id, "transition")
    shrunk_run = _run_dir(job_id)
    wait_until(lambda: _last_step(shrunk_run) >= 40, what="steps on one device")

    _return_devices()  # the operator returns the device: the job checkpoints and grows back
    wait_until(lambda: TrainingJob.objects.get(pk=job_id).attempt == 2, timeout_s=60, what="the move back")
    job = api.wait_for(job_id, FINAL, timeout_s=120)
    assert job["state"] == "succeeded", (job["failure_reason"], _messages(job_id))
    assert job["restarts"] == 1  # growing back is a planned move, not a restart
    assert len(_last_attempt_devices(job)) == 2
    messages = _messages(job_id)
    assert any(m.startswith("asked to checkpoint and move: growing back from 1 to 2 devices") for m in messages)
    assert any(m.startswith("restored step") and "on 2 rank(s) (saved on 1)" in m for m in messages), messages
    assert any(m.startswith("checkpointed and stopped: growing back") for m in _messages(job_id, "transition")), (
        _messages(job_id, "transition")
    )


def test_draining_a_node_checkpoints_its_job_and_moves_it_to_another_flavor(api_for, tenants, pool):
    api = api_for(tenants[0].token)
    spec = {
        "name": "it-drain",
        "devices": 2,
        "flavors": ["h100-sxm", "a100-sxm"],
        "workload": {"steps": 400, "global_batch": 64, "seed": 4},
        "checkpoint": {"weights_every": 25, "optimizer_every": 50},
    }
    job_id = api.post("/api/v1/jobs", spec).json()["id"]
    run_dir = _run_dir(job_id)
    wait_until(lambda: _last_step(run_dir) >= 10, what="steps before the drain")
    node = TrainingJob.objects.get(pk=job_id).allocations.get(rank=0).device.node.name

    assert services.drain_node(node, by="op") == [job_id]

    job = api.wait_for(job_id, FINAL, timeout_s=120)
    assert job["state"] == "succeeded", (job["failure_reason"], _messages(job_id))
    assert job["restarts"] == 0 and job["attempt"] == 1
    assert all(d["node"] != node for d in _last_attempt_devices(job)), job["devices"]
    assert set(Device.objects.filter(node__name=node).values_list("health", flat=True)) == {DeviceHealth.CORDONED}
    stopped_at = max(e["step"] for e in _events(run_dir, 0))
    # The drain saved a full checkpoint at the step it stopped: nothing is redone.
    assert job["recovery"]["restored"]["step"] == stopped_at
    assert job["recovery"]["restored"]["optimizer_step"] == stopped_at


def _job_devices(job_id: int) -> int:
    return TrainingJob.objects.get(pk=job_id).allocations.filter(ended_at__isnull=True).count()


def _last_attempt_devices(job: dict[str, Any]) -> list[dict[str, Any]]:
    """A job's devices list every allocation it had; the last attempt's started last."""
    last = max(d["started_at"] for d in job["devices"])
    return [d for d in job["devices"] if d["started_at"] == last]


def test_a_device_predicted_to_fail_is_drained_after_its_job_checkpoints(api_for, tenants, pool, stack_var):
    import torch

    from jobs.predictor import save_predictor
    from runtime.backends.local import LocalBackend
    from runtime.recovery.predict import train_and_evaluate

    # The stack's sweep scores devices once a predictor is there (manage.py train_failure_predictor).
    torch.set_num_threads(1)
    save_predictor(train_and_evaluate(seed=0, quick=True), stack_var / "failure-predictor.pt")
    api = api_for(tenants[0].token)
    spec = {
        "name": "it-predicted",
        "devices": 2,
        "flavors": ["tpu-v4"],
        "workload": {"steps": 100_000, "global_batch": 64, "seed": 6},
        "checkpoint": {"weights_every": 50, "optimizer_every": 100},
    }
    job_id = api.post("/api/v1/jobs", spec).json()["id"]
    _run_dir(job_id)
    job = TrainingJob.objects.get(pk=job_id)
    device = job.allocations.get(rank=1).device
    # Half an hour of readings (heartbeats carry five emulated minutes a second) before the fault.
    wait_until(lambda: len(Device.objects.get(pk=device.pk).health_readings) >= 30, timeout_s=60, what="readings")

    LocalBackend(stack_var, {}).inject_degradation(handle_of(job_id), 1, "ecc", minutes_to_failure=90)

    drained = f"asked to checkpoint and move: device {device.device_id}: failure predicted"
    wait_until(lambda: any(m.startswith(drained) for m in _messages(job_id)), timeout_s=60, what="the prediction")
    wait_until(lambda: TrainingJob.objects.get(pk=job_id).attempt >= 1, timeout_s=60, what="the move")
    assert Device.objects.get(pk=device.pk).health == DeviceHealth.CORDONED
    # Its history: the alerts that led to the drain (scores at or above the threshold), then the cordon.
    history = services.device_events(device_id=device.device_id)
    assert [e.kind for e in history][:1] == ["health"] and history[0].to_health == "cordoned"
    assert history[0].by.startswith("failure predicted within")
    alerts = [e for e in history[1:] if e.kind == "alert"]
    assert len(alerts) >= 3 and all(e.score is not None for e in alerts)
    job = TrainingJob.objects.get(pk=job_id)
    assert job.restarts == 0  # moved after a checkpoint, before the device died: no failure to recover from
    assert device.pk not in set(job.allocations.filter(ended_at__isnull=True).values_list("device_id", flat=True))
    api.post(f"/api/v1/jobs/{job_id}/cancel")


@pytest.mark.timeout(600)
def test_the_elastic_round_shrinks_a_running_job_for_a_queued_one_and_both_finish(api_for, tenants, pool):
    acme, globex = api_for(tenants[0].token), api_for(tenants[1].token)
    spec = {
        "name": "it-elastic",
        "devices": {"min": 1, "max": 2},
        "flavors": ["h100-sxm"],  # the pool has two: it starts on both
        "workload": {"steps": 300, "global_batch": 64, "seed": 3},
        "checkpoint": {"weights_every": 10, "optimizer_every": 20},
    }
    job_id = acme.post("/api/v1/jobs", spec).json()["id"]
    run_dir = _run_dir(job_id)
    wait_until(lambda: _last_step(run_dir) >= 10, what="steps on two devices")
    short = {"name": "it-short", "devices": 1, "flavors": ["h100-sxm"], "workload": {"steps": 20, "seed": 1}}
    queued = globex.post("/api/v1/jobs", short).json()["id"]
    wait_until(lambda: TrainingJob.objects.get(pk=queued).pending_reason != "", what="the short job waiting")

    # What beat runs every POLYCHIP_ELASTIC_ROUND_S, run now.
    assert [(r.job_id, r.current, r.target) for r in services.elastic_round()] == [(job_id, 2, 1)]

    assert globex.wait_for(queued, FINAL, timeout_s=240)["state"] == "succeeded"
    job = acme.wait_for(job_id, FINAL, timeout_s=300)
    assert job["state"] == "succeeded", (job["failure_reason"], _messages(job_id))
    assert job["restarts"] == 0  # a resize is a planned move, not a restart
    messages = _messages(job_id)
    assert any(m.startswith("asked to checkpoint and move: elastic round: shrinking from 2 to 1") for m in messages)
    assert any(m.startswith("restored step") and "on 1 rank(s) (saved on 2)" in m for m in messages), messages
