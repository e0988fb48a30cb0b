"""The tenants API: tokens for a tenant's admins, cohorts, tenants and quotas for operators.

Every refusal answers in the project's error shape with the exact field to fix, and changes nothing.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from tenants import services
from tenants.contracts import QuotaLimits
from tenants.models import ApiToken, Cohort, Membership, Quota, Role, Tenant

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

FLAVORS = frozenset({"h100-sxm", "a100-sxm", "tpu-v4"})
ALL = ["read", "submit", "manage"]


def _test_flavors() -> frozenset[str]:
    return FLAVORS


@pytest.fixture(autouse=True)
def flavors():
    """What jobs registers at startup from the pool; here, a fixed set."""
    services.register_flavor_source(_test_flavors)
    yield FLAVORS
    services.unregister_flavor_source(_test_flavors)


def bearer(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def manage_token(tenant, name: str = "admin", scopes: list[str] | None = None) -> str:
    return services.issue_token(tenant_id=tenant.id, username=tenant.username, name=name, scopes=scopes or ALL).secret


@pytest.fixture
def operator(db) -> APIClient:
    user = get_user_model().objects.create_user(username="op", password="op-password-1", is_staff=True)
    user.is_superuser = True
    user.save()
    client = APIClient()
    client.force_login(user)
    return client


TOKEN_COLUMNS = ("id", "tenant_id", "user_id", "name", "prefix", "digest", "expires_at", "revoked_at", "scopes")


def snapshot() -> tuple[Any, ...]:
    """Everything the tenants API could write, to compare before and after a refusal."""
    return (
        list(Cohort.objects.order_by("pk").values()),
        list(Tenant.objects.order_by("pk").values()),
        list(Quota.objects.order_by("pk").values()),
        # (a token's last use is recorded as it authenticates the very request being refused)
        list(ApiToken.objects.order_by("pk").values(*TOKEN_COLUMNS)),
        list(Membership.objects.order_by("pk").values()),
    )


def refused(response, status: int, field: str | None, code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert error.get("field") == field, error
    assert error["message"]
    if code is not None:
        assert error["code"] == code, error
    return error


# --- tokens ------------------------------------------------------------------------------------


TOKEN_KEYS = {"id", "name", "prefix", "scopes", "user", "created_at", "expires_at", "revoked_at", "last_used_at"}


def test_listing_tokens_needs_the_manage_scope(tenants):
    acme = tenants[0]
    response = bearer(acme.token).get("/api/v1/tokens")  # the fixture's token: read and submit
    error = refused(response, 403, None, "permission_denied")
    assert error["message"] == "this token lacks the 'manage' scope; issue one with it"


def test_a_tenant_lists_its_own_tokens_without_secrets(tenants):
    acme, globex, _ = tenants
    secret = manage_token(acme)
    response = bearer(secret).get("/api/v1/tokens")
    assert response.status_code == 200
    tokens = response.json()["tokens"]
    assert {t["name"] for t in tokens} == {"tests", "admin"}
    assert all(set(t) == TOKEN_KEYS for t in tokens)
    assert all(t["user"] == acme.username for t in tokens)
    text = response.content.decode()
    for token in ApiToken.objects.filter(tenant_id=acme.id):
        assert token.digest not in text
    assert secret not in text and acme.token not in text
    assert "globex" not in text and globex.token[:9] not in text


def test_issuing_a_token_shows_its_secret_once_and_it_works(tenants):
    acme = tenants[0]
    client = bearer(manage_token(acme))
    before = timezone.now()
    response = client.post("/api/v1/tokens", {"name": "ci", "scopes": ["read"], "expires_in_days": 30}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == TOKEN_KEYS | {"secret"}
    assert body["scopes"] == ["read"] and body["user"] == acme.username and body["revoked_at"] is None
    assert body["secret"].startswith(body["prefix"])
    stored = ApiToken.objects.get(pk=body["id"])
    assert stored.tenant_id == acme.id and stored.scopes == ["read"]
    assert before + timedelta(days=30) <= stored.expires_at <= timezone.now() + timedelta(days=30)
    assert body["secret"] not in client.get("/api/v1/tokens").content.decode()

    new = bearer(body["secret"])
    assert new.get("/api/v1/jobs").status_code == 200
    refused(new.get("/api/v1/tokens"), 403, None, "permission_denied")  # read only: no manage


def test_an_explicit_expiry_is_kept(tenants):
    client = bearer(manage_token(tenants[0]))
    at = (timezone.now() + timedelta(days=2)).replace(microsecond=0)
    response = client.post(
        "/api/v1/tokens", {"name": "ci", "scopes": ["read", "submit"], "expires_at": at.isoformat()}, format="json"
    )
    assert response.status_code == 201
    assert ApiToken.objects.get(pk=response.json()["id"]).expires_at == at


def test_a_token_cannot_mint_one_that_outlives_it(tenants):
    acme = tenants[0]
    parent_expiry = timezone.now() + timedelta(days=1)
    parent = services.issue_token(
        tenant_id=acme.id, username=acme.username, name="ci-parent", scopes=ALL, expires_at=parent_expiry
    )
    client = bearer(parent.secret)
    before = ApiToken.objects.count()
    for body in ({"name": "child", "scopes": ["read"]}, {"name": "child", "scopes": ["read"], "expires_in_days": 2}):
        refused(client.post("/api/v1/tokens", body, format="json"), 400, "expires_at")
    assert ApiToken.objects.count() == before
    ok = client.post(
        "/api/v1/tokens",
        {"name": "child", "scopes": ["read"], "expires_at": (parent_expiry - timedelta(hours=1)).isoformat()},
        format="json",
    )
    assert ok.status_code == 201, ok.content


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"scopes": ["read"]}, "name"),
        ({"name": "  ", "scopes": ["read"]}, "name"),
        ({"name": "x" * 101, "scopes": ["read"]}, "name"),
        ({"name": 7, "scopes": ["read"]}, "name"),
        ({"name": "ci"}, "scopes"),
        ({"name": "ci", "scopes": []}, "scopes"),
        ({"name": "ci", "scopes": "read"}, "scopes"),
        ({"name": "ci", "scopes": ["read", "admin"]}, "scopes[1]"),
        ({"name": "ci", "scopes": ["read"], "expires_in_days": 0}, "expires_in_days"),
        ({"name": "ci", "scopes": ["read"], "expires_in_days": 3651}, "expires_in_days"),
        ({"name": "ci", "scopes": ["read"], "expires_in_days": "7"}, "expires_in_days"),
        ({"name": "ci", "scopes": ["read"], "expires_in_days": True}, "expires_in_days"),
        ({"name": "ci", "scopes": ["read"], "expires_at": "2020-01-01T00:00:00Z"}, "expires_at"),
        ({"name": "ci", "scopes": ["read"], "expires_at": "2999-01-01T00:00:00"}, "expires_at"),
        ({"name": "ci", "scopes": ["read"], "expires_at": "next tuesday"}, "expires_at"),
        ({"name": "ci", "scopes": ["read"], "expires_at": "2999-01-01T00:00:00Z", "expires_in_days": 3}, "expires_at"),
        ({"name": "ci", "scopes": ["read"], "tenant": 2}, "tenant"),
        ({"name": "ci", "scopes": ["read"], "user": "root"}, "user"),
        ({"name": "ci", "scopes": ["read"], "secret": "pc_mine"}, "secret"),
        ({"name": "ci", "scopes": ["read"], "colour": "red"}, "colour"),
        (["ci"], "body"),
    ],
)
def test_a_bad_token_request_names_its_field_and_changes_nothing(tenants, body, field):
    client = bearer(manage_token(tenants[0]))
    before = snapshot()
    refused(client.post("/api/v1/tokens", body, format="json"), 400, field)
    assert snapshot() == before


def test_a_token_cannot_mint_a_stronger_one(tenants):
    acme = tenants[0]
    client = bearer(manage_token(acme, scopes=["read", "manage"]))
    before = snapshot()
    error = refused(
        client.post("/api/v1/tokens", {"name": "ci", "scopes": ["read", "submit"]}, format="json"),
        400,
        "scopes",
        "scope_not_grantable",
    )
    assert "'submit'" in error["message"]
    assert snapshot() == before
    assert client.post("/api/v1/tokens", {"name": "ci", "scopes": ["read"]}, format="json").status_code == 201


def test_a_token_is_never_given_scopes_beyond_its_users_role(tenants):
    acme = tenants[0]
    Membership.objects.filter(tenant_id=acme.id).update(role=Role.MEMBER)
    user_id = get_user_model().objects.get(username=acme.username).pk
    with pytest.raises(services.InvalidInput) as caught:
        services.create_token(tenant_id=acme.id, user_id=user_id, name="x", scopes=["read", "manage"])
    assert caught.value.field == "scopes" and "'manage'" in caught.value.message
    # And a stored token holding more than the role grants is cut down to the role when used.
    secret = manage_token(acme)
    error = refused(bearer(secret).get("/api/v1/tokens"), 403, None)
    assert "role 'member'" in error["message"]


def test_a_portal_session_manages_tokens_by_its_role(client, tenants):
    acme = tenants[0]
    api = APIClient()
    assert api.login(username=acme.username, password=acme.password)
    assert api.get("/api/v1/tokens").status_code == 200  # the fixture user owns acme
    Membership.objects.filter(tenant_id=acme.id).update(role=Role.VIEWER)
    error = refused(api.get("/api/v1/tokens"), 403, None)
    assert "role 'viewer'" in error["message"]


def test_revoking_a_token_stops_it_at_once(tenants):
    acme = tenants[0]
    client = bearer(manage_token(acme))
    victim = ApiToken.objects.get(tenant_id=acme.id, name="tests")
    response = client.post(f"/api/v1/tokens/{victim.pk}/revoke")
    assert response.status_code == 200 and response.json()["revoked_at"] is not None
    first = ApiToken.objects.get(pk=victim.pk).revoked_at
    assert bearer(acme.token).get("/api/v1/jobs").status_code == 401
    # Again: still revoked, at the first time.
    assert client.post(f"/api/v1/tokens/{victim.pk}/revoke").status_code == 200
    assert ApiToken.objects.get(pk=victim.pk).revoked_at == first


def test_another_tenants_token_is_not_found(tenants):
    acme, globex, initech = tenants
    target = ApiToken.objects.get(tenant_id=acme.id, name="tests")
    clients = [bearer(manage_token(other)) for other in (globex, initech)]
    before = list(ApiToken.objects.filter(tenant_id=acme.id).order_by("pk").values())
    for client in clients:
        refused(client.post(f"/api/v1/tokens/{target.pk}/revoke"), 404, None, "not_found")
        assert acme.username not in client.get("/api/v1/tokens").content.decode()
    assert list(ApiToken.objects.filter(tenant_id=acme.id).order_by("pk").values()) == before
    refused(bearer(manage_token(acme)).post("/api/v1/tokens/999999/revoke"), 404, None)
    assert bearer(acme.token).get("/api/v1/jobs").status_code == 200


# --- operator: who may -------------------------------------------------------------------------

OPERATOR_ROUTES = [
    ("get", "/api/v1/operator/cohorts"),
    ("post", "/api/v1/operator/cohorts"),
    ("get", "/api/v1/operator/cohorts/{cohort}"),
    ("patch", "/api/v1/operator/cohorts/{cohort}"),
    ("delete", "/api/v1/operator/cohorts/{cohort}"),
    ("get", "/api/v1/operator/tenants"),
    ("post", "/api/v1/operator/tenants"),
    ("get", "/api/v1/operator/tenants/{tenant}"),
    ("patch", "/api/v1/operator/tenants/{tenant}"),
    ("get", "/api/v1/operator/tenants/{tenant}/quotas"),
    ("put", "/api/v1/operator/tenants/{tenant}/quotas"),
    ("put", "/api/v1/operator/tenants/{tenant}/quotas/nau"),
    ("delete", "/api/v1/operator/tenants/{tenant}/quotas/nau"),
]


def test_only_operators_reach_the_operator_api(tenants):
    acme = tenants[0]
    cohort = Cohort.objects.create(name="lab")
    staff_member = get_user_model().objects.get(username=acme.username)
    owner_session = APIClient()
    owner_session.force_login(staff_member)
    before = snapshot()
    for method, template in OPERATOR_ROUTES:
        url = template.format(cohort=cohort.pk, tenant=acme.id)
        assert getattr(APIClient(), method)(url, {}, format="json").status_code == 401, url
        for who in (bearer(acme.token), bearer(manage_token(acme, name=f"m-{method}")), owner_session):
            refused(getattr(who, method)(url, {}, format="json"), 403, None, "permission_denied")
    # A staff user's tenant token is still a tenant token.
    staff_member.is_staff = True
    staff_member.save()
    refused(bearer(acme.token).get("/api/v1/operator/tenants"), 403, None)
    assert snapshot()[:3] == before[:3]


# --- operator: cohorts -------------------------------------------------------------------------


def test_an_operator_manages_cohorts(operator, tenants):
    response = operator.post("/api/v1/operator/cohorts", {"name": "vision", "description": "CV labs"}, format="json")
    assert response.status_code == 201, response.content
    cohort = response.json()
    assert cohort["name"] == "vision" and cohort["tenants"] == []
    assert response["Location"] == f"/api/v1/operator/cohorts/{cohort['id']}"
    Tenant.objects.filter(pk=tenants[0].id).update(cohort_id=cohort["id"])

    listed = operator.get("/api/v1/operator/cohorts").json()["cohorts"]
    assert [(c["name"], c["tenants"]) for c in listed] == [("vision", ["acme"])]
    patched = operator.patch(f"/api/v1/operator/cohorts/{cohort['id']}", {"description": "all CV"}, format="json")
    assert patched.status_code == 200 and patched.json()["description"] == "all CV"
    assert operator.get(f"/api/v1/operator/cohorts/{cohort['id']}").json()["description"] == "all CV"
    refused(operator.get("/api/v1/operator/cohorts/999999"), 404, None, "not_found")


def test_a_cohort_with_tenants_cannot_be_deleted(operator, tenants):
    cohort = Cohort.objects.create(name="nlp")
    Tenant.objects.filter(pk__in=[tenants[0].id, tenants[1].id]).update(cohort=cohort)
    before = snapshot()
    error = refused(operator.delete(f"/api/v1/operator/cohorts/{cohort.pk}"), 409, "tenants", "cohort_not_empty")
    assert "acme, globex" in error["message"]
    assert snapshot() == before
    Tenant.objects.update(cohort=None)
    assert operator.delete(f"/api/v1/operator/cohorts/{cohort.pk}").status_code == 204
    assert not Cohort.objects.exists()
    refused(operator.delete(f"/api/v1/operator/cohorts/{cohort.pk}"), 404, None)


@pytest.mark.parametrize(
    ("method", "body", "status", "field"),
    [
        ("post", {}, 400, "name"),
        ("post", {"name": "Has Spaces"}, 400, "name"),
        ("post", {"name": "-edge"}, 400, "name"),
        ("post", {"name": "x" * 64}, 400, "name"),
        ("post", {"name": "taken"}, 409, "name"),
        ("post", {"name": "ok", "description": "d" * 501}, 400, "description"),
        ("post", {"name": "ok", "id": 5}, 400, "id"),
        ("post", {"name": "ok", "tenants": ["acme"]}, 400, "tenants"),
        ("patch", {"name": "taken"}, 409, "name"),
        ("patch", {"name": 12}, 400, "name"),
        ("patch", {"created_at": "2020-01-01"}, 400, "created_at"),
    ],
)
def test_bad_cohort_writes_name_their_field_and_change_nothing(operator, tenants, method, body, status, field):
    Cohort.objects.create(name="taken")
    mine = Cohort.objects.create(name="mine")
    url = "/api/v1/operator/cohorts" if method == "post" else f"/api/v1/operator/cohorts/{mine.pk}"
    before = snapshot()
    refused(getattr(operator, method)(url, body, format="json"), status, field)
    assert snapshot() == before


# --- operator: tenants -------------------------------------------------------------------------


def test_an_operator_creates_and_edits_tenants(operator, tenants):
    cohort = Cohort.objects.create(name="research")
    body = {"slug": "umbrella", "name": "Umbrella", "cohort": "research", "fair_share_weight": 2.5}
    response = operator.post("/api/v1/operator/tenants", body, format="json")
    assert response.status_code == 201, response.content
    created = response.json()
    assert (created["slug"], created["cohort"], created["cohort_id"]) == ("umbrella", "research", cohort.pk)
    assert created["fair_share_weight"] == "2.5" and created["quotas"] == []
    assert Tenant.objects.get(slug="umbrella").fair_share_weight == Decimal("2.5")

    url = f"/api/v1/operator/tenants/{created['id']}"
    patched = operator.patch(url, {"name": "Umbrella Corp", "fair_share_weight": "1.25", "cohort": None}, format="json")
    assert patched.status_code == 200, patched.content
    assert (patched.json()["name"], patched.json()["fair_share_weight"], patched.json()["cohort"]) == (
        "Umbrella Corp",
        "1.25",
        None,
    )
    assert operator.patch(url, {"cohort": cohort.pk}, format="json").json()["cohort"] == "research"
    slugs = [t["slug"] for t in operator.get("/api/v1/operator/tenants").json()["tenants"]]
    assert slugs == ["acme", "globex", "initech", "umbrella"]
    detail = operator.get(f"/api/v1/operator/tenants/{tenants[0].id}").json()
    assert detail["quotas"][0]["resource"] == "nau"
    refused(operator.get("/api/v1/operator/tenants/999999"), 404, None)
    refused(operator.patch("/api/v1/operator/tenants/999999", {"name": "x"}, format="json"), 404, None)


@pytest.mark.parametrize(
    ("method", "body", "status", "field"),
    [
        ("post", {"name": "No Slug"}, 400, "slug"),
        ("post", {"slug": "acme", "name": "Again"}, 409, "slug"),
        ("post", {"slug": "Bad_Slug", "name": "x"}, 400, "slug"),
        ("post", {"slug": "new"}, 400, "name"),
        ("post", {"slug": "new", "name": "x", "cohort": "nowhere"}, 400, "cohort"),
        ("post", {"slug": "new", "name": "x", "cohort": 999999}, 400, "cohort"),
        ("post", {"slug": "new", "name": "x", "cohort": True}, 400, "cohort"),
        ("post", {"slug": "new", "name": "x", "fair_share_weight": 0}, 400, "fair_share_weight"),
        ("post", {"slug": "new", "name": "x", "fair_share_weight": -1}, 400, "fair_share_weight"),
        ("post", {"slug": "new", "name": "x", "fair_share_weight": "1.0001"}, 400, "fair_share_weight"),
        ("post", {"slug": "new", "name": "x", "fair_share_weight": 1000}, 400, "fair_share_weight"),
        ("post", {"slug": "new", "name": "x", "fair_share_weight": "heavy"}, 400, "fair_share_weight"),
        ("post", {"slug": "new", "name": "x", "quotas": []}, 400, "quotas"),
        ("patch", {"slug": "renamed"}, 400, "slug"),
        ("patch", {"name": ""}, 400, "name"),
        ("patch", {"usage": {"nau": 3}}, 400, "usage"),
        ("patch", {"used": 3}, 400, "used"),
        ("patch", {"balance": "100.00"}, 400, "balance"),
        ("patch", {"prices": {}}, 400, "prices"),
        ("patch", {"quotas": [{"resource": "nau", "nominal": 1}]}, 400, "quotas"),
        ("patch", {"id": 99}, 400, "id"),
        ("patch", {"fair_share_weight": None}, 400, "fair_share_weight"),
        ("patch", {"cohort": ""}, 400, "cohort"),
        ("patch", [], 400, "body"),
    ],
)
def test_bad_tenant_writes_name_their_field_and_change_nothing(operator, tenants, method, body, status, field):
    url = "/api/v1/operator/tenants" if method == "post" else f"/api/v1/operator/tenants/{tenants[0].id}"
    before = snapshot()
    refused(getattr(operator, method)(url, body, format="json"), status, field)
    assert snapshot() == before


# --- operator: quotas --------------------------------------------------------------------------


def quotas_url(tenant_id: int, resource: str | None = None) -> str:
    base = f"/api/v1/operator/tenants/{tenant_id}/quotas"
    return f"{base}/{resource}" if resource else base


def put_quotas(operator: APIClient, tenant_id: int, quotas: list[dict[str, Any]]):
    return operator.put(quotas_url(tenant_id), {"quotas": quotas}, format="json")


def accepted(response) -> Any:
    assert response.status_code == 200, response.content
    return response.json()


def stored(tenant_id: int) -> dict[str, tuple[Any, ...]]:
    return {
        q.resource: (q.nominal, q.borrowing_limit, q.lending_limit) for q in Quota.objects.filter(tenant_id=tenant_id)
    }


def test_putting_quotas_replaces_the_whole_set(operator, tenants):
    acme = tenants[0]
    body = [
        {"resource": "h100-sxm", "nominal": 8, "lending_limit": 4},
        {"resource": "nau", "nominal": "12.125"},
        {"resource": "tpu-v4", "nominal": 0},
    ]
    response = put_quotas(operator, acme.id, body)
    assert response.status_code == 200, response.content
    assert [
        (q["resource"], q["nominal"], q["borrowing_limit"], q["lending_limit"]) for q in response.json()["quotas"]
    ] == [
        ("h100-sxm", "8", None, "4"),
        ("nau", "12.125", None, None),
        ("tpu-v4", "0", None, None),
    ]
    assert stored(acme.id)["nau"] == (Decimal("12.125"), None, None)
    assert operator.get(quotas_url(acme.id)).json() == response.json()

    accepted(put_quotas(operator, acme.id, [{"resource": "a100-sxm", "nominal": 2}]))
    assert set(stored(acme.id)) == {"a100-sxm"}
    assert put_quotas(operator, acme.id, []).status_code == 200 and stored(acme.id) == {}
    # The bare list is the same request.
    assert operator.put(quotas_url(acme.id), [{"resource": "nau", "nominal": 1}], format="json").status_code == 200
    assert stored(acme.id) == {"nau": (Decimal(1), None, None)}
    refused(put_quotas(operator, 999999, []), 404, None)


@pytest.mark.parametrize(
    ("quotas", "field"),
    [
        ([{"resource": "nau", "nominal": 1}, {"resource": "h100-sxm", "nominal": -1}], "quotas[1].nominal"),
        ([{"resource": "nau", "nominal": 1, "borrowing_limit": -2}], "quotas[0].borrowing_limit"),
        ([{"resource": "nau", "nominal": 1, "lending_limit": -0.5}], "quotas[0].lending_limit"),
        ([{"resource": "h100-sxm", "nominal": 4, "lending_limit": 5}], "quotas[0].lending_limit"),
        ([{"resource": "h100-sxm", "nominal": 2.5}], "quotas[0].nominal"),
        ([{"resource": "h100-sxm", "nominal": "2.5"}], "quotas[0].nominal"),
        ([{"resource": "h100-sxm", "nominal": 4, "lending_limit": 1.5}], "quotas[0].lending_limit"),
        ([{"resource": "nau", "nominal": "1.0005"}], "quotas[0].nominal"),
        ([{"resource": "nau", "nominal": 1e12}], "quotas[0].nominal"),
        ([{"resource": "v100-pcie", "nominal": 1}], "quotas[0].resource"),
        ([{"resource": "", "nominal": 1}], "quotas[0].resource"),
        ([{"resource": 5, "nominal": 1}], "quotas[0].resource"),
        ([{"nominal": 1}], "quotas[0].resource"),
        ([{"resource": "nau"}], "quotas[0].nominal"),
        ([{"resource": "nau", "nominal": None}], "quotas[0].nominal"),
        ([{"resource": "nau", "nominal": "lots"}], "quotas[0].nominal"),
        ([{"resource": "nau", "nominal": True}], "quotas[0].nominal"),
        ([{"resource": "nau", "nominal": "NaN"}], "quotas[0].nominal"),
        ([{"resource": "nau", "nominal": 1, "used": 0}], "quotas[0].used"),
        ([{"resource": "nau", "nominal": 1, "tenant": 1}], "quotas[0].tenant"),
        ([{"resource": "nau", "nominal": 1, "price": "2.00"}], "quotas[0].price"),
        ([{"resource": "nau", "nominal": 1}, {"resource": "nau", "nominal": 2}], "quotas[1].resource"),
        (["nau"], "quotas[0]"),
        ({"resource": "nau"}, "quotas"),
        # In no cohort there is nothing to borrow.
        ([{"resource": "h100-sxm", "nominal": 2, "borrowing_limit": 1}], "quotas[0].borrowing_limit"),
    ],
)
def test_bad_quotas_name_the_exact_field_and_change_nothing(operator, tenants, quotas, field):
    acme = tenants[0]
    accepted(put_quotas(operator, acme.id, [{"resource": "nau", "nominal": 5}]))
    before = snapshot()
    refused(put_quotas(operator, acme.id, quotas), 400, field, None)
    assert snapshot() == before


def test_unknown_top_level_fields_of_a_quota_set_are_refused(operator, tenants):
    before = snapshot()
    refused(operator.put(quotas_url(tenants[0].id), {"quotas": [], "tenant": 2}, format="json"), 400, "tenant")
    refused(operator.put(quotas_url(tenants[0].id), {}, format="json"), 400, "quotas")
    assert snapshot() == before


def test_nau_may_take_three_decimals_and_flavors_whole_devices(operator, tenants):
    response = put_quotas(
        operator,
        tenants[0].id,
        [{"resource": "nau", "nominal": 0.125, "lending_limit": "0.1"}, {"resource": "tpu-v4", "nominal": "4.000"}],
    )
    assert response.status_code == 200, response.content
    assert stored(tenants[0].id) == {
        "nau": (Decimal("0.125"), None, Decimal("0.1")),
        "tpu-v4": (Decimal(4), None, None),
    }


@pytest.fixture
def cohort(tenants, operator):
    """acme lends 2 of its 4 H100s, globex all of its 3: initech may borrow up to 5."""
    acme, globex, _ = tenants
    lab = Cohort.objects.create(name="lab")
    Tenant.objects.filter(pk__in=[t.id for t in tenants]).update(cohort=lab)
    assert (
        put_quotas(operator, acme.id, [{"resource": "h100-sxm", "nominal": 4, "lending_limit": 2}]).status_code == 200
    )
    accepted(put_quotas(operator, globex.id, [{"resource": "h100-sxm", "nominal": 3}]))
    return lab


def test_a_member_may_borrow_up_to_what_the_others_lend(operator, tenants, cohort):
    initech = tenants[2]
    ok = put_quotas(operator, initech.id, [{"resource": "h100-sxm", "nominal": 1, "borrowing_limit": 5}])
    assert ok.status_code == 200, ok.content
    before = snapshot()
    error = refused(
        put_quotas(operator, initech.id, [{"resource": "h100-sxm", "nominal": 1, "borrowing_limit": 6}]),
        400,
        "quotas[0].borrowing_limit",
        "invalid_quota",
    )
    assert "at most 5" in error["message"] and "'lab'" in error["message"]
    # Nothing to borrow of a flavor nobody else holds; unlimited (null) borrowing is always allowed.
    refused(
        put_quotas(
            operator,
            initech.id,
            [{"resource": "h100-sxm", "nominal": 1}, {"resource": "tpu-v4", "nominal": 1, "borrowing_limit": 1}],
        ),
        400,
        "quotas[1].borrowing_limit",
    )
    assert snapshot() == before
    assert (
        put_quotas(operator, initech.id, [{"resource": "tpu-v4", "nominal": 1, "borrowing_limit": None}]).status_code
        == 200
    )


def test_a_lender_cannot_pull_out_from_under_a_borrower(operator, tenants, cohort):
    acme, globex, initech = tenants
    assert (
        put_quotas(operator, initech.id, [{"resource": "h100-sxm", "nominal": 0, "borrowing_limit": 5}]).status_code
        == 200
    )
    before = snapshot()
    error = refused(
        put_quotas(operator, acme.id, [{"resource": "h100-sxm", "nominal": 4, "lending_limit": 1}]),
        409,
        "quotas[0].lending_limit",
        "cohort_would_overcommit",
    )
    assert "initech" in error["message"]
    refused(put_quotas(operator, acme.id, [{"resource": "nau", "nominal": 1}]), 409, "quotas")
    refused(operator.put(quotas_url(globex.id, "h100-sxm"), {"nominal": 2}, format="json"), 409, "nominal")
    refused(operator.delete(quotas_url(globex.id, "h100-sxm")), 409, "resource")
    refused(operator.patch(f"/api/v1/operator/tenants/{acme.id}", {"cohort": None}, format="json"), 409, "cohort")
    # Moving the borrower out of the cohort: it would borrow with no cohort to borrow from.
    refused(operator.patch(f"/api/v1/operator/tenants/{initech.id}", {"cohort": None}, format="json"), 400, "cohort")
    Cohort.objects.create(name="other")
    before = snapshot()
    refused(operator.patch(f"/api/v1/operator/tenants/{initech.id}", {"cohort": "other"}, format="json"), 400, "cohort")
    assert snapshot() == before
    # Once the borrower asks for less, the lender may lend less.
    assert (
        put_quotas(operator, initech.id, [{"resource": "h100-sxm", "nominal": 0, "borrowing_limit": 4}]).status_code
        == 200
    )
    assert (
        put_quotas(operator, acme.id, [{"resource": "h100-sxm", "nominal": 4, "lending_limit": 1}]).status_code == 200
    )


def test_one_quota_at_a_time(operator, tenants, cohort):
    initech = tenants[2]
    url = quotas_url(initech.id, "h100-sxm")
    response = operator.put(url, {"nominal": 2, "borrowing_limit": 3}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["resource"] == "h100-sxm" and response.json()["borrowing_limit"] == "3"
    assert operator.put(url, {"resource": "h100-sxm", "nominal": 1}, format="json").status_code == 200
    assert stored(initech.id)["h100-sxm"] == (Decimal(1), None, None)
    before = snapshot()
    for body, status, field in [
        ({"nominal": -1}, 400, "nominal"),
        ({"nominal": 1.5}, 400, "nominal"),
        ({"nominal": 1, "lending_limit": 2}, 400, "lending_limit"),
        ({"nominal": 1, "borrowing_limit": 6}, 400, "borrowing_limit"),
        ({"resource": "tpu-v4", "nominal": 1}, 400, "resource"),
        ({"borrowing_limit": 1}, 400, "nominal"),
        ({"nominal": 1, "usage": 0}, 400, "usage"),
    ]:
        refused(operator.put(url, body, format="json"), status, field)
    refused(operator.put(quotas_url(initech.id, "v100"), {"nominal": 1}, format="json"), 400, "resource")
    refused(operator.delete(quotas_url(initech.id, "tpu-v4")), 404, None)
    assert snapshot() == before
    assert operator.delete(url).status_code == 204
    assert "h100-sxm" not in stored(initech.id)


def test_quotas_for_admission_reads_every_tenant_in_two_queries(
    operator, tenants, cohort, django_assert_max_num_queries
):
    Tenant.objects.filter(pk=tenants[1].id).update(fair_share_weight=Decimal("2.5"))
    Tenant.objects.filter(pk=tenants[2].id).update(cohort=None)
    with django_assert_max_num_queries(2):
        views = services.quotas_for_admission()
    by_slug = {v.slug: v for v in views}
    assert list(by_slug) == ["acme", "globex", "initech"]
    acme = by_slug["acme"]
    assert (acme.id, acme.cohort, acme.weight) == (tenants[0].id, "lab", Decimal(1))
    assert acme.quotas == {"h100-sxm": QuotaLimits(Decimal(4), None, Decimal(2))}
    assert acme.quotas["h100-sxm"].nominal == Decimal(4)
    assert isinstance(acme.quotas["h100-sxm"][0], Decimal)
    assert by_slug["globex"].weight == Decimal("2.5")
    assert by_slug["initech"].cohort is None
    assert by_slug["initech"].quotas == {"nau": QuotaLimits(Decimal(1000), None, None)}


# --- admin -------------------------------------------------------------------------------------


def test_the_admin_shows_cohorts_tenants_with_quotas_and_tokens(operator, tenants, cohort):
    for url in (
        "/admin/tenants/cohort/",
        "/admin/tenants/quota/",
        f"/admin/tenants/quota/?tenant__cohort__id__exact={cohort.pk}",
        "/admin/tenants/tenant/",
        f"/admin/tenants/tenant/{tenants[0].id}/change/",
        "/admin/tenants/apitoken/",
    ):
        response = operator.get(url)
        assert response.status_code == 200, url
    page = operator.get(f"/admin/tenants/tenant/{tenants[0].id}/change/").content.decode()
    assert "h100-sxm" in page  # the quota inline
    token = ApiToken.objects.filter(tenant_id=tenants[0].id).first()
    page = operator.get(f"/admin/tenants/apitoken/{token.pk}/change/").content.decode()
    assert 'name="digest"' not in page and token.digest in page  # shown, never editable
    assert operator.get("/admin/tenants/apitoken/add/").status_code == 403


def test_the_admin_refuses_quotas_the_api_would_refuse(operator, tenants, cohort):
    initech = tenants[2]
    before = snapshot()
    response = operator.post(
        "/admin/tenants/quota/add/",
        {"tenant": initech.id, "resource": "h100-sxm", "nominal": "1", "borrowing_limit": "9", "lending_limit": ""},
    )
    assert response.status_code == 200 and "at most 5" in response.content.decode()
    response = operator.post(
        "/admin/tenants/quota/add/",
        {"tenant": initech.id, "resource": "h100-sxm", "nominal": "1.5", "borrowing_limit": "", "lending_limit": ""},
    )
    assert response.status_code == 200 and "whole devices" in response.content.decode()
    assert snapshot() == before


def test_me_says_whom_a_token_acts_as(tenants):
    from django.test import Client

    acme = tenants[0]
    me = Client(headers={"Authorization": f"Bearer {acme.token}"}).get("/api/v1/me").json()
    assert me["tenant"]["slug"] == "acme" and me["user"] == acme.username
    assert me["scopes"] == ["read", "submit"] and me["token"]["name"] == "tests"
    assert me["token"]["prefix"] == acme.token[:9]
    assert Client().get("/api/v1/me").status_code == 401
