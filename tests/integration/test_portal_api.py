"""What the portal's pages call beside the tenant API: the spec preview (checked as submit checks it, with
admission's verdict now, storing nothing), YAML bodies, and the operator's cluster map, device health and
queue across tenants. Through the API, on PostgreSQL; admission runs in-process (no worker)."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from jobs import services
from jobs.models import Device, TrainingJob

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

SMALL = {"name": "small", "devices": 2, "flavors": ["h100-sxm", "a100-sxm"], "workload": {"steps": 5}}


def _client(token: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {token}"})


def _preview(token: str, body: str | dict, content_type: str = "application/json"):
    data = body if isinstance(body, str) else json.dumps(body)
    return _client(token).post("/api/v1/jobs/preview", data, content_type=content_type)


@pytest.fixture
def operator() -> Client:
    client = Client()
    client.force_login(get_user_model().objects.create_user("op", password="op-password-1", is_staff=True))
    return client


def test_a_preview_says_where_a_job_would_start_what_it_charges_and_costs_and_stores_nothing(tenants, pool):
    response = _preview(tenants[0].token, SMALL)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["spec"]["name"] == "small" and body["spec"]["workload"]["kind"] == "builtin"
    admission = body["admission"]
    assert admission["never"] is None and admission["starts_now"] is True
    assert admission["devices"] == {"h100-sxm": 2}  # the faster flavor first, both on one node
    assert admission["nau"] > 0 and admission["borrowing"] is False
    assert body["currency"] == "USD" and float(body["cost_per_hour"]) > 0
    assert not TrainingJob.objects.exists()


def test_a_preview_of_a_job_that_must_wait_says_why(tenants, pool):
    services.submit_job(tenant_id=tenants[0].id, user_id=None, spec=_parsed({**SMALL, "flavors": ["h100-sxm"]}))
    services.admit_queued_jobs()  # the two h100s are now held
    body = _preview(tenants[1].token, {**SMALL, "flavors": ["h100-sxm"]}).json()
    assert body["admission"]["starts_now"] is False and body["admission"]["reason"]
    assert body["cost_per_hour"] is None


def test_a_preview_of_a_job_that_can_never_start_names_why(tenants, pool):
    body = _preview(tenants[0].token, {**SMALL, "devices": 5, "flavors": ["tpu-v4"]}).json()
    assert "the pool has 4 tpu-v4 and this job needs 5" in body["admission"]["never"]


def test_a_yaml_spec_with_problems_gets_every_one_at_once_and_yaml_bombs_are_refused(tenants, pool):
    response = _preview(tenants[0].token, "name: x\ndevices: 0\nflavors: [tpu-v4]\nprioirty: 1\n", "application/yaml")
    assert response.status_code == 400
    fields = sorted(e["field"] for e in response.json()["error"]["errors"])
    assert fields == ["devices", "prioirty"]
    bomb = "a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n"
    refused = _preview(tenants[0].token, bomb, "application/yaml").json()["error"]
    assert refused["field"] == "body" and "aliases" in refused["message"]
    broken = _preview(tenants[0].token, "name: [\n", "application/yaml").json()["error"]
    assert broken["field"] == "body" and "line 2" in broken["message"]


def test_submit_takes_yaml_as_it_takes_json(tenants, pool):
    yaml_body = "name: from-yaml\ndevices: 1\nflavors: [tpu-v4]\nworkload: {steps: 5}\n"
    response = _client(tenants[0].token).post("/api/v1/jobs", yaml_body, content_type="application/yaml")
    assert response.status_code == 201, response.content
    assert TrainingJob.objects.get(pk=response.json()["id"]).name == "from-yaml"


def test_the_cluster_map_shows_what_runs_where_and_the_operator_sets_health(tenants, pool, operator):
    job = services.submit_job(tenant_id=tenants[0].id, user_id=None, spec=_parsed({**SMALL, "flavors": ["tpu-v4"]}))
    services.admit_queued_jobs()
    body = operator.get("/api/v1/operator/cluster").json()
    cells = [d for node in body["nodes"] for d in node["devices"]]
    assert len(cells) == Device.objects.count() == 12
    held = [d for d in cells if d["job"] is not None]
    assert [(d["job"]["id"], d["job"]["tenant"]) for d in held] == [(job.id, "acme")] * 2
    assert sorted(d["job"]["rank"] for d in held) == [0, 1]
    assert {f["flavor"] for f in body["flavors"]} == {"h100-sxm", "a100-sxm", "ascend-910b", "tpu-v4"}

    # A device id holds a slash; the route takes it whole.
    answer = operator.post("/api/v1/operator/devices/npu-910b-0/1/health", {"health": "cordoned"}, "application/json")
    assert answer.status_code == 200 and answer.json()["changed"] == 1
    assert Device.objects.get(device_id="npu-910b-0/1").health == "cordoned"
    bad = operator.post("/api/v1/operator/devices/npu-910b-0/1/health", {"health": "gone"}, "application/json")
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "health"
    missing = operator.post("/api/v1/operator/devices/nope/health", {"health": "failed"}, "application/json")
    assert missing.status_code == 404
    assert operator.post("/api/v1/operator/nodes/nope/drain").status_code == 404


def test_the_queue_across_tenants_gives_each_waiting_job_its_place_in_its_own_tenants_queue(tenants, pool, operator):
    waits = {**SMALL, "devices": 64, "flavors": ["tpu-v4"], "wait_for_capacity": True}
    ids = [
        services.submit_job(tenant_id=tenant.id, user_id=None, spec=_parsed({**waits, "name": f"w{n}"})).id
        for n, tenant in enumerate((tenants[0], tenants[1], tenants[0]))
    ]
    body = operator.get("/api/v1/operator/queue").json()
    places = {row["id"]: (row["tenant"], row["position"]) for row in body["queue"]}
    assert places == {ids[0]: ("acme", 1), ids[1]: ("globex", 1), ids[2]: ("acme", 2)}
    acme = next(t for t in body["tenants"] if t["tenant"] == "acme")
    assert [q["resource"] for q in acme["quotas"]] == ["nau"]


def test_the_admin_offers_no_deletion_of_devices_or_nodes_and_cancels_jobs_through_the_service(tenants, pool):
    admin = Client()
    admin.force_login(get_user_model().objects.create_superuser("root", password="root-password-1"))
    for page in ("/admin/jobs/device/", "/admin/jobs/node/"):
        body = admin.get(page).content.decode()
        assert "delete_selected" not in body, page
    job = services.submit_job(tenant_id=tenants[0].id, user_id=None, spec=_parsed(SMALL))
    answer = admin.post("/admin/jobs/trainingjob/", {"action": "cancel", "_selected_action": [job.id]})
    assert answer.status_code == 302
    assert TrainingJob.objects.get(pk=job.id).state == "cancelled"


def test_the_jobs_page_filters_as_the_api_does_and_keeps_its_filters_in_the_next_pages_link(tenants, pool):
    acme = tenants[0]
    for n in range(51):
        services.submit_job(tenant_id=acme.id, user_id=None, spec=_parsed({**SMALL, "name": f"r&d-{n}"}))
    page = Client()
    page.force_login(get_user_model().objects.get(username=acme.username))
    body = page.get("/", {"name": "r&d", "state": "queued"}).content.decode()
    assert body.count('<tr data-job="') == 50
    assert "?state=queued&amp;name=r%26d&amp;cursor=" in body  # the next page keeps both filters, encoded
    refused = page.get("/", {"state": "sleeping"}).content.decode()
    assert "Filter ignored: state: one or more of queued" in refused


def _parsed(spec: dict):
    from runtime.jobspec import parse_job_spec

    return parse_job_spec(spec)
