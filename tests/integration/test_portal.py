"""The portal page, rendered by Django for a signed-in user."""

from __future__ import annotations

import pytest

from jobs import services
from runtime.jobspec import parse_job_spec

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def test_a_signed_in_user_sees_their_tenants_jobs_and_the_pool(client, tenants, pool):
    acme, _, initech = tenants
    spec = parse_job_spec({"name": "acme-secret-run", "devices": 1, "flavors": ["tpu-v4"]})
    services.submit_job(tenant_id=acme.id, user_id=None, spec=spec)

    assert client.login(username=acme.username, password=acme.password)
    page = client.get("/").content.decode()
    assert "acme-secret-run" in page and "Ascend 910B" in page and "/ws/jobs/" not in page  # the URL lives in JS
    assert 'src="/static/frontend/jobs.js"' in page

    client.logout()
    assert client.login(username=initech.username, password=initech.password)
    assert "acme-secret-run" not in client.get("/").content.decode()


def test_an_anonymous_visitor_is_sent_to_sign_in(client, db):
    response = client.get("/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    assert client.get("/login/").status_code == 200
