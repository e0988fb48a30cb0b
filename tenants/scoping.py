"""Tenant-scoped lookups: a manager that finds nothing until it is told whose rows to find.

Attach it as an extra manager to any model with a foreign key to ``tenants.Tenant``, *below* a
plain ``objects`` manager so that ``objects`` stays the default (admin, system code, relations)::

    class TrainingJob(models.Model):
        tenant = models.ForeignKey("tenants.Tenant", ...)

        objects = models.Manager()
        scoped = TenantScopedManager()

    TrainingJob.scoped.for_tenant(tenant_id).filter(pk=job_id)   # that tenant's rows only
    TrainingJob.scoped.filter(pk=job_id)                          # always empty

Request-serving code reads through ``scoped``, so forgetting the tenant returns nothing instead
of every tenant's rows. A model whose default manager is a scoped one fails ``manage.py check``
(tenants.E001): Django's own machinery expects its default manager to see every row.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from django.core import checks
from django.core.exceptions import FieldDoesNotExist
from django.db import models

_M = TypeVar("_M", bound=models.Model)


def _tenant_id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"for_tenant() takes a tenant id (int), got {value!r}")
    return value


class TenantScopedQuerySet(models.QuerySet[_M], Generic[_M]):
    tenant_field = "tenant"

    def for_tenant(self, tenant_id: int) -> TenantScopedQuerySet[_M]:
        """Narrow to one tenant's rows (on a queryset that is not empty by construction)."""
        return self.filter(**{f"{self.tenant_field}_id": _tenant_id(tenant_id)})

    def _clone(self) -> TenantScopedQuerySet[_M]:
        clone: TenantScopedQuerySet[_M] = super()._clone()  # type: ignore[misc]
        clone.tenant_field = self.tenant_field
        return clone


class TenantScopedManager(models.Manager[_M], Generic[_M]):
    """Empty by default; ``for_tenant(tenant_id)`` gives that tenant's rows, as a queryset."""

    def __init__(self, tenant_field: str = "tenant") -> None:
        super().__init__()
        self.tenant_field = tenant_field

    def _unscoped(self) -> TenantScopedQuerySet[_M]:
        queryset: TenantScopedQuerySet[_M] = TenantScopedQuerySet(
            model=self.model, using=self._db, hints=getattr(self, "_hints", None)
        )
        queryset.tenant_field = self.tenant_field
        return queryset

    def get_queryset(self) -> TenantScopedQuerySet[_M]:
        return self._unscoped().none()

    def for_tenant(self, tenant_id: int) -> TenantScopedQuerySet[_M]:
        return self._unscoped().for_tenant(tenant_id)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        errors: list[checks.CheckMessage] = [*super().check(**kwargs)]
        model = self.model
        if model._meta.default_manager is not None and model._meta.default_manager.name == self.name:
            errors.append(
                checks.Error(
                    f"{model.__name__}.{self.name} is a TenantScopedManager and the model's default manager",
                    hint=f"declare `objects = models.Manager()` above `{self.name}` in {model.__name__}",
                    obj=model,
                    id="tenants.E001",
                )
            )
        try:
            field = model._meta.get_field(self.tenant_field)
        except FieldDoesNotExist:
            field = None
        if field is None or not field.many_to_one:
            errors.append(
                checks.Error(
                    f"{model.__name__} has no foreign key {self.tenant_field!r} for TenantScopedManager",
                    hint="pass the foreign key's name: TenantScopedManager(tenant_field=...)",
                    obj=model,
                    id="tenants.E002",
                )
            )
        return errors
