from django.contrib import admin
from django.http import HttpRequest

from jobs.models import Allocation, Device, Flavor, JobEvent, Node, TrainingJob


@admin.register(Flavor)
class FlavorAdmin(admin.ModelAdmin):
    list_display = ("name", "vendor", "kind", "model", "peak_bf16_tflops", "memory_gib", "interconnect")


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "flavor", "rack")
    list_filter = ("flavor", "rack")


@admin.register(Device)
class DeviceAdmin(admin.ModelAdmin):
    list_display = ("device_id", "node", "flavor", "health")
    list_filter = ("flavor", "health")
    list_editable = ("health",)


class AllocationInline(admin.TabularInline):
    model = Allocation
    extra = 0
    readonly_fields = ("rank", "device", "started_at", "ended_at")
    can_delete = False


class JobEventInline(admin.TabularInline):
    model = JobEvent
    extra = 0
    readonly_fields = ("created_at", "kind", "from_state", "to_state", "message")
    fields = readonly_fields
    can_delete = False


@admin.register(TrainingJob)
class TrainingJobAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "tenant", "state", "steps_done", "total_steps", "last_loss", "created_at")
    list_filter = ("state", "tenant")
    search_fields = ("name",)
    readonly_fields = [f.name for f in TrainingJob._meta.fields]
    inlines = [AllocationInline, JobEventInline]

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # a job's events and usage are the record of what happened

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # jobs come in through the API, which validates the spec
