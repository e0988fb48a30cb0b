"""`polychip down` stops the jobs its stack started (issue 17, item 17).

A module of its own: a second stack beside another module's would share the test database, and its
worker could launch the job instead.
"""

from __future__ import annotations

import time

import pytest

from jobs.models import JobEvent
from tests.processes import processes_mentioning
from tests.stack import Api, free_port, stack_down, stack_env, stack_up

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SPEC = {"name": "it-down", "devices": 2, "flavors": ["a100-sxm"], "workload": {"steps": 100_000, "global_batch": 64}}


def test_down_stops_the_jobs_the_stack_started(tenants, pool, tmp_path):
    """Issue 17, item 17: a training job kept running after its stack stopped. `polychip down` now
    tears down every run that still has a process, and returns only when they are gone."""
    port = free_port()
    env = stack_env(tmp_path, port)
    api = Api(stack_up(env, port), tenants[0].token)
    try:
        job_id = api.post("/api/v1/jobs", SPEC).json()["id"]
        deadline = time.monotonic() + 90
        while not processes_mentioning(str(tmp_path / "runs")) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not processes_mentioning(str(tmp_path / "runs")):
            job = api.get(f"/api/v1/jobs/{job_id}").json()
            events = list(JobEvent.objects.filter(job_id=job_id).order_by("pk").values_list("kind", "message"))
            worker_log = (tmp_path / "log" / "worker.log").read_text(errors="replace").splitlines()
            raise AssertionError(
                f"the job never started: {job['state']} ({job['pending_reason'] or job['failure_reason']}); "
                f"events {events}; runs {sorted(p.name for p in (tmp_path / 'runs').glob('*'))}; "
                f"the worker's last lines: {worker_log[-20:]}"
            )
    finally:
        left = stack_down(env)
    assert left == [], f"processes of job {job_id} outlived `polychip down`: {left}"
