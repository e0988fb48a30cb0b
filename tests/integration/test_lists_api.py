"""The API's lists: cursor pages that stay right while rows are added, filters, and nothing cut off."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from jobs import services as jobs
from jobs.models import JobEvent, TrainingJob
from runtime.jobspec import parse_job_spec
from tenants import services as tenants_services

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def _api(token: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {token}"})


def _submit(tenant_id: int, name: str, flavor: str = "tpu-v4") -> int:
    spec = parse_job_spec({"name": name, "devices": 1, "flavors": [flavor], "workload": {"steps": 5}})
    return jobs.submit_job(tenant_id=tenant_id, user_id=None, spec=spec).id


def _walk(client: Client, path: str, key: str, **params) -> tuple[list[dict], int]:
    """Every row of a list, page by page through the answers' next links; and how many pages."""
    rows, pages = [], 0
    response = client.get(path, params)
    while True:
        assert response.status_code == 200, response.content
        body = response.json()
        rows += body[key]
        pages += 1
        if body["next"] is None:
            assert body["next_cursor"] is None and not response.has_header("Link")
            return rows, pages
        assert response["Link"] == f'<{body["next"]}>; rel="next"'
        response = client.get(body["next"])


def test_jobs_come_newest_first_in_pages_with_nothing_missed_or_repeated(tenants, pool):
    acme = tenants[0]
    ids = [_submit(acme.id, f"job-{n}") for n in range(7)]
    rows, pages = _walk(_api(acme.token), "/api/v1/jobs", "jobs", limit=3)
    assert [row["id"] for row in rows] == ids[::-1] and pages == 3
    # A page of exactly the rest says so: no empty page after it.
    assert _walk(_api(acme.token), "/api/v1/jobs", "jobs", limit=7)[1] == 1
    # The third tenant sees none of it.
    assert _api(tenants[2].token).get("/api/v1/jobs").json()["jobs"] == []


def test_jobs_submitted_while_a_client_pages_neither_shift_nor_repeat_its_pages(tenants, pool):
    acme = tenants[0]
    ids = [_submit(acme.id, f"job-{n}") for n in range(6)]
    client = _api(acme.token)
    first = client.get("/api/v1/jobs", {"limit": 2}).json()
    seen = [row["id"] for row in first["jobs"]]
    newer = [_submit(acme.id, "late-1"), _submit(acme.id, "late-2")]  # at the head of the list
    following = first["next"]
    while following:
        page = client.get(following).json()
        seen += [row["id"] for row in page["jobs"]]
        following = page["next"]
    assert seen == ids[::-1]
    assert set(newer).isdisjoint(seen)


def test_jobs_filter_by_state_name_flavor_and_creation_time(tenants, pool):
    acme = tenants[0]
    a = _submit(acme.id, "nightly-bert", "tpu-v4")
    b = _submit(acme.id, "Nightly-gpt", "a100-sxm")
    c = _submit(acme.id, "adhoc", "a100-sxm")
    jobs.cancel_job(tenant_id=acme.id, job_id=c)
    TrainingJob.objects.filter(pk=a).update(created_at=timezone.now() - timedelta(days=2))
    client = _api(acme.token)

    def ids(**params) -> list[int]:
        return [row["id"] for row in _walk(client, "/api/v1/jobs", "jobs", **params)[0]]

    assert ids(state="cancelled") == [c]
    assert ids(state="queued,cancelled") == [c, b, a]
    assert ids(name="NIGHTLY") == [b, a]
    assert ids(flavor="a100-sxm") == [c, b]
    assert ids(flavor="a100-sxm", state="queued") == [b]
    yesterday = (timezone.now() - timedelta(days=1)).isoformat()
    assert ids(created_after=yesterday) == [c, b]
    # Any zone offset ISO 8601 allows, even one PostgreSQL does not (past 15:59).
    assert ids(
        created_after=(timezone.now() - timedelta(days=1))
        .astimezone(timezone.get_fixed_timezone(-23 * 60 - 38))
        .isoformat()
    ) == [c, b]
    assert ids(created_before=yesterday) == [a]
    # Filters carry over to the next page's link.
    page = client.get("/api/v1/jobs", {"name": "nightly", "limit": 1}).json()
    assert "name=nightly" in page["next"] and [r["id"] for r in client.get(page["next"]).json()["jobs"]] == [a]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("state=sleeping", "state"),
        ("flavor=h100-sx", "flavor"),
        ("created_after=yesterday", "created_after"),
        ("created_before=2026-13-01", "created_before"),
        ("created_before=", "created_before"),
        ("created_after=0001-01-01T00:00:00%2B01:00", "created_after"),
        ("name=" + "x" * 121, "name"),
    ],
)
def test_a_filter_that_is_not_one_is_a_400_naming_it(tenants, pool, query, field):
    response = _api(tenants[0].token).get(f"/api/v1/jobs?{query}")
    assert response.status_code == 400
    assert response.json()["error"]["field"] == field


def test_a_waiting_job_on_a_page_knows_its_place_in_the_queue(tenants, pool):
    acme = tenants[0]
    _first, second, third = (_submit(acme.id, f"q{n}") for n in range(3))
    TrainingJob.objects.filter(pk=third).update(priority=5)  # jumps the queue
    page = _api(acme.token).get("/api/v1/jobs", {"limit": 2}).json()["jobs"]
    assert [(row["id"], row["queue_position"]) for row in page] == [(third, 1), (second, 3)]


def test_events_tokens_and_invoices_come_in_pages_too(tenants, pool):
    acme = tenants[0]
    job_id = _submit(acme.id, "eventful")
    for n in range(4):
        JobEvent.objects.create(job_id=job_id, tenant_id=acme.id, kind=JobEvent.Kind.PROGRESS, message=f"note {n}")
    events, pages = _walk(_api(acme.token), f"/api/v1/jobs/{job_id}/events", "events", limit=2)
    assert [e["id"] for e in events] == sorted(e["id"] for e in events) and len(events) >= 5 and pages >= 3
    for n in range(3):
        tenants_services.issue_token(tenant_id=acme.id, username=acme.username, name=f"ci-{n}", scopes=["manage"])
    manager = tenants_services.issue_token(
        tenant_id=acme.id, username=acme.username, name="lists", scopes=["read", "manage"]
    )
    tokens, pages = _walk(_api(manager.secret), "/api/v1/tokens", "tokens", limit=2)
    assert [t["name"] for t in tokens] == ["lists", "ci-2", "ci-1", "ci-0", "tests"] and pages == 3
    invoices, pages = _walk(_api(acme.token), "/api/v1/invoices", "invoices", limit=2)
    assert (invoices, pages) == ([], 1)
