"""Idempotency-Key: a retried request does its work once and gets the first answer again.

Through the API, on PostgreSQL: replays, a reused key with another body (422), a key still in flight
(409), keys per principal, answers that are not kept (5xx, refusals of the key itself), the retention,
and racing clients of which exactly one does the work.
"""

from __future__ import annotations

import io
import threading
import uuid
from datetime import timedelta

import pytest
from django.db import connections
from django.test import Client
from django.test.client import encode_multipart
from django.utils import timezone

from jobs.models import Bundle, TrainingJob
from tenants import services as tenants_services
from tenants.models import IdempotencyKey
from tests.integration.test_bundles_api import tar_gz

pytestmark = [pytest.mark.integration]

SPEC = {"name": "nightly", "devices": 1, "flavors": ["tpu-v4"], "workload": {"kind": "builtin", "steps": 5}}


def _named(data: bytes) -> io.BytesIO:
    upload = io.BytesIO(data)
    upload.name = "code.tar.gz"
    return upload


def _client(token: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {token}"})


def _submit(client: Client, key: str | None, spec: dict = SPEC):
    headers = {"Idempotency-Key": key} if key is not None else {}
    return client.post("/api/v1/jobs", spec, content_type="application/json", headers=headers)


@pytest.mark.django_db
def test_a_retried_submit_answers_the_first_job_and_submits_nothing_more(tenants, pool):
    client = _client(tenants[0].token)
    key = str(uuid.uuid4())
    first = _submit(client, key)
    assert first.status_code == 201 and not first.has_header("Idempotency-Replayed")
    # The same body with its keys in another order is the same request.
    again = _submit(client, key, dict(reversed(list(SPEC.items()))))
    assert again.status_code == 201
    assert again["Idempotency-Replayed"] == "true"
    assert again.json() == first.json()
    assert again["Location"] == first["Location"] == f"/api/v1/jobs/{first.json()['id']}"
    assert TrainingJob.objects.count() == 1
    # Without a key, a submit is a new job each time, as before.
    assert _submit(client, None).json()["id"] != first.json()["id"]
    assert TrainingJob.objects.count() == 2


@pytest.mark.django_db
def test_the_same_key_with_another_request_is_422_and_changes_nothing(tenants, pool):
    client = _client(tenants[0].token)
    assert _submit(client, "deploy-42").status_code == 201
    other = _submit(client, "deploy-42", {**SPEC, "name": "another"})
    assert other.status_code == 422
    error = other.json()["error"]
    assert (error["code"], error["field"]) == ("idempotency_key_reused", "Idempotency-Key")
    # Another path or method is another request too.
    cancel = client.post(
        f"/api/v1/jobs/{TrainingJob.objects.get().id}/cancel", headers={"Idempotency-Key": "deploy-42"}
    )
    assert cancel.status_code == 422
    assert TrainingJob.objects.count() == 1
    assert TrainingJob.objects.get().state != "cancelled"


@pytest.mark.django_db
def test_keys_are_each_principals_own(tenants, pool):
    acme, globex = _client(tenants[0].token), _client(tenants[1].token)
    a, g = _submit(acme, "same-key"), _submit(globex, "same-key")
    assert a.status_code == g.status_code == 201 and not g.has_header("Idempotency-Replayed")
    assert a.json()["id"] != g.json()["id"]
    # Another token of the same user is another principal: its key starts fresh.
    second = tenants_services.issue_token(tenant_id=tenants[0].id, username=tenants[0].username, name="ci-2")
    assert _submit(_client(second.secret), "same-key").json()["id"] not in (a.json()["id"], g.json()["id"])
    assert TrainingJob.objects.count() == 3


@pytest.mark.django_db
def test_a_key_still_in_flight_is_409_and_an_abandoned_one_is_taken_over(tenants, pool):
    client = _client(tenants[0].token)
    body = b'{"name":"nightly"}'
    fingerprint = tenants_services.idempotency_fingerprint("POST", "/api/v1/jobs", "application/json", body)
    token_id = tenants_services.authenticate_token(tenants[0].token).pk
    row = IdempotencyKey.objects.create(
        principal=f"token:{token_id}",
        key="k1",
        tenant_id=tenants[0].id,
        fingerprint=fingerprint,
        claimed_at=timezone.now(),
    )
    busy = client.post("/api/v1/jobs", body, content_type="application/json", headers={"Idempotency-Key": "k1"})
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "idempotency_key_in_flight"
    # Its process died a while ago: the next retry runs (the view refuses the spec, and a refusal is
    # not kept: the key is free for the corrected request).
    IdempotencyKey.objects.filter(pk=row.pk).update(claimed_at=timezone.now() - timedelta(minutes=5))
    taken = client.post("/api/v1/jobs", body, content_type="application/json", headers={"Idempotency-Key": "k1"})
    assert taken.status_code == 400 and not IdempotencyKey.objects.exists()


@pytest.mark.django_db
def test_a_key_that_is_not_one_is_a_400_naming_the_header(tenants, pool):
    client = _client(tenants[0].token)
    for key in ("", "x" * 256, "naïve"):
        response = _submit(client, key)
        assert response.status_code == 400, key
        assert response.json()["error"]["field"] == "Idempotency-Key"
    assert not TrainingJob.objects.exists() and not IdempotencyKey.objects.exists()


@pytest.mark.django_db
def test_a_failure_or_refusal_is_not_kept_so_a_retry_runs_again(tenants, pool, monkeypatch):
    from jobs import services as jobs_services

    client = _client(tenants[0].token)
    real = jobs_services.submit_job

    def broken(*args, **kwargs):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(jobs_services, "submit_job", broken)
    client.raise_request_exception = False
    assert _submit(client, "retry-me").status_code == 500
    assert not IdempotencyKey.objects.exists()
    monkeypatch.setattr(jobs_services, "submit_job", real)
    assert _submit(client, "retry-me").status_code == 201
    assert TrainingJob.objects.count() == 1
    # A spec refused for a bundle not uploaded yet: the same key works once the bundle is there.
    python = {"name": "mine", "devices": 1, "workload": {"kind": "python", "bundle": "a" * 64, "entrypoint": "t.py"}}
    assert _submit(client, "needs-bundle", python).status_code == 400
    assert not IdempotencyKey.objects.filter(key="needs-bundle").exists()


@pytest.mark.django_db
def test_a_bundle_upload_is_identified_by_its_bytes(tenants):
    client = _client(tenants[0].token)

    def upload(data: bytes, key: str):
        return client.post("/api/v1/bundles", data, content_type="application/gzip", headers={"Idempotency-Key": key})

    one = tar_gz({"train.py": b"print('one')\n"})
    first = upload(one, "b1")
    assert first.status_code == 201
    again = upload(one, "b1")
    assert (again.status_code, again["Idempotency-Replayed"]) == (201, "true")
    assert again.json() == first.json()
    # Other bytes under the same key are another request.
    two = tar_gz({"train.py": b"print('two')\n"})
    assert upload(two, "b1").status_code == 422
    assert Bundle.objects.count() == 1

    # A form is the same request by its fields and files, whatever boundary the client drew (curl -F
    # draws a new one each time); the view still gets the whole file.
    def form(boundary: str):
        body = encode_multipart(boundary, {"bundle": _named(two), "name": "two"})
        return client.post(
            "/api/v1/bundles",
            body,
            content_type=f"multipart/form-data; boundary={boundary}",
            headers={"Idempotency-Key": "b2"},
        )

    first_form = form("----one")
    assert first_form.status_code == 201 and Bundle.objects.count() == 2
    assert first_form.json()["size_bytes"] == len(two)
    assert form("----another")["Idempotency-Replayed"] == "true"


@pytest.mark.django_db
def test_keys_past_their_retention_are_purged(tenants, pool, settings):
    client = _client(tenants[0].token)
    _submit(client, "old")
    _submit(client, "new")
    IdempotencyKey.objects.filter(key="old").update(created_at=timezone.now() - timedelta(hours=25))
    assert tenants_services.purge_idempotency_keys() == 1
    assert list(IdempotencyKey.objects.values_list("key", flat=True)) == ["new"]
    # Once forgotten, the key is free again.
    assert not _submit(client, "old").has_header("Idempotency-Replayed")
    assert TrainingJob.objects.count() == 3


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)
def test_32_racing_clients_with_one_key_submit_exactly_one_job(tenants, pool):
    start = threading.Barrier(32)
    answers: list[tuple[int, dict, bool]] = []
    lock = threading.Lock()

    def send() -> None:
        client = _client(tenants[0].token)
        start.wait()
        try:
            response = _submit(client, "race")
            with lock:
                answers.append((response.status_code, response.json(), response.has_header("Idempotency-Replayed")))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=send) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert TrainingJob.objects.count() == 1
    job_id = TrainingJob.objects.get().id
    codes = sorted(code for code, _, _ in answers)
    assert len(answers) == 32 and set(codes) <= {201, 409}
    ran = [body for code, body, replayed in answers if code == 201 and not replayed]
    assert len(ran) == 1 and ran[0]["id"] == job_id
    # Every other answer is the first one again or "still in flight": never a second job.
    for code, body, _ in answers:
        assert (code == 201 and body["id"] == job_id) or body["error"]["code"] == "idempotency_key_in_flight"
    # After the first has answered, every retry gets its answer.
    late = _submit(_client(tenants[0].token), "race")
    assert (late.status_code, late.json()["id"], late["Idempotency-Replayed"]) == (201, job_id, "true")


@pytest.mark.django_db
def test_a_keyed_request_looks_its_token_up_once(tenants, pool):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        assert _submit(_client(tenants[0].token), "once").status_code == 201
    lookups = [q["sql"] for q in queries.captured_queries if q["sql"].startswith('SELECT "tenants_apitoken"')]
    assert len(lookups) == 1, lookups
