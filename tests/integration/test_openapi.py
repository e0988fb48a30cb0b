"""The API describes itself: an OpenAPI schema of every route, docs pages served from this host, and
JSON answers under /api/ even for paths and methods that are not there."""

from __future__ import annotations

import re

import pytest
import yaml
from django.test import Client
from django.urls import get_resolver

from tests.security.test_route_matrix import walk

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

NOT_IN_SCHEMA = {"api/v1/schema", "api/v1/docs", "api/v1/redoc", "^api/"}


def _schema() -> dict:
    response = Client().get("/api/v1/schema", {"format": "json"})
    assert response.status_code == 200, response.content
    return response.json()


def test_the_schema_is_openapi_3_1_and_has_every_api_route():
    schema = _schema()
    assert schema["openapi"].startswith("3.1")
    routes = {route for route, _ in walk(get_resolver().url_patterns) if route.startswith("api/")}
    documented = set(schema["paths"])
    for route in sorted(routes - NOT_IN_SCHEMA):
        path = "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)
        assert path in documented, f"{path} is missing from the OpenAPI schema"
    assert schema["components"]["securitySchemes"]["tenantToken"]["scheme"] == "bearer"


def test_every_operation_describes_its_errors_in_the_one_shape():
    schema = _schema()
    error = schema["components"]["schemas"]["Error"]
    assert set(error["properties"]) == {"error"}
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            statuses = set(operation["responses"])
            assert "400" in statuses, (method, path)
            if "{" in path:
                assert "404" in statuses, (method, path)
            if operation.get("security") != [{}] and "ingest" not in path and "job-spec" not in path:
                assert {"401", "403"} <= statuses, (method, path)


def test_the_committed_schema_is_the_one_served():
    with open("controlplane/openapi.yaml") as committed:
        assert yaml.safe_load(committed) == _schema(), "run make openapi and commit controlplane/openapi.yaml"


def test_the_job_submit_body_is_the_job_spec_schema():
    from runtime.jobspec import job_spec_schema

    body = _schema()["paths"]["/api/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    expected = job_spec_schema()
    expected.pop("$schema")
    assert body == expected


@pytest.mark.parametrize("page", ["/api/v1/docs", "/api/v1/redoc"])
def test_the_docs_pages_load_nothing_from_another_host(page):
    response = Client().get(page)
    assert response.status_code == 200
    html = response.content.decode()
    sources = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert sources, html
    assert all(not re.match(r"^(https?:)?//", source) for source in sources), sources
    for source in sources:
        if source.startswith("/static/"):
            assert Client().get(source).status_code == 200, source


def test_unknown_api_paths_and_methods_answer_json():
    client = Client()
    for method in ("get", "post", "delete"):
        response = getattr(client, method)("/api/v1/no-such-thing")
        assert response.status_code == 404 and response["Content-Type"] == "application/json"
        assert response.json()["error"]["code"] == "not_found"
    response = client.get("/api/v2/jobs")
    assert response.status_code == 404 and "/api/v1/docs" in response.json()["error"]["message"]


def test_a_method_a_route_does_not_take_is_a_json_405_with_allow(tenants):
    response = Client().delete("/api/v1/jobs", headers={"Authorization": f"Bearer {tenants[0].token}"})
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"
    assert set(response["Allow"].replace(" ", "").split(",")) >= {"GET", "POST"}


def test_what_a_create_or_delete_answers_is_a_documented_status(tenants):
    """The success code a view writes by hand (201, 204) is the one its operation documents: a client
    generated from the schema would otherwise treat the answer as unexpected."""
    from django.contrib.auth import get_user_model

    schema = _schema()
    tenant = Client(headers={"Authorization": f"Bearer {tenants[0].token}"})
    operator = Client()
    operator.force_login(get_user_model().objects.create_user(username="op", password="op-password-1", is_staff=True))

    def documented(method: str, path: str, response) -> None:
        codes = schema["paths"][path][method]["responses"]
        assert str(response.status_code) in codes, (method, path, response.status_code, response.content)

    documented("post", "/api/v1/tokens", tenant.post("/api/v1/tokens", {"name": "ci"}, content_type="application/json"))
    cohort = operator.post("/api/v1/operator/cohorts", {"name": "labs"}, content_type="application/json")
    assert cohort.status_code == 201
    documented("post", "/api/v1/operator/cohorts", cohort)
    created = operator.post(
        "/api/v1/operator/tenants", {"slug": "hooli", "name": "Hooli"}, content_type="application/json"
    )
    documented("post", "/api/v1/operator/tenants", created)
    deleted = operator.delete(f"/api/v1/operator/cohorts/{cohort.json()['id']}")
    documented("delete", "/api/v1/operator/cohorts/{cohort_id}", deleted)
