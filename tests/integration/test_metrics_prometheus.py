"""A real Prometheus (Debian's package) scrapes a live stack while a job trains, and its HTTP API answers
with each level's series: the devices' (infrastructure), admission's and Celery's (middleware), the
job's (application). It loads the repository's alert rules too, so a rule it cannot parse fails here."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.stack import ROOT, Api, free_port, running_stack, stack_env

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        shutil.which("prometheus") is None, reason="needs Debian's prometheus (apt-get install prometheus)"
    ),
]

TOKEN = "scrape-token-for-tests"
RULES = ROOT / "deploy" / "monitoring" / "alerts.yaml"
SPEC = {"name": "watched", "devices": 2, "flavors": ["a100-sxm"], "workload": {"steps": 100000, "global_batch": 64}}


@pytest.fixture(scope="module")
def metrics_stack(django_db_setup: Any, django_db_blocker: Any, stack_var: Path) -> Iterator[str]:
    port = free_port()
    env = {**stack_env(stack_var, port), "POLYCHIP_METRICS_TOKEN": TOKEN}
    with running_stack(django_db_blocker, env, port) as url:
        yield url


@pytest.fixture(scope="module")
def prometheus(metrics_stack: str) -> Iterator[str]:
    folder = Path(tempfile.mkdtemp(prefix="polychip-prometheus-"))
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": "polychip",
                "metrics_path": "/metrics",
                "authorization": {"type": "Bearer", "credentials": TOKEN},
                "static_configs": [{"targets": [metrics_stack.removeprefix("http://")]}],
            }
        ],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    process = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(folder / "prometheus.log").open("w"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _until(lambda: _ready(url), timeout_s=60, what="Prometheus ready")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)


def _ready(url: str) -> bool:
    try:
        return requests.get(f"{url}/-/ready", timeout=2).status_code == 200
    except requests.ConnectionError:
        return False


def _until(check: Callable[[], Any], *, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def query(prometheus: str, promql: str) -> list[dict[str, Any]]:
    body = requests.get(f"{prometheus}/api/v1/query", params={"query": promql}, timeout=10).json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_prometheus_scrapes_all_three_levels_while_a_job_trains(prometheus, metrics_stack, tenants, pool):
    api = Api(metrics_stack, tenants[0].token)
    # The target is up: the token opens /metrics, and the scrape parses.
    up = _until(lambda: query(prometheus, 'up{job="polychip"} == 1'), timeout_s=30, what="the target up")
    assert len(up) == 1

    job_id = api.post("/api/v1/jobs", SPEC).json()["id"]
    api.wait_for(job_id, {"running"}, timeout_s=120)

    # Application: the running job's identity, and its figures once rank 0 reports steps.
    info = _until(
        lambda: query(prometheus, f'polychip_job_info{{job_id="{job_id}"}}'), timeout_s=60, what="the job's info series"
    )
    assert info[0]["metric"]["tenant"] == "acme" and info[0]["metric"]["job_class"] == "synthetic-mlp"
    rate = _until(
        lambda: query(prometheus, f'polychip_job_samples_per_second{{job_id="{job_id}"}} > 0'),
        timeout_s=60,
        what="the job's throughput",
    )
    assert float(rate[0]["value"][1]) > 0
    assert query(prometheus, 'polychip_tenant_samples_per_second{tenant="acme"} > 0')
    assert query(prometheus, f'polychip_job_loss{{job_id="{job_id}"}}')

    # Infrastructure: the job's devices report readings (the local backend emulates them), under DCGM's names.
    temps = _until(
        lambda: query(prometheus, 'DCGM_FI_DEV_GPU_TEMP{flavor="a100-sxm"}'), timeout_s=60, what="device temperatures"
    )
    assert {t["metric"]["vendor"] for t in temps} == {"nvidia"}
    assert all(20 < float(t["value"][1]) < 120 for t in temps)
    assert query(prometheus, 'DCGM_FI_DEV_POWER_USAGE{flavor="a100-sxm"} > 0')
    healthy = query(prometheus, 'sum(polychip_devices{health="healthy"})')
    assert float(healthy[0]["value"][1]) > 0
    assert len(query(prometheus, "DCGM_FI_DEV_FB_TOTAL")) == int(
        float(query(prometheus, "sum(polychip_devices)")[0]["value"][1])
    )

    # Middleware: the admission that started the job, Celery's tasks and workers, the quotas.
    waits = query(prometheus, 'polychip_admission_wait_seconds_count{tenant="acme",priority="normal"}')
    assert float(waits[0]["value"][1]) >= 1
    # A worker process folds its counts in every few seconds, after a task: the launch shows up in time.
    launches = _until(
        lambda: query(prometheus, 'polychip_celery_tasks_total{task="jobs.tasks.provision_job",state="succeeded"}'),
        timeout_s=60,
        what="the launch task counted",
    )
    assert float(launches[0]["value"][1]) >= 1
    runtimes = query(prometheus, 'polychip_celery_task_runtime_seconds_count{task="jobs.tasks.provision_job"}')
    assert float(runtimes[0]["value"][1]) >= 1
    assert float(query(prometheus, "polychip_celery_workers")[0]["value"][1]) >= 1
    assert query(prometheus, 'polychip_quota_usage{tenant="acme",resource="nau"} > 0')
    assert query(prometheus, 'polychip_jobs{tenant="acme",state="running"} == 1')
    assert query(prometheus, "polychip_usage_outbox_oldest_age_seconds")
    assert float(query(prometheus, "sum(polychip_metrics_label_overflow)")[0]["value"][1]) == 0

    # The job ends: its series go at the next scrape (Prometheus marks them stale), the counts stay.
    assert api.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 200
    api.wait_for(job_id, {"cancelled"}, timeout_s=60)
    _until(
        lambda: not query(prometheus, f'polychip_job_info{{job_id="{job_id}"}}'),
        timeout_s=30,
        what="the info series gone",
    )
    finished = _until(
        lambda: query(prometheus, 'polychip_jobs_finished_total{tenant="acme",state="cancelled"} >= 1'),
        timeout_s=30,
        what="the finished count",
    )
    assert finished

    # The alert rules loaded and are evaluated (none of them fires on a healthy stack).
    groups = requests.get(f"{prometheus}/api/v1/rules", timeout=10).json()["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) >= 7 and all(rule["health"] == "ok" for rule in rules), rules


def test_metrics_refuses_anyone_but_operators_and_the_token(metrics_stack, tenants):
    assert requests.get(f"{metrics_stack}/metrics", timeout=10).status_code == 401
    wrong = requests.get(f"{metrics_stack}/metrics", headers={"Authorization": "Bearer nope"}, timeout=10)
    assert wrong.status_code == 403
    # A tenant's API token is not the scrape token.
    tenant = requests.get(
        f"{metrics_stack}/metrics", headers={"Authorization": f"Bearer {tenants[0].token}"}, timeout=10
    )
    assert tenant.status_code == 403
    right = requests.get(f"{metrics_stack}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert right.status_code == 200 and right.headers["Content-Type"].startswith("text/plain; version=0.0.4")
