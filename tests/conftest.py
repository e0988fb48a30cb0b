"""Fixtures shared by every tier: three tenants (the third must see nothing of the others')."""

from __future__ import annotations

from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class TenantFixture:
    id: int
    slug: str
    username: str
    password: str
    token: str


# Ample: the pool, not the quota, limits the fixture tenants (quota tests set their own).
FIXTURE_NAU_QUOTA = 1000


def make_tenant(slug: str, *, nau_quota: int | None = FIXTURE_NAU_QUOTA) -> TenantFixture:
    from tenants import services
    from tenants.models import NAU_RESOURCE, Quota

    password = f"{slug}-password-1"
    ref = services.ensure_tenant_with_user(slug=slug, name=slug.title(), username=f"{slug}-user", password=password)
    if nau_quota is not None:
        Quota.objects.update_or_create(tenant_id=ref.id, resource=NAU_RESOURCE, defaults={"nominal": nau_quota})
    token = services.issue_token(tenant_id=ref.id, username=f"{slug}-user", name="tests")
    return TenantFixture(id=ref.id, slug=slug, username=f"{slug}-user", password=password, token=token.secret)


@pytest.fixture
def pool(db):
    from django.conf import settings

    from jobs import services
    from runtime.inventory import load_pool

    services.sync_pool(load_pool(settings.POLYCHIP_POOL_FILE))


@pytest.fixture
def tenants(db) -> tuple[TenantFixture, TenantFixture, TenantFixture]:
    return make_tenant("acme"), make_tenant("globex"), make_tenant("initech")
