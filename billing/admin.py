from django.contrib import admin

from billing.models import UsageRecord


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    list_display = ("key", "tenant", "job_id", "flavor", "device_id", "duration_ms", "started_at", "ended_at")
    list_filter = ("flavor", "tenant")
    readonly_fields = [f.name for f in UsageRecord._meta.fields]

    def has_add_permission(self, request: object) -> bool:  # usage comes from allocations only
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False
