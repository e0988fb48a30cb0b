"""The portal page, rendered by Django for a signed-in user."""

from __future__ import annotations

import json
import re

import pytest

from jobs import services
from runtime.jobspec import parse_job_spec

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def test_a_signed_in_user_sees_their_tenants_jobs_and_the_pool(client, tenants, pool):
    acme, _, initech = tenants
    spec = parse_job_spec({"name": "acme-secret-run", "devices": 1, "flavors": ["tpu-v4"]})
    services.submit_job(tenant_id=acme.id, user_id=None, spec=spec)

    assert client.login(username=acme.username, password=acme.password)
    response = client.get("/")
    page = response.content.decode()
    assert "Ascend 910B" in page and 'src="/static/frontend/jobs.js"' in page
    # The rows are drawn by jobs.js from this JSON, then kept live over the WebSocket.
    initial = json.loads(re.search(r'<script id="initial-jobs" type="application/json">(.*?)</script>', page).group(1))
    assert [(job["name"], job["state"]) for job in initial] == [("acme-secret-run", "queued")]

    client.logout()
    assert client.login(username=initech.username, password=initech.password)
    assert "acme-secret-run" not in client.get("/").content.decode()


def test_an_anonymous_visitor_is_sent_to_sign_in(client, db):
    response = client.get("/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    assert client.get("/login/").status_code == 200
