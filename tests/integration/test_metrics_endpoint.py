"""/metrics in-process: who may read it, and what the rows behind each family become."""

from __future__ import annotations

import re
import time

import pytest
from django.contrib.auth import get_user_model
from django.test import Client, override_settings

from controlplane import taskstats
from controlplane.models import TaskCounter, WorkerBeat
from jobs import services
from jobs.models import AdmissionWait, Device, JobState, TrainingJob
from runtime.jobspec import parse_job_spec
from runtime.recovery.health import FEATURES

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SPEC = {"name": "watched", "devices": 1, "flavors": ["tpu-v4"], "workload": {"steps": 50, "global_batch": 32}}


def operator_client() -> Client:
    user, _ = get_user_model().objects.get_or_create(username="ops", defaults={"is_staff": True})
    client = Client()
    client.force_login(user)
    return client


def scrape() -> str:
    response = operator_client().get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return response.content.decode()


def value(text: str, name: str, **labels: str) -> float | None:
    """The value of the one sample of ``name`` whose labels include ``labels``."""
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if match and all(f'{k}="{v}"' in (match.group(1) or "") for k, v in labels.items()):
            return float(match.group(2))
    return None


def test_only_operators_and_the_scrape_token_read_metrics(tenants):
    assert Client().get("/metrics").status_code == 401
    member = Client()
    assert member.login(username=tenants[0].username, password=tenants[0].password)
    assert member.get("/metrics").status_code == 403  # a tenant's user is no operator
    token = Client(headers={"Authorization": f"Bearer {tenants[0].token}"})
    assert token.get("/metrics").status_code == 403
    assert operator_client().get("/metrics").status_code == 200
    with override_settings(POLYCHIP_METRICS_TOKEN="s3cret-scrape"):
        assert Client(headers={"Authorization": "Bearer s3cret-scrape"}).get("/metrics").status_code == 200
        assert Client(headers={"Authorization": "Bearer s3cret-scrapf"}).get("/metrics").status_code == 403
    # Without a configured token, no bearer opens it (an empty token matches nothing).
    assert Client(headers={"Authorization": "Bearer "}).get("/metrics").status_code == 403
    assert operator_client().post("/metrics").status_code == 405


def test_admission_waits_jobs_and_reasons_by_tenant(tenants, pool):
    acme, globex, _ = tenants
    started = services.submit_job(tenant_id=acme.id, user_id=None, spec=parse_job_spec(SPEC)).id
    # globex has no quota for the flavor: it waits, and says why.
    from tenants.models import Quota

    Quota.objects.filter(tenant_id=globex.id).delete()
    waiting = parse_job_spec({**SPEC, "wait_for_capacity": True})
    blocked = services.submit_job(tenant_id=globex.id, user_id=None, spec=waiting).id
    assert services.admit_queued_jobs() == [started]
    assert TrainingJob.objects.get(pk=blocked).pending_reason

    text = scrape()
    assert value(text, "polychip_admission_wait_seconds_count", tenant="acme", priority="normal") == 1
    assert value(text, "polychip_admission_wait_seconds_bucket", tenant="acme", priority="normal", le="+Inf") == 1
    assert value(text, "polychip_admission_wait_seconds_bucket", tenant="acme", priority="normal", le="5.0") == 1
    assert value(text, "polychip_jobs", tenant="acme", state="admitted") == 1
    assert value(text, "polychip_pending_jobs", tenant="globex", reason="quota") == 1
    assert 0 <= value(text, "polychip_oldest_pending_job_age_seconds", tenant="globex") < 60
    assert value(text, "polychip_oldest_pending_job_age_seconds", tenant="acme") is None
    assert value(text, "polychip_quota_usage", tenant="acme", resource="nau") == pytest.approx(0.881)
    assert value(text, "polychip_quota_nominal", tenant="acme", resource="nau") == 1000
    assert value(text, "polychip_admission_cycle_seconds") is not None
    assert AdmissionWait.objects.get(tenant_id=acme.id, band="normal").count == 1


def test_a_running_job_has_an_info_series_and_its_figures_until_it_ends(tenants, pool):
    job_id = services.submit_job(tenant_id=tenants[0].id, user_id=None, spec=parse_job_spec(SPEC)).id
    services.admit_queued_jobs()
    TrainingJob.objects.filter(pk=job_id).update(
        state=JobState.RUNNING, samples_per_s=250.0, last_loss=0.75, steps_done=10, total_steps=50
    )
    text = scrape()
    assert value(text, "polychip_job_info", job_id=str(job_id), tenant="acme", job_class="synthetic-mlp") == 1
    assert value(text, "polychip_job_samples_per_second", job_id=str(job_id)) == 250.0
    assert value(text, "polychip_job_loss", job_id=str(job_id)) == 0.75
    assert value(text, "polychip_job_progress_ratio", job_id=str(job_id)) == 0.2
    assert value(text, "polychip_tenant_samples_per_second", tenant="acme") == 250.0
    assert value(text, "polychip_tenant_devices_held", tenant="acme") == 1

    services.finish_job(job_id, JobState.SUCCEEDED, reason="done", from_states=[JobState.RUNNING])
    text = scrape()
    assert f'job_id="{job_id}"' not in text
    assert value(text, "polychip_jobs_finished_total", tenant="acme", state="succeeded") == 1


def test_device_readings_become_dcgm_named_series_and_error_totals(tenants, pool):
    job_id = services.submit_job(tenant_id=tenants[0].id, user_id=None, spec=parse_job_spec(SPEC)).id
    services.admit_queued_jobs()
    TrainingJob.objects.filter(pk=job_id).update(state=JobState.RUNNING)
    job = TrainingJob.objects.get(pk=job_id)
    device = Device.objects.get(allocations__job_id=job_id)
    row = dict.fromkeys(FEATURES, 0.0)
    rows = [
        [*{**row, "temperature_c": 61.0, "power_w": 220.0, "ecc_errors": 2, "pcie_errors": 1}.values()],
        [*{**row, "temperature_c": 63.5, "power_w": 240.0, "ecc_errors": 3, "step_jitter": 0.04}.values()],
    ]
    heartbeat = {
        "kind": "heartbeat",
        "rank": 0,
        "ts": time.time(),
        "device_id": device.device_id,
        "device_readings": rows,
    }

    def send(*events: dict) -> None:
        response = Client().post(
            f"/api/v1/ingest/jobs/{job_id}/telemetry",
            {"events": list(events)},
            content_type="application/json",
            headers={"Authorization": f"Bearer {services.ingest_token(job)}"},
        )
        assert response.status_code == 200, response.content

    send(heartbeat)
    send(heartbeat)  # the worker sent it again after a lost answer: nothing is counted twice
    assert len(Device.objects.get(pk=device.pk).health_readings) == 2

    text = scrape()
    labels = {"device": device.device_id, "flavor": "tpu-v4", "vendor": "google", "node": device.node.name}
    assert value(text, "DCGM_FI_DEV_GPU_TEMP", **labels) == 63.5  # the newest reading
    assert value(text, "DCGM_FI_DEV_POWER_USAGE", **labels) == 240.0
    assert value(text, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", **labels) == 5  # every reading counted
    assert value(text, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", **labels) == 1
    assert value(text, "polychip_device_step_jitter", **labels) == 0.04
    assert value(text, "polychip_device_health", state="healthy", **labels) == 1
    # A device that never reported has its inventory series, not made-up readings.
    silent = Device.objects.exclude(pk=device.pk).first()
    assert value(text, "DCGM_FI_DEV_FB_TOTAL", device=silent.device_id) == silent.memory_gib * 1024
    assert value(text, "DCGM_FI_DEV_GPU_TEMP", device=silent.device_id) is None
    # A newer heartbeat adds its readings, retried or not.
    newer = {**heartbeat, "ts": heartbeat["ts"] + 60, "device_readings": [[*{**row, "ecc_errors": 1}.values()]]}
    send(heartbeat, newer)
    send(newer)
    assert value(scrape(), "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", **labels) == 6

    services.set_device_health([device.device_id], "cordoned", by="ops")
    text = scrape()
    assert value(text, "polychip_device_health", state="cordoned", **labels) == 1
    assert value(text, "polychip_device_health_changes_total", to="cordoned", by="operator") == 1


def test_worker_counts_fold_into_rows_that_the_scrape_reads():
    recorder = taskstats._Recorder()
    recorder.enabled = True
    for n, (state, seconds) in enumerate((("SUCCESS", 0.003), ("SUCCESS", 0.2), ("FAILURE", 2.0), ("RETRY", 0.01))):
        recorder.started[f"t{n}"] = time.perf_counter() - seconds
        recorder.end(f"t{n}", "jobs.tasks.observe_running_jobs", state, "celery@host-a")
    recorder.flush()
    recorder.started["again"] = time.perf_counter()
    recorder.end("again", "jobs.tasks.observe_running_jobs", "SUCCESS", "celery@host-a")
    recorder.flush()

    row = TaskCounter.objects.get(task="jobs.tasks.observe_running_jobs")
    assert (row.succeeded, row.failed, row.retried) == (3, 1, 1)
    assert row.runtime_buckets[-1] == 5  # +Inf: every run
    assert row.runtime_buckets[0] == 2  # <= 5 ms: the 3 ms run and the last
    assert WorkerBeat.objects.filter(hostname="celery@host-a").exists()
    # An eager task or a shell is no worker: nothing is counted.
    idle = taskstats._Recorder()
    idle.started["x"] = time.perf_counter()
    idle.end("x", "jobs.tasks.observe_running_jobs", "SUCCESS", "shell")
    assert not idle.tallies

    text = scrape()
    task = {"task": "jobs.tasks.observe_running_jobs"}
    assert value(text, "polychip_celery_tasks_total", state="succeeded", **task) == 3
    assert value(text, "polychip_celery_tasks_total", state="failed", **task) == 1
    assert value(text, "polychip_celery_task_runtime_seconds_count", **task) == 5
    assert value(text, "polychip_celery_workers") == 1


def test_a_budgeted_tenants_spend_is_what_the_budget_check_last_rated(tenants, pool):
    from decimal import Decimal

    from billing import services as billing

    acme = tenants[0]
    billing.set_budgets(acme.id, soft=Decimal("100"), hard=Decimal("200"))
    assert value(scrape(), "polychip_tenant_spend", tenant="acme") is None  # not checked yet this month
    billing.check_budgets_now()
    text = scrape()
    assert value(text, "polychip_tenant_spend", tenant="acme", currency="USD") == 0
    assert value(text, "polychip_tenant_budget", tenant="acme", kind="hard") == 200
    assert value(text, "polychip_tenant_budget", tenant="acme", kind="soft") == 100
    assert value(text, "polychip_tenant_spend", tenant="globex") is None  # no budget: not checked


def test_a_worker_is_counted_alive_from_its_heartbeat_with_no_task_run():
    from datetime import timedelta

    from django.utils import timezone

    long_gone = timezone.now() - timedelta(days=2)
    WorkerBeat.objects.create(hostname="celery@old-pod", seen_at=long_gone)
    stop, thread = taskstats.start_heartbeat("celery@idle", every_s=0.1)
    try:
        deadline = time.monotonic() + 10
        while not WorkerBeat.objects.filter(hostname="celery@idle").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        first = WorkerBeat.objects.get(hostname="celery@idle").seen_at
        while WorkerBeat.objects.get(hostname="celery@idle").seen_at == first and time.monotonic() < deadline:
            time.sleep(0.05)
        assert WorkerBeat.objects.get(hostname="celery@idle").seen_at > first  # it beats again
    finally:
        stop.set()
        thread.join(timeout=10)  # its last stamp lands before the test's tables are emptied
    assert not thread.is_alive()
    assert value(scrape(), "polychip_celery_workers") == 1
    assert not WorkerBeat.objects.filter(hostname="celery@old-pod").exists()  # a day gone: forgotten


def test_values_that_fall_into_other_add_up_into_one_series_and_the_scrape_shows_the_misses():
    # Rows left by tasks this code no longer has (a renamed task, a newer worker): one _other series.
    for name, runs in (("gone.tasks.one", 1), ("gone.tasks.two", 2)):
        buckets = [runs] * (len(taskstats.RUNTIME_BUCKETS) + 1)  # cumulative, +Inf last: every run under 5 ms
        TaskCounter.objects.create(task=name, succeeded=runs, runtime_sum_s=0.5, runtime_buckets=buckets)
    text = scrape()
    others = [
        line for line in text.splitlines() if line.startswith("polychip_celery_tasks_total{") and "_other" in line
    ]
    assert others == [
        'polychip_celery_tasks_total{state="failed",task="_other"} 0.0',
        'polychip_celery_tasks_total{state="retried",task="_other"} 0.0',
        'polychip_celery_tasks_total{state="succeeded",task="_other"} 3.0',
    ]
    assert value(text, "polychip_celery_task_runtime_seconds_count", task="_other") == 3
    assert value(text, "polychip_celery_task_runtime_seconds_bucket", task="_other", le="0.005") == 3
    assert value(text, "polychip_celery_task_runtime_seconds_sum", task="_other") == 1.0
    # The overflow gauge counts this scrape's misses, and the next scrape counts its own, not a sum.
    assert value(text, "polychip_metrics_label_overflow", label="task") == 2
    assert value(scrape(), "polychip_metrics_label_overflow", label="task") == 2
    assert value(text, "polychip_metrics_label_overflow", label="tenant") == 0


def test_a_requeued_job_waits_from_when_it_came_back_not_from_its_submission(tenants, pool):
    from datetime import timedelta

    from django.utils import timezone

    acme = tenants[0]
    job_id = services.submit_job(tenant_id=acme.id, user_id=None, spec=parse_job_spec(SPEC)).id
    # Submitted two hours ago, preempted and queued again a moment ago: it has waited seconds, not hours.
    TrainingJob.objects.filter(pk=job_id).update(created_at=timezone.now() - timedelta(hours=2))
    assert value(scrape(), "polychip_oldest_pending_job_age_seconds", tenant="acme") < 60
    assert services.admit_queued_jobs() == [job_id]
    text = scrape()
    assert value(text, "polychip_admission_wait_seconds_bucket", tenant="acme", priority="normal", le="60.0") == 1
    assert value(text, "polychip_admission_wait_seconds_sum", tenant="acme", priority="normal") < 60
