"""``GET /api/v1/jobs/{id}/logs``: what a job's ranks wrote, read through the API from real runs.

The runs are real local supervisors whose ranks are small programs (``tests.supervised``), so that
the capture, the cap and the ending of a run are the backend's own; the job's attempt rows point at
them as provisioning would.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient
from rest_framework.test import APIClient

from jobs import services
from jobs.models import JobAttempt, JobState, TrainingJob
from runtime.backends.local.logs import MIN_CAP_BYTES, read_logs
from runtime.jobspec import parse_job_spec
from tests.runtime.conftest import wait_for
from tests.supervised import supervise_programs

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

# No pool is loaded here: the job may wait for capacity, or submit would refuse it as never fitting.
SPEC = {"name": "talks", "devices": 2, "flavors": ["tpu-v4"], "workload": {"steps": 50}, "wait_for_capacity": True}

TWO_RANKS = {
    0: "import sys, time\nfor i in range(3):\n    print(f'zero {i}', flush=True)\n    time.sleep(0.01)\n"
    "print('zero complains', file=sys.stderr, flush=True)\n",
    1: "import time\nfor i in range(3):\n    time.sleep(0.005)\n    print(f'one {i}', flush=True)\n",
}


def job_with_runs(tenant_id: int, *run_dirs: Path | None) -> TrainingJob:
    """A running job whose attempts ran in ``run_dirs``, oldest first (None: an attempt never ran)."""
    view = services.submit_job(tenant_id=tenant_id, user_id=None, spec=parse_job_spec(SPEC))
    TrainingJob.objects.filter(pk=view.id).update(state=JobState.RUNNING, attempt=len(run_dirs) - 1)
    for number, run_dir in enumerate(run_dirs):
        handle = None if run_dir is None else {"backend": "local", "run_dir": str(run_dir), "job_id": "logs"}
        JobAttempt.objects.update_or_create(job_id=view.id, number=number, defaults={"backend_handle": handle})
    return TrainingJob.objects.get(pk=view.id)


def api(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def logs(token: str, job: TrainingJob, **params: Any) -> Any:
    return api(token).get(f"/api/v1/jobs/{job.pk}/logs", params)


@pytest.fixture
def finished_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    supervise_programs(run_dir, TWO_RANKS)
    return run_dir


def test_every_ranks_lines_interleaved_by_time_as_text_and_json_lines(tenants, finished_run):
    acme = tenants[0]
    job = job_with_runs(acme.id, finished_run)

    response = logs(acme.token, job)
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["X-Log-Attempt"] == "0" and response["X-Log-More"] == "false"
    text = response.content.decode().splitlines()
    assert sorted(text) == sorted(
        [f"[rank 0] zero {i}" for i in range(3)] + ["[rank 0] zero complains"] + [f"[rank 1] one {i}" for i in range(3)]
    )
    # Each rank's own order is kept in the interleaving.
    assert [line for line in text if line.startswith("[rank 1]")] == [f"[rank 1] one {i}" for i in range(3)]

    records = [json.loads(line) for line in logs(acme.token, job, format="jsonl").content.splitlines()]
    assert all(set(r) == {"t", "rank", "stream", "line"} for r in records)
    assert {(r["rank"], r["stream"], r["line"]) for r in records} >= {(0, "err", "zero complains"), (1, "out", "one 2")}
    times = [datetime.fromisoformat(r["t"]) for r in records]
    assert times == sorted(times) and all(t.tzinfo == UTC for t in times)

    one = logs(acme.token, job, rank=1).content.decode().splitlines()
    assert one == [f"one {i}" for i in range(3)]  # one rank: no prefix
    assert logs(acme.token, job, rank=0, tail=2).content.decode().splitlines() == ["zero 2", "zero complains"]


def test_a_cursor_continues_exactly_after_the_last_line(tenants, finished_run):
    acme = tenants[0]
    job = job_with_runs(acme.id, finished_run)
    seen: list[str] = []
    cursor = ""
    for _ in range(10):
        response = logs(acme.token, job, limit=3, since=cursor)
        seen += response.content.decode().splitlines()
        cursor = response["X-Log-Cursor"]
        if response["X-Log-More"] == "false":
            break
    assert sorted(seen) == sorted(logs(acme.token, job).content.decode().splitlines())
    assert len(seen) == 7 == len(set(seen))  # none twice, none skipped
    assert logs(acme.token, job, since=cursor).content == b""  # nothing new after the end


def test_since_a_time_reads_lines_from_then_on(tenants, finished_run):
    acme = tenants[0]
    job = job_with_runs(acme.id, finished_run)
    records = [json.loads(line) for line in logs(acme.token, job, format="jsonl", rank=0).content.splitlines()]
    middle = records[2]["t"]
    later = [
        json.loads(line)["line"]
        for line in logs(acme.token, job, format="jsonl", rank=0, since=middle).content.splitlines()
    ]
    assert later == [r["line"] for r in records[2:]]


def test_a_job_that_never_ran_has_no_lines_and_another_tenants_job_is_404(tenants, finished_run):
    acme, globex, _ = tenants
    never = job_with_runs(acme.id, None)
    response = logs(acme.token, never)
    assert response.status_code == 200 and response.content == b""
    job = job_with_runs(acme.id, finished_run)
    for other in (globex,):
        response = logs(other.token, job)
        assert response.status_code == 404
        assert b"zero" not in response.content


def test_an_older_attempt_is_read_by_its_number(tenants, tmp_path):
    acme = tenants[0]
    supervise_programs(tmp_path / "old0", {0: "print('first attempt', flush=True)\n"})
    supervise_programs(tmp_path / "run", {0: "print('second attempt', flush=True)\n"})
    job = job_with_runs(acme.id, tmp_path / "old0", tmp_path / "run")
    assert logs(acme.token, job).content == b"[rank 0] second attempt\n"
    response = logs(acme.token, job, attempt=0)
    assert response["X-Log-Attempt"] == "0" and response.content == b"[rank 0] first attempt\n"
    missing = logs(acme.token, job, attempt=5)
    assert missing.status_code == 404 and missing.json()["error"]["field"] == "attempt"


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"rank": "-1"}, "rank"),
        ({"rank": "zero"}, "rank"),
        ({"tail": "10001"}, "tail"),
        ({"limit": "0"}, "limit"),
        ({"format": "xml"}, "format"),
        ({"follow": "maybe"}, "follow"),
        ({"since": "yesterday"}, "since"),
        ({"since": "c-not-a-cursor"}, "since"),
        ({"attempt": "-2"}, "attempt"),
    ],
)
def test_a_bad_parameter_is_a_400_naming_it(tenants, finished_run, params, field):
    acme = tenants[0]
    job = job_with_runs(acme.id, finished_run)
    response = logs(acme.token, job, **params)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["field"] == field and field in error["message"]


def test_lines_the_cap_dropped_are_counted_where_they_were(tenants, tmp_path):
    acme = tenants[0]
    run_dir = tmp_path / "run"
    burst = "for i in range(20000):\n    print(f'{i:06d} ' + 'x' * 93)\n"
    supervise_programs(run_dir, {0: burst}, cap_bytes=MIN_CAP_BYTES * 2)
    job = job_with_runs(acme.id, run_dir)
    response = logs(acme.token, job)
    dropped = int(response["X-Log-Dropped"].removeprefix("0:"))
    text = response.content.decode().splitlines()
    assert dropped > 0
    assert text[0] == f"[polychip] {dropped} earlier lines of rank 0 were dropped (size cap)"
    kept = [line.removeprefix("[rank 0] ") for line in text[1:]]
    cursor = response["X-Log-Cursor"]
    while response["X-Log-More"] == "true":  # more than one answer's worth was kept
        response = logs(acme.token, job, since=cursor)
        assert "X-Log-Dropped" not in response  # said once, where they were
        kept += [line.removeprefix("[rank 0] ") for line in response.content.decode().splitlines()]
        cursor = response["X-Log-Cursor"]
    # What is kept is the newest, in order, right after the dropped ones.
    assert [int(line.split()[0]) for line in kept] == list(range(dropped, 20000))
    first = json.loads(logs(acme.token, job, format="jsonl").content.splitlines()[0])
    assert first == {"dropped": dropped, "rank": 0}


def test_following_streams_new_lines_as_they_are_written_until_the_run_ends(tenants, tmp_path):
    """Over ASGI, as uvicorn serves it: a line written while the client follows reaches it within
    2 s, and the stream ends by itself when the run has ended."""
    acme = tenants[0]
    run_dir = tmp_path / "run"
    program = (
        "import os, time\nprint('before', flush=True)\n"
        "while not os.path.exists('release'):\n    time.sleep(0.02)\n"
        "print('after', flush=True)\n"
    )
    supervisor = supervise_programs(run_dir, {0: program})
    try:
        assert wait_for(lambda: [x.text for x in read_logs(run_dir, 0).lines] == ["before"], 30)
        job = job_with_runs(acme.id, run_dir)

        async def follow() -> tuple[list[dict[str, Any]], float]:
            response = await AsyncClient().get(
                f"/api/v1/jobs/{job.pk}/logs",
                {"follow": "true", "format": "jsonl"},
                headers={"Authorization": f"Bearer {acme.token}"},
            )
            assert response.status_code == 200 and response.is_async
            records: list[dict[str, Any]] = []
            released = 0.0
            latency = -1.0
            async for chunk in response.streaming_content:
                for line in chunk.splitlines():
                    record = json.loads(line)
                    records.append(record)
                    if record.get("line") == "before":
                        # Released only once the client has the first line: "after" is new to it.
                        (run_dir / "release").touch()
                        released = time.monotonic()
                    if record.get("line") == "after":
                        latency = time.monotonic() - released
            return records, latency

        records, latency = async_to_sync(follow)()
    finally:
        (run_dir / "release").touch()
        supervisor.wait(timeout=60)
    lines = [r["line"] for r in records if "line" in r]
    assert lines == ["before", "after"]
    assert 0 <= latency < 2.0, f"a followed line took {latency:.2f} s"
    assert "cursor" in records[-1]  # the follower can resume from where the stream ended
