"""Issue 17, item 5: input never answers 5xx; each bad input is a 400 that names the field.

Deep nesting (also on the unauthenticated ingest route, which checks its token before it reads the
body), a NUL or a lone surrogate in a name, a NUL in a query parameter, an offset past any C long, a
step past a 32-bit column.
"""

from __future__ import annotations

import time

import pytest
from django.test import Client
from django.utils import timezone

from jobs import services
from jobs.models import TrainingJob
from tests.attempts import device_ids, running_on

pytestmark = pytest.mark.django_db

SPEC = '{"name": NAME, "devices": 1, "flavors": ["tpu-v4"], "workload": {"steps": 10}}'


def api(token: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {token}"})


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def error_of(response) -> dict:
    assert response.status_code == 400, (response.status_code, response.content[:300])
    return response.json()["error"]


@pytest.mark.parametrize("depth", [40, 100_000])
def test_deeply_nested_json_is_a_400(tenants, pool, depth):
    body = '{"name": "deep", "devices": 1, "workload": ' + nested(depth) + "}"
    error = error_of(api(tenants[0].token).post("/api/v1/jobs", body, content_type="application/json"))
    assert "nest" in error["message"]
    assert not TrainingJob.objects.exists()


def test_the_ingest_route_checks_its_token_before_it_reads_the_body(tenants, pool):
    job = running_on(tenants[0].id, device_ids("tpu-v4", 1), steps=10)
    body = '{"events": ' + nested(100_000) + "}"
    url = f"/api/v1/ingest/jobs/{job.pk}/telemetry"
    refused = Client().post(url, body, content_type="application/json", headers={"Authorization": "Bearer wrong"})
    assert refused.status_code == 403
    assert Client().post(url, body, content_type="application/json").status_code == 403
    # Its own worker sending such a body gets the 400.
    token = services.ingest_token(job)
    error = error_of(api(token).post(url, body, content_type="application/json"))
    assert error["field"] == "body"


@pytest.mark.parametrize(
    ("name", "why"),
    [('"a\\u0000b"', "NUL"), ('"a\\ud800b"', "surrogate"), ('"\\udfff"', "surrogate")],
)
def test_a_job_name_with_a_nul_or_a_lone_surrogate_is_a_400(tenants, pool, name, why):
    response = api(tenants[0].token).post("/api/v1/jobs", SPEC.replace("NAME", name), content_type="application/json")
    error = error_of(response)
    assert error["field"] == "name" and why in error["message"]
    assert not TrainingJob.objects.exists()


@pytest.mark.parametrize("name", ['"ci\\u0000"', '"ci\\ud83d"'])
def test_a_token_name_with_a_nul_or_a_lone_surrogate_is_a_400(tenants, name):
    client = Client()
    assert client.login(username=tenants[0].username, password=tenants[0].password)
    before = client.get("/api/v1/tokens").json()
    response = client.post("/api/v1/tokens", '{"name": ' + name + "}", content_type="application/json")
    assert error_of(response)["field"] == "name"
    assert client.get("/api/v1/tokens").json() == before


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/api/v1/throughput?job_class=a%00b", "job_class"),
        ("/api/v1/throughput?flavor=%00", "flavor"),
        ("/api/v1/usage?limit=1&period=2026-01%00", "period"),
    ],
)
def test_a_nul_in_a_query_parameter_is_a_400(tenants, path, field):
    assert error_of(api(tenants[0].token).get(path))["field"] == field


@pytest.mark.parametrize("limit", ["9223372036854775808", "9" * 5000, "-1", "1e3", "0", "10001", ""])
@pytest.mark.parametrize("path", ["/api/v1/usage", "/api/v1/jobs", "/api/v1/invoices", "/api/v1/tokens"])
def test_a_page_size_out_of_range_is_a_400(tenants, path, limit):
    from tenants import services

    acme = tenants[0]
    token = services.issue_token(tenant_id=acme.id, username=acme.username, name="all", scopes=["read", "manage"])
    error = error_of(api(token.secret).get(f"{path}?limit={limit}"))
    assert error["field"] == "limit"


@pytest.mark.parametrize("cursor", ["", "x", "k" + "9" * 5000, "%00", "k-1", "k1.5", "1"])
def test_a_cursor_the_api_did_not_give_is_a_400(tenants, cursor):
    response = api(tenants[0].token).get(f"/api/v1/jobs?cursor={cursor}")
    if cursor == "":
        assert response.status_code == 200  # no cursor: the first page
    else:
        assert error_of(response)["field"] == "cursor"


def test_a_step_past_a_32_bit_column_is_a_400(tenants, pool):
    job = running_on(tenants[0].id, device_ids("tpu-v4", 1), steps=10)
    event = {"kind": "step", "rank": 0, "ts": time.time(), "step": 2**31, "loss": 1.0, "samples": 4}
    response = api(services.ingest_token(job)).post(
        f"/api/v1/ingest/jobs/{job.pk}/telemetry", {"events": [event]}, content_type="application/json"
    )
    assert error_of(response)["field"] == "events[0].step"
    assert TrainingJob.objects.get(pk=job.pk).steps_done == 0


def test_a_token_cannot_outlive_the_longest_a_token_lives(tenants):
    client = Client()
    assert client.login(username=tenants[0].username, password=tenants[0].password)
    body = '{"name": "ci", "scopes": ["read"], "expires_at": "AT"}'
    far = body.replace("AT", "9999-12-31T00:00:00Z")
    error = error_of(client.post("/api/v1/tokens", far, content_type="application/json"))
    assert error["field"] == "expires_at" and "3650 days" in error["message"]
    within = (timezone.now() + timezone.timedelta(days=3000)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert client.post("/api/v1/tokens", body.replace("AT", within), content_type="application/json").status_code == 201


@pytest.mark.parametrize("artifact", ["../../../../etc/shadow", "/etc/shadow", ".", "../job-1-a1/model.pt"])
def test_a_worker_can_name_only_a_file_in_its_own_run_folder_as_the_artifact(tenants, pool, artifact):
    from django.conf import settings

    from jobs.runs import run_key

    job = running_on(tenants[0].id, device_ids("tpu-v4", 1), steps=10)
    url = f"/api/v1/ingest/jobs/{job.pk}/telemetry"
    worker = api(services.ingest_token(job))
    finished = {"kind": "finished", "rank": 0, "ts": time.time()}
    error = error_of(
        worker.post(url, {"events": [{**finished, "artifact": artifact}]}, content_type="application/json")
    )
    assert error["field"] == "events[0].artifact"
    assert TrainingJob.objects.get(pk=job.pk).artifact_path == ""

    own = str(settings.POLYCHIP_ARTIFACTS_DIR / run_key(job) / "model.pt")
    response = worker.post(url, {"events": [{**finished, "artifact": own}]}, content_type="application/json")
    assert response.status_code == 200
    assert TrainingJob.objects.get(pk=job.pk).artifact_path == own
