"""Use cases of the tenants app."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from tenants.contracts import IssuedToken, TenantRef
from tenants.models import ApiToken, Membership, Role, Tenant

TOKEN_PREFIX = "pc_"
LAST_USE_RESOLUTION = timedelta(minutes=1)


def _ref(tenant: Tenant) -> TenantRef:
    return TenantRef(id=tenant.pk, slug=tenant.slug, name=tenant.name)


def digest_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@transaction.atomic
def ensure_tenant_with_user(*, slug: str, name: str, username: str, password: str, role: str = Role.OWNER) -> TenantRef:
    """Create (or find) a tenant and a user who belongs to it; used by the demo and by tests."""
    tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": name})
    user_model = get_user_model()
    user, created = user_model.objects.get_or_create(username=username)
    if created:
        user.set_password(password)
        user.save(update_fields=["password"])
    Membership.objects.get_or_create(tenant=tenant, user=user, defaults={"role": role})
    return _ref(tenant)


@transaction.atomic
def issue_token(
    *, tenant_id: int, username: str, name: str, expires_at: datetime | None = None, replace: bool = False
) -> IssuedToken:
    """Issue a token; with ``replace``, the user's earlier live tokens of the same name are revoked."""
    tenant = Tenant.objects.get(pk=tenant_id)
    user = get_user_model().objects.get(username=username, memberships__tenant=tenant)
    if replace:
        ApiToken.objects.filter(tenant=tenant, user=user, name=name, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        tenant=tenant,
        user=user,
        name=name,
        prefix=secret[: len(TOKEN_PREFIX) + 6],
        digest=digest_token(secret),
        expires_at=expires_at,
    )
    return IssuedToken(id=token.pk, tenant=_ref(tenant), name=name, secret=secret)


def authenticate_token(secret: str) -> ApiToken | None:
    """The live token for a secret, with its last use recorded; None when unknown, expired or revoked.

    A token acts for its user in its tenant, so it stops working when the user is deactivated or
    leaves the tenant.
    """
    now = timezone.now()
    token = (
        ApiToken.objects.select_related("tenant", "user")
        .filter(
            digest=digest_token(secret),
            revoked_at__isnull=True,
            user__is_active=True,
            tenant__memberships__user=F("user"),
        )
        .first()
    )
    if token is None or (token.expires_at is not None and token.expires_at <= now):
        return None
    if token.last_used_at is None or now - token.last_used_at >= LAST_USE_RESOLUTION:
        # Recorded to the minute: a write per request would contend for nothing of value.
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


def tenant_for_user(user: AbstractBaseUser | AnonymousUser) -> TenantRef | None:
    """The tenant a signed-in user acts for (their first membership)."""
    if not user.is_authenticated:
        return None
    membership = Membership.objects.select_related("tenant").filter(user_id=user.pk).order_by("pk").first()
    return _ref(membership.tenant) if membership else None
