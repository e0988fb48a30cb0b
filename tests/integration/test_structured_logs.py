"""The stack's logs after a job: JSON lines from every process, no line per successful task, and a
request's id answered and found in the server's lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from tests.attempts import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SPEC = {"name": "quiet", "devices": 2, "flavors": ["tpu-v4"], "workload": {"steps": 30, "global_batch": 32}}


def _lines(stack_var: Path) -> dict[str, list[str]]:
    return {
        log.stem: [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        for log in sorted((stack_var / "log").glob("*.log"))
    }


def test_a_job_leaves_a_few_json_lines_and_none_per_successful_task(api_for, tenants, pool, stack, stack_var):
    api = api_for(tenants[0].token)
    before = {name: len(lines) for name, lines in _lines(stack_var).items()}
    job_id = api.post("/api/v1/jobs", SPEC).json()["id"]
    assert api.wait_for(job_id, {"succeeded", "failed", "cancelled"})["state"] == "succeeded"

    after = _lines(stack_var)
    new = {name: lines[before.get(name, 0) :] for name, lines in after.items()}
    for name, lines in after.items():
        for line in lines:
            parsed = json.loads(line)  # every line of every process, the start included
            assert {"time", "level", "logger", "event"} <= set(parsed), (name, line)
    # A job's whole life (admission, launch, a sweep a second, teardown, metering) at the default level:
    assert sum(len(lines) for lines in new.values()) <= 10, new
    assert not any("succeeded in" in line or "received" in line for lines in new.values() for line in lines)


def test_a_request_id_is_answered_and_carried_into_the_servers_lines(api_for, tenants, stack, stack_var):
    headers = {"Authorization": f"Bearer {tenants[0].token}", "X-Request-ID": "it-req-42"}
    answered = requests.get(f"{stack}/api/v1/jobs/999999", headers=headers, timeout=10)
    assert answered.status_code == 404 and answered.headers["X-Request-ID"] == "it-req-42"
    assert len(requests.get(f"{stack}/healthz", timeout=10).headers["X-Request-ID"]) == 32  # made up

    def logged() -> list[dict]:
        lines = [json.loads(line) for line in _lines(stack_var).get("server", [])]
        return [line for line in lines if line.get("request_id") == "it-req-42"]

    (line,) = wait_until(logged, timeout_s=10, what="the request's line in the server's log")
    assert line["level"] == "warning" and "Not Found" in line["event"] and line["tenant"] == tenants[0].id
