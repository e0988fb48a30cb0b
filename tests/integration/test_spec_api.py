"""The job spec over the API: every problem of a submitted spec in one answer, and its JSON Schema."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from jobs.models import TrainingJob

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def test_a_spec_with_several_mistakes_is_answered_with_all_of_them_and_nothing_is_submitted(tenants, pool):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {tenants[0].token}")
    spec = {"name": "typos", "devices": 2, "flavors": ["h100-sx"], "prioirty": 5, "workload": {"steps": 0}}
    response = client.post("/api/v1/jobs", spec, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_spec"
    problems = {problem["field"]: problem["message"] for problem in error["errors"]}
    assert set(problems) == {"prioirty", "flavors[0]", "workload.steps"}
    assert "did you mean 'priority'?" in problems["prioirty"]
    assert "did you mean 'h100-sxm'?" in problems["flavors[0]"]
    assert (error["field"], error["message"]) == (error["errors"][0]["field"], error["errors"][0]["message"])
    assert not TrainingJob.objects.exists()


def test_the_spec_schema_is_public_and_is_what_the_parser_checks(tenants):
    from jsonschema import Draft202012Validator

    response = Client().get("/api/v1/job-spec/schema")
    assert response.status_code == 200
    schema = response.json()
    Draft202012Validator.check_schema(schema)
    count, elastic_range = schema["properties"]["devices"]["oneOf"]  # a count, or {min, max}
    assert count["maximum"] == 64
    assert elastic_range["properties"]["max"]["maximum"] == 64 and elastic_range["required"] == ["min", "max"]
    assert {"builtin", "python", "torchrun", "container"} == {
        option["properties"]["kind"]["const"] for option in schema["properties"]["workload"]["oneOf"]
    }
