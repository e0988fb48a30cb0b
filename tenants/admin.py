"""The operator console's view of tenants: cohorts, tenants with their quotas, members, tokens.

Quota edits here obey the API's rules (``services.check_quotas_for_form``): known resources, whole
devices, lending within nominal, borrowing within what the cohort can lend.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db.models import Count, QuerySet
from django.http import HttpRequest

from tenants import services
from tenants.models import ApiToken, Cohort, Membership, Quota, Tenant
from tenants.quota_rules import QuotaSpec


def _spec(data: dict[str, Any]) -> QuotaSpec:
    return QuotaSpec(
        resource=data["resource"],
        nominal=data["nominal"],
        borrowing_limit=data.get("borrowing_limit"),
        lending_limit=data.get("lending_limit"),
    )


class QuotaInlineFormSet(forms.BaseInlineFormSet):
    def clean(self) -> None:
        super().clean()
        if any(self.errors):
            return
        specs = [
            _spec(form.cleaned_data)
            for form in self.forms
            if form.cleaned_data and not form.cleaned_data.get("DELETE") and form.cleaned_data.get("resource")
        ]
        try:
            services.check_quotas_for_form(tenant=self.instance, quotas=specs)
        except services.Refused as exc:
            raise ValidationError(f"{exc.field}: {exc.message}") from None


class QuotaInline(admin.TabularInline):
    model = Quota
    formset = QuotaInlineFormSet
    extra = 0
    fields = ("resource", "nominal", "borrowing_limit", "lending_limit", "updated_at")
    readonly_fields = ("updated_at",)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ("user",)


@admin.register(Cohort)
class CohortAdmin(admin.ModelAdmin):
    list_display = ("name", "description", "tenant_count", "created_at")
    search_fields = ("name", "description")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Cohort]:
        return super().get_queryset(request).annotate(tenant_count=Count("tenants"))

    @admin.display(description="tenants", ordering="tenant_count")
    def tenant_count(self, obj: Cohort) -> int:
        return int(getattr(obj, "tenant_count", 0))


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "cohort", "fair_share_weight", "max_queued_jobs", "created_at")
    list_filter = ("cohort",)
    list_select_related = ("cohort",)
    search_fields = ("slug", "name")
    inlines = (QuotaInline, MembershipInline)


class QuotaForm(forms.ModelForm):
    class Meta:
        model = Quota
        fields = ("tenant", "resource", "nominal", "borrowing_limit", "lending_limit")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        tenant = data.get("tenant")
        if tenant is None or not data.get("resource") or data.get("nominal") is None:
            return data
        others = [
            _spec(
                {"resource": q.resource, **{f: getattr(q, f) for f in ("nominal", "borrowing_limit", "lending_limit")}}
            )
            for q in Quota.objects.filter(tenant=tenant).exclude(resource=data["resource"])
            if self.instance.pk is None or q.pk != self.instance.pk
        ]
        try:
            services.check_quotas_for_form(tenant=tenant, quotas=[*others, _spec(data)])
        except services.Refused as exc:
            raise ValidationError(f"{exc.field}: {exc.message}") from None
        return data


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    form = QuotaForm
    list_display = ("tenant", "resource", "nominal", "borrowing_limit", "lending_limit", "updated_at")
    list_filter = ("resource", "tenant__cohort")
    list_select_related = ("tenant",)
    search_fields = ("tenant__slug", "resource")


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("tenant", "user", "role")
    list_filter = ("role", "tenant")
    list_select_related = ("tenant", "user")
    search_fields = ("tenant__slug", "user__username")


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "prefix", "tenant", "user", "scopes", "expires_at", "revoked_at", "last_used_at")
    list_filter = ("tenant", "revoked_at")
    list_select_related = ("tenant", "user")
    search_fields = ("name", "prefix", "tenant__slug", "user__username")
    # The digest identifies the secret: never editable. Tokens are issued through the API or
    # the CLI, where the secret can be shown once, never here.
    readonly_fields = ("tenant", "user", "prefix", "digest", "created_at", "last_used_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
