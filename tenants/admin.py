from django.contrib import admin

from tenants.models import ApiToken, Membership, Tenant


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "created_at")
    search_fields = ("slug", "name")


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("tenant", "user", "role")
    list_filter = ("role",)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "prefix", "tenant", "user", "expires_at", "revoked_at", "last_used_at")
    readonly_fields = ("prefix", "digest", "last_used_at")
