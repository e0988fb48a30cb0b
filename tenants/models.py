"""Tenants, who belongs to them, the tokens that CI pipelines use, and how much each may hold.

Quotas follow Kueue: a tenant is a ClusterQueue with a nominal amount per resource, a borrowing
limit and a lending limit, inside an optional cohort whose members lend each other what they do
not use. A resource is a flavor (counted in devices) or ``nau`` (normalized accelerator units:
one NAU is the throughput one device of the reference flavor gives a job's class).
"""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.db import models
from django.db.models import Q

from tenants.scoping import TenantScopedManager

NAU_RESOURCE = "nau"


class Cohort(models.Model):
    """Tenants that lend each other unused quota."""

    name = models.SlugField(max_length=63, unique=True)
    description = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class Tenant(models.Model):
    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200)
    cohort = models.ForeignKey(Cohort, null=True, blank=True, on_delete=models.PROTECT, related_name="tenants")
    # Fair sharing divides a tenant's share by its weight: weight 2 is entitled to twice as much.
    fair_share_weight = models.DecimalField(max_digits=6, decimal_places=3, default=Decimal("1"))
    # The most jobs the tenant may have waiting at once; None: settings.POLYCHIP_MAX_QUEUED_JOBS.
    max_queued_jobs = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(fair_share_weight__gt=0), name="tenant_weight_positive")]

    def __str__(self) -> str:
        return self.slug


class Role(models.TextChoices):
    OWNER = "owner"
    ADMIN = "admin"
    MEMBER = "member"
    VIEWER = "viewer"


class Membership(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)

    objects = models.Manager()
    scoped = TenantScopedManager()  # request code: .for_tenant(id)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "user"], name="membership_unique_user")]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} as {self.role}"


class Quota(models.Model):
    """How much of one resource a tenant may hold: devices of a flavor, or NAU."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="quotas")
    resource = models.CharField(max_length=63)  # a flavor name, or NAU_RESOURCE
    nominal = models.DecimalField(max_digits=12, decimal_places=3)
    # None: borrow as much as the cohort can lend.
    borrowing_limit = models.DecimalField(max_digits=12, decimal_places=3, null=True, blank=True)
    # None: lend all unused nominal to the cohort.
    lending_limit = models.DecimalField(max_digits=12, decimal_places=3, null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = models.Manager()
    scoped = TenantScopedManager()  # request code: .for_tenant(id)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "resource"], name="quota_one_per_resource"),
            models.CheckConstraint(condition=Q(nominal__gte=0), name="quota_nominal_not_negative"),
            models.CheckConstraint(
                condition=Q(borrowing_limit__isnull=True) | Q(borrowing_limit__gte=0),
                name="quota_borrowing_not_negative",
            ),
            models.CheckConstraint(
                condition=Q(lending_limit__isnull=True)
                | (Q(lending_limit__gte=0) & Q(lending_limit__lte=models.F("nominal"))),
                name="quota_lending_within_nominal",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant}: {self.resource} {self.nominal}"


class Scope(models.TextChoices):
    READ = "read"
    SUBMIT = "submit"
    MANAGE = "manage"


def default_scopes() -> list[str]:
    return [Scope.READ.value, Scope.SUBMIT.value]


class ApiToken(models.Model):
    """A bearer token; only its SHA-256 is stored, the secret is shown once at creation."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_tokens")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, db_index=True)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    # What the token may do, further limited by its user's role: read, submit, manage.
    scopes = models.JSONField(default=default_scopes)

    objects = models.Manager()
    scoped = TenantScopedManager()  # request code: .for_tenant(id)

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class IdempotencyKey(models.Model):
    """A request made with ``Idempotency-Key``: claimed before its view runs, then its answer, kept so
    that the same request again gets the same answer (``tenants.idempotency``)."""

    class State(models.TextChoices):
        IN_FLIGHT = "in_flight"
        DONE = "done"

    # Whose key: the token ("token:<id>") or the signed-in user ("user:<id>"); a key is theirs alone.
    principal = models.CharField(max_length=40)
    key = models.CharField(max_length=255)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, null=True, blank=True, related_name="+")
    # sha256 of the method, the path and the canonical body: the same key with another request is refused.
    fingerprint = models.CharField(max_length=64)
    state = models.CharField(max_length=10, choices=State.choices, default=State.IN_FLIGHT)
    claimed_at = models.DateTimeField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    headers = models.JSONField(default=dict, blank=True)
    body = models.BinaryField(default=b"", blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["principal", "key"], name="idempotency_key_per_principal")]
        indexes = [models.Index(fields=["created_at"], name="idempotency_key_age")]

    def __str__(self) -> str:
        return f"{self.principal} {self.key[:40]}"
