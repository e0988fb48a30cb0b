"""Issue 17, items 7 and 9: sign-in lockout on the portal and the admin, and a Content-Security-Policy.

Before: 25 wrong passwords, then the right one, signed in; no page sent a CSP.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.test import Client
from django.utils import timezone

pytestmark = pytest.mark.django_db


def sign_in(client: Client, path: str, username: str, password: str):
    return client.post(path, {"username": username, "password": password}, REMOTE_ADDR=client.address)


def client_at(address: str) -> Client:
    client = Client()
    client.address = address  # type: ignore[attr-defined]
    return client


@pytest.mark.parametrize("path", ["/login/", "/admin/login/"])
def test_after_the_limit_even_the_right_password_is_refused(tenants, path, django_user_model):
    if path == "/admin/login/":
        django_user_model.objects.create_user("root", password="root-password-1", is_staff=True, is_superuser=True)
        username, password = "root", "root-password-1"
    else:
        username, password = tenants[0].username, tenants[0].password
    attacker = client_at("203.0.113.7")
    for _ in range(25):
        response = sign_in(attacker, path, username, "wrong-password")
    assert response.status_code == 429
    right = sign_in(attacker, path, username, password)
    assert right.status_code == 429
    assert "_auth_user_id" not in attacker.session
    # Locked per account: the right password from another address is refused too, until the cool-off.
    owner = client_at("198.51.100.4")
    assert sign_in(owner, path, username, password).status_code == 429


def test_the_limit_is_the_setting_and_the_lock_lifts_after_the_cooloff(tenants):
    acme = tenants[0]
    client = client_at("203.0.113.8")
    limit = settings.AXES_FAILURE_LIMIT
    statuses = [sign_in(client, "/login/", acme.username, "nope").status_code for _ in range(limit)]
    assert statuses[:-1] == [200] * (limit - 1)  # the form again, with its error
    assert statuses[-1] == 429
    AccessAttempt.objects.update(attempt_time=timezone.now() - settings.AXES_COOLOFF_TIME - timedelta(seconds=1))
    assert sign_in(client, "/login/", acme.username, acme.password).status_code == 302


def test_one_address_guessing_many_accounts_is_locked_out(tenants):
    client = client_at("203.0.113.9")
    for i in range(settings.AXES_FAILURE_LIMIT):
        sign_in(client, "/login/", f"someone-{i}", "guess")
    assert sign_in(client, "/login/", tenants[1].username, tenants[1].password).status_code == 429
    # Another address signs in as usual.
    assert sign_in(client_at("198.51.100.5"), "/login/", tenants[1].username, tenants[1].password).status_code == 302


def test_a_success_resets_the_count(tenants):
    acme = tenants[0]
    client = client_at("203.0.113.10")
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        sign_in(client, "/login/", acme.username, "nope")
    assert sign_in(client, "/login/", acme.username, acme.password).status_code == 302
    client.post("/logout/")
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert sign_in(client, "/login/", acme.username, "nope").status_code == 200


@pytest.mark.parametrize("path", ["/", "/billing/", "/login/"])
def test_portal_pages_carry_a_content_security_policy(tenants, path):
    client = Client()
    assert client.login(username=tenants[0].username, password=tenants[0].password)
    response = client.get(path)
    assert response.status_code == 200
    policy = response.headers["Content-Security-Policy"]
    directives = dict(part.strip().split(" ", 1) for part in policy.split(";") if part.strip())
    assert directives["script-src"] == "'self'"
    assert directives["default-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'"
    assert directives["object-src"] == "'none'"
