"""Use cases of the tenants app.

Writes run in one transaction each and either complete or change nothing; a refusal raises
``InvalidInput`` (the request is wrong: 400) or ``Conflict`` (it clashes with what exists: 409),
both naming the field to fix. Reads return the frozen dataclasses of ``tenants.contracts``.
"""

from __future__ import annotations

import hashlib
import secrets
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Final

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, Group
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Prefetch
from django.utils import timezone

from controlplane import compiled_queries, domain
from runtime.errors import FieldError
from tenants import idempotency, quota_rules
from tenants.contracts import (
    CohortView,
    IssuedToken,
    MemberRef,
    NewToken,
    QuotaLimits,
    QuotaView,
    TenantQuotaView,
    TenantRef,
    TenantView,
    TokenView,
)
from tenants.models import ApiToken, Cohort, Membership, Quota, Role, Scope, Tenant
from tenants.quota_rules import QuotaSpec, amount_text

TOKEN_PREFIX = "pc_"  # noqa: S105 (the public mark at the start of every token, not a secret)
# Where a request keeps the token it was authenticated with, when something before the API views
# (the Idempotency-Key middleware) has looked it up already: DRF's authentication takes it from there.
AUTHENTICATED_TOKEN = "_polychip_token"  # noqa: S105 (an attribute's name, not a secret)
LAST_USE_RESOLUTION = timedelta(minutes=1)
# The group of the accounts `polychip demo` creates; a production-like start refuses while one exists.
DEMO_GROUP: Final = "polychip-demo"

# What each role may do, and so the most a token of a member in that role may be given.
ROLE_SCOPES: Final[dict[str, frozenset[str]]] = {
    Role.VIEWER.value: frozenset({Scope.READ.value}),
    Role.MEMBER.value: frozenset({Scope.READ.value, Scope.SUBMIT.value}),
    Role.ADMIN.value: frozenset({Scope.READ.value, Scope.SUBMIT.value, Scope.MANAGE.value}),
    Role.OWNER.value: frozenset({Scope.READ.value, Scope.SUBMIT.value, Scope.MANAGE.value}),
}
SCOPE_ORDER: Final = tuple(s.value for s in Scope)


class Refused(FieldError, domain.DomainError):
    """A refusal naming the field to fix; ``controlplane.errors`` answers it (400 unless a subclass says
    otherwise)."""

    code = "invalid"
    field: str  # always names one


class InvalidInput(Refused, domain.Invalid):
    """The request itself is wrong (HTTP 400)."""

    def __init__(self, field: str, message: str, code: str = "invalid") -> None:
        super().__init__(field, message)
        self.code = code


class Conflict(Refused, domain.Conflict):
    """The request clashes with what exists (HTTP 409)."""

    def __init__(self, field: str, message: str, code: str = "conflict") -> None:
        super().__init__(field, message)
        self.code = code


class NotFound(domain.NotFound, LookupError):
    """No such object, or not one the caller may see: the two answer alike (HTTP 404)."""


def _ref(tenant: Tenant) -> TenantRef:
    return TenantRef(id=tenant.pk, slug=tenant.slug, name=tenant.name)


def digest_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def role_scopes(role: str | None) -> frozenset[str]:
    return ROLE_SCOPES.get(role or "", frozenset())


def sorted_scopes(scopes: Iterable[str]) -> tuple[str, ...]:
    given = set(scopes)
    return tuple(s for s in SCOPE_ORDER if s in given)


# --- flavors: filled by the jobs app at startup ------------------------------------------------

_flavor_sources: list[Callable[[], Iterable[str]]] = []


def register_flavor_source(fn: Callable[[], Iterable[str]]) -> Callable[[], Iterable[str]]:
    """Add a function that names the accelerator flavors that quotas may be set for.

    The tenants app may not import ``jobs``, which owns the pool; jobs registers its
    ``known_flavors`` here from ``JobsConfig.ready()``. Registering the same function twice is a
    no-op. Returns ``fn``, so it can be used as a decorator.
    """
    if fn not in _flavor_sources:
        _flavor_sources.append(fn)
    return fn


def unregister_flavor_source(fn: Callable[[], Iterable[str]]) -> None:
    if fn in _flavor_sources:
        _flavor_sources.remove(fn)


def known_flavors() -> set[str]:
    names: set[str] = set()
    for source in _flavor_sources:
        names.update(source())
    return names


# --- users, memberships, tokens ----------------------------------------------------------------


@transaction.atomic
def ensure_tenant_with_user(
    *, slug: str, name: str, username: str, password: str, role: str = Role.OWNER, demo: bool = False
) -> TenantRef:
    """Create (or find) a tenant and a user who belongs to it; used by the demo and by tests.

    `demo` marks the user as a demo account (`DEMO_GROUP`), which a production-like start refuses.
    """
    tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": name})
    user_model = get_user_model()
    user, created = user_model.objects.get_or_create(username=username)
    if created:
        user.set_password(password)
        user.save(update_fields=["password"])
    Membership.objects.get_or_create(tenant=tenant, user=user, defaults={"role": role})
    if demo:
        mark_demo_user(username)
    return _ref(tenant)


def mark_demo_user(username: str) -> None:
    """Put an account in the demo group: only `polychip demo` makes such accounts."""
    group, _ = Group.objects.get_or_create(name=DEMO_GROUP)
    get_user_model().objects.get(username=username).groups.add(group)


def set_password(username: str, password: str) -> None:
    user = get_user_model().objects.get(username=username)
    user.set_password(password)
    user.save(update_fields=["password"])


def demo_usernames() -> list[str]:
    """Accounts the demo created: a production-like start refuses to run while any exists."""
    return sorted(get_user_model().objects.filter(groups__name=DEMO_GROUP).values_list("username", flat=True))


def _mint(
    *, tenant: Tenant, user: Any, name: str, scopes: Sequence[str], expires_at: datetime | None
) -> tuple[ApiToken, str]:
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        tenant=tenant,
        user=user,
        name=name,
        prefix=secret[: len(TOKEN_PREFIX) + 6],
        digest=digest_token(secret),
        expires_at=expires_at,
        scopes=list(sorted_scopes(scopes)),
    )
    return token, secret


@transaction.atomic
def issue_token(
    *,
    tenant_id: int,
    username: str,
    name: str,
    expires_at: datetime | None = None,
    replace: bool = False,
    scopes: Sequence[str] = (Scope.READ.value, Scope.SUBMIT.value),
) -> IssuedToken:
    """Issue a token (system use: the demo, the CLI, tests); with ``replace``, the user's earlier
    live tokens of the same name are revoked. The role still limits what the token can do."""
    tenant = Tenant.objects.get(pk=tenant_id)
    user = get_user_model().objects.get(username=username, memberships__tenant=tenant)
    if replace:
        ApiToken.objects.filter(tenant=tenant, user=user, name=name, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
    token, secret = _mint(tenant=tenant, user=user, name=name, scopes=scopes, expires_at=expires_at)
    return IssuedToken(id=token.pk, tenant=_ref(tenant), name=name, secret=secret)


def authenticate_token(secret: str) -> ApiToken | None:
    """The live token for a secret, with its last use recorded; None when unknown, expired or revoked.

    A token acts for its user in its tenant, so it stops working when the user is deactivated or
    leaves the tenant. The token comes with ``member_role``: its user's role in its tenant.
    """
    now = timezone.now()
    # One join to the membership both requires it and reads the role (an annotation after the filter
    # reuses the filter's join); the digest is unique, so no ORDER BY. This runs on every API request.
    found = (
        ApiToken.objects.select_related("user")
        .filter(
            digest=digest_token(secret),
            revoked_at__isnull=True,
            user__is_active=True,
            user__memberships__tenant=F("tenant"),
        )
        .annotate(member_role=F("user__memberships__role"))[:1]
    )
    token = next(iter(found), None)
    if token is None or (token.expires_at is not None and token.expires_at <= now):
        return None
    if token.last_used_at is None or now - token.last_used_at >= LAST_USE_RESOLUTION:
        # Recorded to the minute: a write per request would contend for nothing of value.
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


def membership_for_user(user: AbstractBaseUser | AnonymousUser) -> MemberRef | None:
    """The tenant a signed-in user acts for (their first membership) and their role there."""
    if not user.is_authenticated:
        return None
    membership = Membership.objects.select_related("tenant").filter(user_id=user.pk).order_by("pk").first()
    return MemberRef(tenant=_ref(membership.tenant), role=membership.role) if membership else None


def tenant_for_user(user: AbstractBaseUser | AnonymousUser) -> TenantRef | None:
    """The tenant a signed-in user acts for (their first membership)."""
    member = membership_for_user(user)
    return member.tenant if member else None


def role_in_tenant(*, user_id: int, tenant_id: int) -> str | None:
    return Membership.scoped.for_tenant(tenant_id).filter(user_id=user_id).values_list("role", flat=True).first()


def _token_view(token: ApiToken) -> TokenView:
    return TokenView(
        id=token.pk,
        name=token.name,
        prefix=token.prefix,
        scopes=sorted_scopes(token.scopes if isinstance(token.scopes, list) else ()),
        user=token.user.get_username(),
        created_at=token.created_at,
        expires_at=token.expires_at,
        revoked_at=token.revoked_at,
        last_used_at=token.last_used_at,
    )


def list_tokens(*, tenant_id: int, after: int | None = None, limit: int | None = None) -> list[TokenView]:
    """The tenant's tokens, newest first (by id), after the token ``after`` when given, at most ``limit``."""
    tokens = ApiToken.scoped.for_tenant(tenant_id).select_related("user").order_by("-pk")
    if after is not None:
        tokens = tokens.filter(pk__lt=after)
    return [_token_view(t) for t in (tokens[:limit] if limit is not None else tokens)]


@transaction.atomic
def create_token(
    *,
    tenant_id: int,
    user_id: int,
    name: str,
    scopes: Sequence[str],
    expires_at: datetime | None = None,
    within: Collection[str] | None = None,
    parent_expires_at: datetime | None = None,
) -> NewToken:
    """Issue a token for a member of the tenant. It may be given only scopes that the member's
    role grants and, when the request came with a token, that this token holds (``within``), and
    it may not outlive that token (``parent_expires_at``): a token never mints a stronger one."""
    members = Membership.scoped.for_tenant(tenant_id).select_related("tenant", "user")
    membership = members.filter(user_id=user_id).first()
    if membership is None:
        raise InvalidInput("user", "you are not a member of this tenant")
    grantable = role_scopes(membership.role)
    if within is not None:
        grantable = grantable & frozenset(within)
    beyond = [s for s in sorted_scopes(scopes) if s not in grantable]
    if beyond:
        raise InvalidInput(
            "scopes",
            f"cannot grant {', '.join(repr(s) for s in beyond)}: you may grant only "
            f"{', '.join(repr(s) for s in sorted_scopes(grantable)) or 'nothing'} (role {membership.role!r})",
            code="scope_not_grantable",
        )
    if expires_at is not None and expires_at <= timezone.now():
        raise InvalidInput("expires_at", "must be in the future")
    if parent_expires_at is not None and (expires_at is None or expires_at > parent_expires_at):
        raise InvalidInput(
            "expires_at",
            f"the token making this request expires at {parent_expires_at.isoformat()}; "
            "a token it issues must expire no later",
        )
    token, secret = _mint(
        tenant=membership.tenant, user=membership.user, name=name, scopes=scopes, expires_at=expires_at
    )
    return NewToken(token=_token_view(token), secret=secret)


@transaction.atomic
def revoke_token(*, tenant_id: int, token_id: int) -> TokenView:
    """Revoke one of the tenant's tokens; revoking a revoked token keeps its first revocation time."""
    token = ApiToken.scoped.for_tenant(tenant_id).select_for_update().filter(pk=token_id).first()
    if token is None:
        raise NotFound(f"no token {token_id}")
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return _token_view(ApiToken.objects.select_related("user").get(pk=token.pk))


# --- cohorts -----------------------------------------------------------------------------------


def _cohort_view(cohort: Cohort) -> CohortView:
    return CohortView(
        id=cohort.pk,
        name=cohort.name,
        description=cohort.description,
        created_at=cohort.created_at,
        tenants=tuple(sorted(t.slug for t in cohort.tenants.all())),
    )


def _cohorts() -> Any:
    return Cohort.objects.prefetch_related(Prefetch("tenants", queryset=Tenant.objects.only("slug", "cohort_id")))


def list_cohorts() -> list[CohortView]:
    return [_cohort_view(c) for c in _cohorts().order_by("name")]


def get_cohort(cohort_id: int) -> CohortView:
    cohort = _cohorts().filter(pk=cohort_id).first()
    if cohort is None:
        raise NotFound(f"no cohort {cohort_id}")
    return _cohort_view(cohort)


def _name_taken(name: str, exclude: int | None = None) -> bool:
    taken = Cohort.objects.filter(name=name)
    return (taken.exclude(pk=exclude) if exclude is not None else taken).exists()


@transaction.atomic
def create_cohort(*, name: str, description: str = "") -> CohortView:
    if _name_taken(name):
        raise Conflict("name", f"a cohort named {name!r} exists; pick another name")
    try:
        with transaction.atomic():
            cohort = Cohort.objects.create(name=name, description=description)
    except IntegrityError:  # created by a concurrent request after the check
        raise Conflict("name", f"a cohort named {name!r} exists; pick another name") from None
    return get_cohort(cohort.pk)


@transaction.atomic
def update_cohort(cohort_id: int, *, name: str | None = None, description: str | None = None) -> CohortView:
    cohort = Cohort.objects.select_for_update().filter(pk=cohort_id).first()
    if cohort is None:
        raise NotFound(f"no cohort {cohort_id}")
    if name is not None and name != cohort.name:
        if _name_taken(name, exclude=cohort.pk):
            raise Conflict("name", f"a cohort named {name!r} exists; pick another name")
        cohort.name = name
    if description is not None:
        cohort.description = description
    try:
        with transaction.atomic():
            cohort.save(update_fields=["name", "description"])
    except IntegrityError:
        raise Conflict("name", f"a cohort named {name!r} exists; pick another name") from None
    return get_cohort(cohort.pk)


@transaction.atomic
def delete_cohort(cohort_id: int) -> None:
    """Delete an empty cohort; one with tenants in it is refused (move them out first)."""
    cohort = Cohort.objects.select_for_update().filter(pk=cohort_id).first()
    if cohort is None:
        raise NotFound(f"no cohort {cohort_id}")
    members = list(Tenant.objects.filter(cohort=cohort).order_by("slug").values_list("slug", flat=True))
    if members:
        raise Conflict(
            "tenants",
            f"cohort {cohort.name!r} still has tenants ({', '.join(members)}); move them to another cohort "
            "or none first",
            code="cohort_not_empty",
        )
    cohort.delete()


# --- tenants -----------------------------------------------------------------------------------


def _quota_view(quota: Quota) -> QuotaView:
    return QuotaView(
        resource=quota.resource,
        nominal=quota.nominal,
        borrowing_limit=quota.borrowing_limit,
        lending_limit=quota.lending_limit,
        updated_at=quota.updated_at,
    )


def _tenant_view(tenant: Tenant) -> TenantView:
    return TenantView(
        id=tenant.pk,
        slug=tenant.slug,
        name=tenant.name,
        cohort=tenant.cohort.name if tenant.cohort else None,
        cohort_id=tenant.cohort_id,
        fair_share_weight=tenant.fair_share_weight,
        created_at=tenant.created_at,
        quotas=tuple(_quota_view(q) for q in sorted(tenant.quotas.all(), key=lambda q: q.resource)),
        max_queued_jobs=tenant.max_queued_jobs,
    )


def _tenants() -> Any:
    return Tenant.objects.select_related("cohort").prefetch_related("quotas")


def list_tenants() -> list[TenantView]:
    return [_tenant_view(t) for t in _tenants().order_by("slug")]


def get_tenant(tenant_id: int) -> TenantView:
    tenant = _tenants().filter(pk=tenant_id).first()
    if tenant is None:
        raise NotFound(f"no tenant {tenant_id}")
    return _tenant_view(tenant)


def queued_jobs_cap(tenant_id: int) -> int:
    """The most jobs the tenant may have waiting at once: its own setting, else the cloud's default."""
    own = Tenant.objects.filter(pk=tenant_id).values_list("max_queued_jobs", flat=True).first()
    return int(own) if own is not None else int(settings.POLYCHIP_MAX_QUEUED_JOBS)


def queued_jobs_cap_sql(tenant_id: int) -> tuple[str, list[Any]]:
    """``queued_jobs_cap`` as a SQL expression and its parameters, for a statement that checks the cap
    in the round trip that writes the job (``jobs.submission``): a submission's read less."""
    table = connection.ops.quote_name(Tenant._meta.db_table)
    sql = f"COALESCE((SELECT max_queued_jobs FROM {table} WHERE id = %s), %s)"  # noqa: S608 (the quoted table only)
    return sql, [tenant_id, int(settings.POLYCHIP_MAX_QUEUED_JOBS)]


def tenant_id_for_slug(slug: str) -> int | None:
    """The id of the tenant with this slug, or None."""
    return Tenant.objects.filter(slug=slug).values_list("pk", flat=True).first()


def all_tenant_slugs() -> dict[int, str]:
    """Every tenant's slug by id: the values /metrics allows in its tenant label."""
    return dict(Tenant.objects.values_list("pk", "slug"))


def tenant_slugs(tenant_ids: Iterable[int]) -> dict[int, str]:
    """Each existing tenant's slug by id (an id with no tenant is left out)."""
    return dict(Tenant.objects.filter(pk__in=set(tenant_ids)).values_list("pk", "slug"))


def _find_cohort(ref: int | str, field: str = "cohort") -> Cohort:
    cohort = Cohort.objects.filter(pk=ref).first() if isinstance(ref, int) else Cohort.objects.filter(name=ref).first()
    if cohort is None:
        raise InvalidInput(field, f"no cohort {ref!r}; create it first (POST /api/v1/operator/cohorts)")
    return cohort


@transaction.atomic
def create_tenant(
    *,
    slug: str,
    name: str,
    cohort: int | str | None = None,
    fair_share_weight: Decimal = Decimal(1),
    max_queued_jobs: int | None = None,
) -> TenantView:
    """A new tenant, without members or quotas (it may join a cohort at once: it lends nothing yet)."""
    if Tenant.objects.filter(slug=slug).exists():
        raise Conflict("slug", f"a tenant with slug {slug!r} exists; pick another")
    cohort_obj = _find_cohort(cohort) if cohort is not None else None
    try:
        with transaction.atomic():
            tenant = Tenant.objects.create(
                slug=slug,
                name=name,
                cohort=cohort_obj,
                fair_share_weight=fair_share_weight,
                max_queued_jobs=max_queued_jobs,
            )
    except IntegrityError:
        raise Conflict("slug", f"a tenant with slug {slug!r} exists; pick another") from None
    return get_tenant(tenant.pk)


class _Unchanged:
    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Final = _Unchanged()


@transaction.atomic
def update_tenant(
    tenant_id: int,
    *,
    name: str | _Unchanged = UNCHANGED,
    cohort: int | str | _Unchanged | None = UNCHANGED,
    fair_share_weight: Decimal | _Unchanged = UNCHANGED,
    max_queued_jobs: int | _Unchanged | None = UNCHANGED,
) -> TenantView:
    """Rename, reweigh or move a tenant to another cohort (or none).

    Moving is refused when the tenant would borrow more than its new cohort lends (400), or when a
    member it leaves behind would then borrow more than the rest lend (409).
    """
    tenant = _lock_tenant(tenant_id)
    fields: list[str] = []
    if not isinstance(name, _Unchanged):
        tenant.name = name
        fields.append("name")
    if not isinstance(fair_share_weight, _Unchanged):
        tenant.fair_share_weight = fair_share_weight
        fields.append("fair_share_weight")
    if not isinstance(max_queued_jobs, _Unchanged):
        tenant.max_queued_jobs = max_queued_jobs
        fields.append("max_queued_jobs")
    if not isinstance(cohort, _Unchanged):
        new_cohort = _find_cohort(cohort) if cohort is not None else None
        new_id = new_cohort.pk if new_cohort else None
        if new_id != tenant.cohort_id:
            own = _specs(Quota.objects.filter(tenant=tenant))
            _enforce_cohorts(
                tenant=tenant, new_cohort_id=new_id, new_quotas=own, field_for=lambda resource, attr: "cohort"
            )
            tenant.cohort = new_cohort
            fields.append("cohort")
    if fields:
        tenant.save(update_fields=fields)
    return get_tenant(tenant.pk)


# --- quotas ------------------------------------------------------------------------------------


def _lock_tenant(tenant_id: int) -> Tenant:
    tenant = Tenant.objects.select_for_update().filter(pk=tenant_id).first()
    if tenant is None:
        raise NotFound(f"no tenant {tenant_id}")
    return tenant


def _specs(quotas: Iterable[Quota]) -> dict[str, QuotaSpec]:
    return {
        q.resource: QuotaSpec(
            resource=q.resource, nominal=q.nominal, borrowing_limit=q.borrowing_limit, lending_limit=q.lending_limit
        )
        for q in quotas
    }


def list_quotas(tenant_id: int) -> list[QuotaView]:
    if not Tenant.objects.filter(pk=tenant_id).exists():
        raise NotFound(f"no tenant {tenant_id}")
    return [_quota_view(q) for q in Quota.scoped.for_tenant(tenant_id).order_by("resource")]


def _check_each(specs: Sequence[QuotaSpec], prefix: Callable[[int], str]) -> None:
    flavors = known_flavors()
    for index, spec in enumerate(specs):
        try:
            quota_rules.check_quota(spec, flavors)
        except quota_rules.QuotaRuleError as exc:
            raise InvalidInput(prefix(index) + exc.field, exc.message, code="invalid_quota") from None


def _enforce_cohorts(
    *,
    tenant: Tenant,
    new_cohort_id: int | None,
    new_quotas: dict[str, QuotaSpec],
    field_for: Callable[[str, str], str],
) -> None:
    """Refuse a change of ``tenant``'s quotas or cohort that would let someone borrow more than
    their cohort can lend. Locks the cohorts involved (by id, after the tenant) so that changes
    to members of one cohort are checked one after another."""
    cohort_ids = sorted({c for c in (tenant.cohort_id, new_cohort_id) if c is not None})
    cohorts = {c.pk: c for c in Cohort.objects.select_for_update().filter(pk__in=cohort_ids).order_by("pk")}
    if new_cohort_id is None:
        resource = quota_rules.uncohorted_borrowing(new_quotas)
        if resource is not None:
            raise InvalidInput(
                field_for(resource, "borrowing_limit"),
                f"{tenant.slug} is in no cohort, so there is nothing to borrow: set the borrowing limit of "
                f"{resource} to 0 or null, or put the tenant in a cohort first",
                code="invalid_quota",
            )
    members: dict[int, dict[int, dict[str, QuotaSpec]]] = defaultdict(lambda: defaultdict(dict))
    others = Quota.objects.filter(tenant__cohort_id__in=cohort_ids)
    if tenant.pk is not None:
        others = others.exclude(tenant_id=tenant.pk)
    for quota in others.select_related("tenant"):
        members[quota.tenant.cohort_id or 0][quota.tenant_id][quota.resource] = _specs([quota])[quota.resource]
    if new_cohort_id is not None:
        members[new_cohort_id][tenant.pk] = dict(new_quotas)
    slugs = dict(Tenant.objects.filter(cohort_id__in=cohort_ids).values_list("pk", "slug"))
    for cohort_id in cohort_ids:
        cohort_name = cohorts[cohort_id].name
        for excess in quota_rules.borrowing_excesses(members.get(cohort_id, {})):
            available = amount_text(excess.available)
            if excess.tenant_id == tenant.pk:
                raise InvalidInput(
                    field_for(excess.resource, "borrowing_limit"),
                    f"cohort {cohort_name!r} can lend {tenant.slug} at most {available} of {excess.resource} "
                    f"(what its other members may lend), not {amount_text(excess.borrowing_limit)}",
                    code="invalid_quota",
                )
            mine = new_quotas.get(excess.resource)
            attr = "lending_limit" if mine is not None and mine.lending_limit is not None else "nominal"
            raise Conflict(
                field_for(excess.resource, attr),
                f"{slugs.get(excess.tenant_id, excess.tenant_id)} may borrow up to "
                f"{amount_text(excess.borrowing_limit)} of {excess.resource} from cohort {cohort_name!r}, which "
                f"would then lend only {available}; lower its borrowing limit first",
                code="cohort_would_overcommit",
            )


def _replace_quotas(tenant: Tenant, specs: Iterable[QuotaSpec]) -> None:
    Quota.objects.filter(tenant=tenant).delete()
    Quota.objects.bulk_create(
        Quota(
            tenant=tenant,
            resource=s.resource,
            nominal=s.nominal,
            borrowing_limit=s.borrowing_limit,
            lending_limit=s.lending_limit,
        )
        for s in specs
    )


@transaction.atomic
def set_quotas(tenant_id: int, specs: Sequence[QuotaSpec]) -> list[QuotaView]:
    """Replace the tenant's whole quota set; fields in refusals read ``quotas[i].<field>``."""
    tenant = _lock_tenant(tenant_id)

    def prefix(index: int) -> str:
        return f"quotas[{index}]."

    _check_each(specs, prefix)
    duplicate = quota_rules.duplicate_resource(specs)
    if duplicate is not None:
        raise InvalidInput(
            f"quotas[{duplicate}].resource",
            f"{specs[duplicate].resource} appears twice; give each resource once",
            code="invalid_quota",
        )
    index_of = {s.resource: i for i, s in enumerate(specs)}

    def field_for(resource: str, attr: str) -> str:
        return f"quotas[{index_of[resource]}].{attr}" if resource in index_of else "quotas"

    _enforce_cohorts(
        tenant=tenant, new_cohort_id=tenant.cohort_id, new_quotas={s.resource: s for s in specs}, field_for=field_for
    )
    _replace_quotas(tenant, specs)
    return list_quotas(tenant.pk)


@transaction.atomic
def set_quota(tenant_id: int, spec: QuotaSpec) -> QuotaView:
    """Create or replace one of the tenant's quotas; fields in refusals are the quota's own."""
    tenant = _lock_tenant(tenant_id)
    _check_each([spec], lambda index: "")
    quotas = _specs(Quota.objects.filter(tenant=tenant))
    quotas[spec.resource] = spec
    _enforce_cohorts(
        tenant=tenant,
        new_cohort_id=tenant.cohort_id,
        new_quotas=quotas,
        field_for=lambda resource, attr: attr if resource == spec.resource else "resource",
    )
    Quota.objects.update_or_create(
        tenant=tenant,
        resource=spec.resource,
        defaults={
            "nominal": spec.nominal,
            "borrowing_limit": spec.borrowing_limit,
            "lending_limit": spec.lending_limit,
        },
    )
    return _quota_view(Quota.objects.get(tenant=tenant, resource=spec.resource))


@transaction.atomic
def delete_quota(tenant_id: int, resource: str) -> None:
    """Remove one quota (the tenant then gets none of that resource); refused with 409 while a
    cohort member borrows what this quota lends."""
    tenant = _lock_tenant(tenant_id)
    quotas = _specs(Quota.objects.filter(tenant=tenant))
    if resource not in quotas:
        raise NotFound(f"{tenant.slug} has no quota for {resource!r}")
    del quotas[resource]
    _enforce_cohorts(
        tenant=tenant, new_cohort_id=tenant.cohort_id, new_quotas=quotas, field_for=lambda r, attr: "resource"
    )
    Quota.objects.filter(tenant=tenant, resource=resource).delete()


def check_quotas_for_form(*, tenant: Tenant, quotas: Sequence[QuotaSpec]) -> None:
    """The rules that the API enforces, for the admin's forms: ``tenant`` carries the edited
    fields (its cohort may have changed, it may be unsaved) and ``quotas`` its whole new set.
    Raises Refused; locks like the API's writes, so call it inside the form's transaction."""
    _check_each(quotas, lambda index: f"{quotas[index].resource}: ")
    duplicate = quota_rules.duplicate_resource(quotas)
    if duplicate is not None:
        raise InvalidInput("resource", f"{quotas[duplicate].resource} appears twice; give each resource once")
    before = Tenant.objects.filter(pk=tenant.pk).values_list("cohort_id", flat=True).first() if tenant.pk else None
    as_stored = Tenant(pk=tenant.pk, slug=tenant.slug, cohort_id=before)
    _enforce_cohorts(
        tenant=as_stored,
        new_cohort_id=tenant.cohort_id,
        new_quotas={q.resource: q for q in quotas},
        field_for=lambda resource, attr: f"{resource}: {attr}",
    )


# --- for the admission loop --------------------------------------------------------------------


def quotas_for_admission() -> list[TenantQuotaView]:
    """Every tenant, with its cohort, weight and quotas, in two queries (quotas, then tenants), as flat
    rows: every admission cycle and every submit's never-fits check reads them."""
    quotas: dict[int, dict[str, QuotaLimits]] = {}
    rows = compiled_queries.rows(
        "tenants.quotas",
        lambda: Quota.objects.order_by("tenant_id", "resource").values_list(
            "tenant_id", "resource", "nominal", "borrowing_limit", "lending_limit"
        ),
    )
    for tenant_id, resource, nominal, borrowing_limit, lending_limit in rows:
        quotas.setdefault(tenant_id, {})[resource] = QuotaLimits(nominal, borrowing_limit, lending_limit)
    tenants = compiled_queries.rows(
        "tenants.weights",
        lambda: Tenant.objects.order_by("pk").values_list("pk", "slug", "cohort__name", "fair_share_weight"),
    )
    return [
        TenantQuotaView(id=pk, slug=slug, cohort=cohort, weight=weight, quotas=quotas.get(pk, {}))
        for pk, slug, cohort, weight in tenants
    ]


# --- Idempotency-Key (tenants.idempotency; used by controlplane.idempotency's middleware) ------------

IDEMPOTENCY_KEPT_HEADERS: Final = idempotency.KEPT_HEADERS
IdempotencyClaim = idempotency.Claim


def idempotency_key_problem(key: str) -> str | None:
    return idempotency.key_problem(key)


def idempotency_fingerprint(method: str, path: str, content_type: str, body: bytes) -> str:
    return idempotency.fingerprint(method, path, content_type, body)


def claim_idempotency_key(*, principal: str, key: str, tenant_id: int | None, fingerprint: str) -> IdempotencyClaim:
    """Whether to run a request that carries a key, replay its kept answer, or refuse it (409, 422)."""
    return idempotency.claim(principal=principal, key=key, tenant_id=tenant_id, fingerprint=fingerprint)


def store_idempotency_answer(row_id: int, status_code: int, headers: dict[str, str], body: bytes) -> None:
    idempotency.store(row_id, status_code, headers, body)


def release_idempotency_key(row_id: int) -> None:
    idempotency.release(row_id)


def purge_idempotency_keys() -> int:
    """Forget the keys past POLYCHIP_IDEMPOTENCY_TTL_HOURS; how many."""
    return idempotency.purge_expired()
