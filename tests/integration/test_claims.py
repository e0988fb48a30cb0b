"""Claims and idempotency, called directly against PostgreSQL with no worker running."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from billing.models import UsageRecord
from jobs import services
from jobs.models import Allocation, Device, DeviceHealth, JobEvent, JobState, TrainingJob
from runtime.jobspec import parse_job_spec
from tests.attempts import handle_of, run_of, running_on
from tests.processes import processes_mentioning

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SPEC = {"name": "claims", "devices": 2, "flavors": ["a100-sxm"], "workload": {"steps": 50, "global_batch": 64}}


@pytest.fixture
def local_backend(settings, tmp_path):
    """The real local backend, writing its runs under this test's folder."""
    from jobs.backends import get_backend

    settings.POLYCHIP_RUNS_DIR = tmp_path / "runs"
    get_backend.cache_clear()
    yield get_backend()
    get_backend.cache_clear()


def test_transitions_are_claims_exactly_one_concurrent_finisher_wins(tenants, pool):
    acme = tenants[0]
    job = services.submit_job(tenant_id=acme.id, user_id=None, spec=parse_job_spec(SPEC))
    assert services.admit_queued_jobs() == [job.id]  # it holds two devices now
    barrier = threading.Barrier(4)
    results: list[bool] = []

    def finish(state: str) -> None:
        from django.db import connection

        barrier.wait()
        try:
            results.append(services.finish_job(job.id, state, reason="race"))
        finally:
            connection.close()

    threads = [threading.Thread(target=finish, args=(s,)) for s in ("cancelled", "failed", "cancelled", "failed")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False, False, False, True]
    ends = JobEvent.objects.filter(job_id=job.id, to_state__in=["cancelled", "failed"])
    assert ends.count() == 1
    assert TrainingJob.objects.get(pk=job.id).state == ends.get().to_state
    # The winner alone closed the allocations and metered them: once each.
    assert not Allocation.objects.filter(job_id=job.id, ended_at__isnull=True).exists()
    assert UsageRecord.objects.filter(job_id=job.id).count() == 2


def test_running_admission_and_provisioning_twice_changes_nothing(tenants, pool, local_backend, tmp_path):
    job = services.submit_job(tenant_id=tenants[0].id, user_id=None, spec=parse_job_spec(SPEC))
    first, second = services.admit_queued_jobs(), services.admit_queued_jobs()
    assert (first, second) == ([job.id], [])
    assert Allocation.objects.filter(job_id=job.id).count() == 2

    assert services.provision_job(job.id) is True
    assert services.provision_job(job.id) is False
    running = TrainingJob.objects.get(pk=job.id)
    running_handle = handle_of(job.id)
    assert running.state == JobState.RUNNING
    assert len(list((tmp_path / "runs").iterdir())) == 1

    assert services.finish_job(job.id, JobState.CANCELLED) is True
    assert services.finish_job(job.id, JobState.CANCELLED) is False
    services.teardown_job(job.id)
    torn_down_at = run_of(job.id).torn_down_at
    services.teardown_job(job.id)
    assert torn_down_at is not None and run_of(job.id).torn_down_at == torn_down_at
    assert processes_mentioning(running_handle["run_dir"]) == []
    assert UsageRecord.objects.filter(job_id=job.id).count() == 2


def test_a_job_that_does_not_fit_waits_with_its_reason_and_lets_smaller_ones_start(tenants, pool):
    acme = tenants[0]
    big = services.submit_job(
        tenant_id=acme.id, user_id=None, spec=parse_job_spec({**SPEC, "devices": 30, "wait_for_capacity": True})
    )
    small = services.submit_job(tenant_id=acme.id, user_id=None, spec=parse_job_spec({**SPEC, "devices": 1}))

    assert services.admit_queued_jobs() == [small.id]
    waiting = TrainingJob.objects.get(pk=big.id)
    assert waiting.state == JobState.QUEUED
    assert waiting.pending_reason == "waiting for 30 devices; free now: 2 a100-sxm"  # as it was seen
    assert list(Allocation.objects.filter(job_id=small.id).values_list("device__device_id", flat=True)) == [
        "gpu-a100-0/0"
    ]


def test_a_device_held_by_a_running_job_is_never_offered_again(tenants, pool):
    acme = tenants[0]
    first = services.submit_job(tenant_id=acme.id, user_id=None, spec=parse_job_spec({**SPEC, "devices": 2}))
    second = services.submit_job(tenant_id=acme.id, user_id=None, spec=parse_job_spec({**SPEC, "devices": 1}))
    assert services.admit_queued_jobs() == [first.id]
    assert TrainingJob.objects.get(pk=second.id).pending_reason == "waiting for 1 devices; free now: 0 a100-sxm"

    services.finish_job(first.id, JobState.CANCELLED)
    assert services.admit_queued_jobs() == [second.id]


def test_a_running_job_whose_workers_go_silent_fails_and_is_torn_down(tenants, pool, local_backend):
    # Nothing listens at POLYCHIP_PUBLIC_URL here, so the workers' heartbeats never arrive.
    spec = parse_job_spec({**SPEC, "workload": {"steps": 100_000}, "max_restarts": 0})
    job = services.submit_job(tenant_id=tenants[0].id, user_id=None, spec=spec)
    services.admit_queued_jobs()
    assert services.provision_job(job.id) is True
    assert services.observe_job(job.id) == JobState.RUNNING  # launched moments ago: still trusted

    silent_since = timezone.now() - timedelta(seconds=settings.POLYCHIP_HEARTBEAT_TIMEOUT_S + 1)
    TrainingJob.objects.filter(pk=job.id).update(last_heartbeat_at=silent_since)
    assert services.observe_job(job.id) == JobState.FAILED
    failed = TrainingJob.objects.get(pk=job.id)
    timeout = settings.POLYCHIP_HEARTBEAT_TIMEOUT_S
    assert (
        failed.failure_reason == f"no telemetry from the job for {timeout:.0f} s (liveness; it had been reporting); "
        "gave up after 0 restart(s) (max_restarts 0)"
    )
    assert UsageRecord.objects.filter(job_id=job.id).count() == 2

    services.teardown_job(job.id)  # what the task queued on commit does
    assert run_of(job.id).torn_down_at is not None
    assert processes_mentioning(run_of(job.id).backend_handle["run_dir"]) == []
    assert services.untorn_job_ids() == []


def test_ranks_still_starting_get_the_start_up_grace_not_the_liveness_timeout(tenants, pool, local_backend):
    """Issue 17, item 14: on a loaded host ranks can sit in `import torch` past the liveness timeout."""
    spec = parse_job_spec({**SPEC, "workload": {"steps": 100_000}, "max_restarts": 0})
    job = services.submit_job(tenant_id=tenants[0].id, user_id=None, spec=spec)
    services.admit_queued_jobs()
    assert services.provision_job(job.id) is True
    assert TrainingJob.objects.get(pk=job.id).last_heartbeat_at is None  # nothing heard yet

    # Launched three liveness timeouts ago and still silent: starting, not gone.
    launched = timezone.now() - timedelta(seconds=3 * settings.POLYCHIP_HEARTBEAT_TIMEOUT_S)
    TrainingJob.objects.filter(pk=job.id).update(started_at=launched)
    assert services.observe_job(job.id) == JobState.RUNNING

    # Past the start-up grace, the reason says which clock ran out.
    grace = settings.POLYCHIP_STARTUP_GRACE_S
    TrainingJob.objects.filter(pk=job.id).update(started_at=timezone.now() - timedelta(seconds=grace + 1))
    assert services.observe_job(job.id) == JobState.FAILED
    reason = TrainingJob.objects.get(pk=job.id).failure_reason
    assert reason.startswith(f"no telemetry from the job within its {grace:.0f} s start-up grace"), reason
    services.teardown_job(job.id)


def test_a_silent_job_with_restarts_left_is_frozen_and_placed_again(tenants, pool, local_backend):
    job = services.submit_job(
        tenant_id=tenants[0].id, user_id=None, spec=parse_job_spec({**SPEC, "workload": {"steps": 100_000}})
    )
    services.admit_queued_jobs()
    assert services.provision_job(job.id) is True
    first_run = handle_of(job.id)["run_dir"]

    silent_since = timezone.now() - timedelta(seconds=settings.POLYCHIP_HEARTBEAT_TIMEOUT_S + 1)
    TrainingJob.objects.filter(pk=job.id).update(last_heartbeat_at=silent_since)
    # The old run is stopped, its devices metered and handed out again (silence blames no device).
    assert services.observe_job(job.id) == JobState.ADMITTED
    recovered = TrainingJob.objects.get(pk=job.id)
    assert (recovered.attempt, recovered.restarts, handle_of(job.id)) == (1, 1, None)
    assert processes_mentioning(first_run) == []
    assert UsageRecord.objects.filter(job_id=job.id).count() == 2
    assert recovered.allocations.filter(ended_at__isnull=True).count() == 2
    assert not Device.objects.filter(health=DeviceHealth.FAILED).exists()
    transitions = list(recovered.events.filter(kind="transition").values_list("from_state", "to_state"))
    assert transitions[-2:] == [("running", "recovering"), ("recovering", "admitted")]
    messages = list(recovered.events.filter(kind="recovery").values_list("message", flat=True))
    assert messages == [
        f"failure detected: no telemetry from the job for {settings.POLYCHIP_HEARTBEAT_TIMEOUT_S:.0f} s "
        "(liveness; it had been reporting)"
    ]
    services.cancel_job(tenant_id=tenants[0].id, job_id=job.id)


def test_a_job_whose_device_is_cordoned_before_launch_is_placed_on_others(tenants, pool, local_backend):
    spec = parse_job_spec({**SPEC, "flavors": ["ascend-910b"]})  # four in the pool: two spare
    job = services.submit_job(tenant_id=tenants[0].id, user_id=None, spec=spec)
    services.admit_queued_jobs()
    cordoned = TrainingJob.objects.get(pk=job.id).allocations.get(rank=1).device.device_id
    services.set_device_health([cordoned], DeviceHealth.CORDONED, by="op")

    assert services.provision_job(job.id) is False  # not launched on the cordoned device...
    placed = TrainingJob.objects.get(pk=job.id)
    assert placed.state == JobState.ADMITTED and handle_of(job.id) is None
    devices = set(placed.allocations.filter(ended_at__isnull=True).values_list("device__device_id", flat=True))
    assert len(devices) == 2 and cordoned not in devices
    assert services.provision_job(job.id) is True  # ...but on the devices it was given instead
    transitions = list(placed.events.filter(kind="transition").values_list("to_state", flat=True))
    assert transitions == ["queued", "admitted", "recovering", "admitted", "running"]
    services.cancel_job(tenant_id=tenants[0].id, job_id=job.id)


def test_every_device_with_evidence_against_it_counts(tenants, pool, local_backend):
    """Issue 17, item 19: two ranks killed at once; before, only the first rank's device was marked
    failed and the other was handed to the next attempt."""
    import json
    import os
    import signal
    import time
    from pathlib import Path

    spec = parse_job_spec(
        {"name": "two-down", "devices": 3, "flavors": ["ascend-910b"], "workload": {"steps": 100_000}}
    )
    job = services.submit_job(tenant_id=tenants[0].id, user_id=None, spec=spec)
    services.admit_queued_jobs()
    assert services.provision_job(job.id) is True
    status_file = Path(handle_of(job.id)["run_dir"]) / "status.json"

    def pids() -> dict[int, int]:
        try:
            ranks = json.loads(status_file.read_text())["ranks"]
        except (OSError, ValueError, KeyError):
            return {}
        return {r["rank"]: r["pid"] for r in ranks if r.get("pid")}

    deadline = time.monotonic() + 60
    while len(pids()) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    running = pids()
    by_rank = dict(TrainingJob.objects.get(pk=job.id).allocations.values_list("rank", "device__device_id"))
    os.kill(running[0], signal.SIGKILL)
    os.kill(running[2], signal.SIGKILL)

    deadline = time.monotonic() + 60
    while services.observe_job(job.id) == JobState.RUNNING and time.monotonic() < deadline:
        time.sleep(0.2)
    failed = set(Device.objects.filter(health=DeviceHealth.FAILED).values_list("device_id", flat=True))
    assert failed == {by_rank[0], by_rank[2]}
    marked = JobEvent.objects.filter(job_id=job.id, message__contains="marked failed").count()
    assert marked == 2
    # The next attempt is placed on none of them.
    next_devices = set(
        TrainingJob.objects.get(pk=job.id)
        .allocations.filter(ended_at__isnull=True)
        .values_list("device__device_id", flat=True)
    )
    assert not next_devices & failed
    services.cancel_job(tenant_id=tenants[0].id, job_id=job.id)


def _fail(job: TrainingJob, rank: int, cause: str, exit_code: int | None = None) -> None:
    import time

    from jobs import recovery
    from runtime.backends.base import Failure, Observation, Phase

    seen = Failure(rank=rank, cause=cause, detected_at=time.time(), exit_code=exit_code)
    recovery.handle_failure(job.pk, job.attempt, Observation(phase=Phase.FAILED, failure=seen, failures=(seen,)))


def test_one_jobs_lost_heartbeat_makes_a_suspect_and_a_second_jobs_marks_it_failed(tenants, pool):
    """Issue 17, item 15: a single missed heartbeat marked a healthy device failed until an operator
    returned it. Now it takes evidence about the device: a failure of another job there."""
    ascend = list(
        Device.objects.filter(flavor__name="ascend-910b").order_by("device_id").values_list("device_id", flat=True)
    )
    first = running_on(tenants[0].id, ascend[:2])
    _fail(first, 1, "heartbeat")
    suspect = Device.objects.get(device_id=ascend[1])
    assert suspect.health == DeviceHealth.HEALTHY
    assert [s["job"] for s in suspect.suspicions] == [first.pk]
    message = (
        JobEvent.objects.filter(job_id=first.pk, message__startswith=f"device {ascend[1]} suspected").get().message
    )
    assert "rank 1 sent no heartbeat" in message
    # The job's next attempt avoids the suspect all the same.
    again = set(first.allocations.filter(ended_at__isnull=True).values_list("device__device_id", flat=True))
    assert ascend[1] not in again and len(again) == 2

    services.cancel_job(tenant_id=tenants[0].id, job_id=first.pk)
    second = running_on(tenants[1].id, [ascend[1]])
    _fail(second, 0, "heartbeat")
    assert Device.objects.get(device_id=ascend[1]).health == DeviceHealth.FAILED
    marked = JobEvent.objects.filter(job_id=second.pk, message__contains="marked failed").get().message
    assert f"job {first.pk} failed there too" in marked


def test_a_rank_killed_by_a_signal_nobody_sent_marks_its_device_failed_at_once(tenants, pool):
    ascend = list(
        Device.objects.filter(flavor__name="ascend-910b").order_by("device_id").values_list("device_id", flat=True)
    )
    job = running_on(tenants[0].id, ascend[:2])
    _fail(job, 0, "signal", exit_code=-9)
    assert Device.objects.get(device_id=ascend[0]).health == DeviceHealth.FAILED
    marked = JobEvent.objects.filter(job_id=job.pk, message__contains="marked failed").get().message
    assert "rank 0 was killed by SIGKILL" in marked


def test_usage_of_an_attempt_a_device_ended_is_credited_and_user_code_failures_are_billed(tenants, pool):
    """Issue 17, item 16: the tenant paid for attempts the platform killed."""
    from billing import services as billing
    from billing.models import LedgerEntry

    ascend = list(
        Device.objects.filter(flavor__name="ascend-910b").order_by("device_id").values_list("device_id", flat=True)
    )
    killed = running_on(tenants[0].id, ascend[:2])
    _fail(killed, 0, "signal", exit_code=-9)
    tpus = list(Device.objects.filter(flavor__name="tpu-v4").order_by("device_id").values_list("device_id", flat=True))
    crashed = running_on(tenants[1].id, tpus[:2])
    _fail(crashed, 1, "exit", exit_code=1)  # the user's code raised: the tenant pays

    credited = dict(UsageRecord.objects.filter(job_id=killed.pk).values_list("key", "credit_reason"))
    assert len(credited) == 2
    assert all(reason.startswith("a device failed: rank 0 was killed") for reason in credited.values()), credited
    assert set(UsageRecord.objects.filter(job_id=crashed.pk).values_list("credit_reason", flat=True)) == {""}

    billing.relay_usage()
    entries = LedgerEntry.objects.filter(job_id__in=[killed.pk, crashed.pk])
    assert {(e.job_id, bool(e.credit_reason)) for e in entries} == {(killed.pk, True), (crashed.pk, False)}


def test_a_pod_lost_with_its_node_makes_a_suspect_not_a_failed_device(tenants, pool):
    """Kubernetes' taint manager and pod GC also delete pods for an operator's taint or a scaled-down node:
    like a lost heartbeat, one such loss is a suspicion until another job's failure corroborates it."""
    ascend = list(
        Device.objects.filter(flavor__name="ascend-910b").order_by("device_id").values_list("device_id", flat=True)
    )
    job = running_on(tenants[0].id, ascend[:2])
    _fail(job, 1, "node")
    suspect = Device.objects.get(device_id=ascend[1])
    assert suspect.health == DeviceHealth.HEALTHY and [s["job"] for s in suspect.suspicions] == [job.pk]
    message = JobEvent.objects.filter(job_id=job.pk, message__startswith=f"device {ascend[1]} suspected").get().message
    assert "rank 1's pod was deleted with its node" in message and "one job's lost node" in message
    assert TrainingJob.objects.get(pk=job.pk).restarts == 1  # a lost node counts like any failure
    services.cancel_job(tenant_id=tenants[0].id, job_id=job.pk)


def test_the_clusters_disruption_restarts_without_counting_and_is_credited(tenants, pool):
    """Preemption, eviction or a drain by the cluster is nobody's failure: not counted against max_restarts,
    not billed, no device suspected."""
    ascend = list(
        Device.objects.filter(flavor__name="ascend-910b").order_by("device_id").values_list("device_id", flat=True)
    )
    job = running_on(tenants[0].id, ascend[:2])
    for _ in range(3):
        _fail(TrainingJob.objects.get(pk=job.pk), 0, "disruption", exit_code=143)
        after = TrainingJob.objects.get(pk=job.pk)
        assert after.state == JobState.ADMITTED and after.restarts == 0  # placed again, nothing counted
        TrainingJob.objects.filter(pk=job.pk).update(state=JobState.RUNNING)  # as its provisioning would
    assert TrainingJob.objects.get(pk=job.pk).attempt == 3
    assert not Device.objects.filter(device_id__in=ascend[:2]).exclude(suspicions=[]).exists()
    frozen = JobEvent.objects.filter(job_id=job.pk, message__contains="restart is not counted").count()
    assert frozen == 3
    reasons = set(UsageRecord.objects.filter(job_id=job.pk).values_list("credit_reason", flat=True))
    assert reasons and all(r.startswith("the cluster disrupted the run") for r in reasons), reasons
    services.cancel_job(tenant_id=tenants[0].id, job_id=job.pk)
