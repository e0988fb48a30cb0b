from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from jobs import services
from jobs.models import (
    Allocation,
    Device,
    DeviceEvent,
    DeviceHealth,
    Flavor,
    JobEvent,
    Node,
    PoolTopology,
    ThroughputEntry,
    TrainingJob,
)


@admin.register(Flavor)
class FlavorAdmin(admin.ModelAdmin):
    list_display = ("name", "vendor", "kind", "model", "peak_bf16_tflops", "memory_gib", "interconnect")


@admin.action(permissions=["change"], description="Cordon and drain: checkpoint and move its jobs")
def drain(admin_: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Node]) -> None:
    """Cordon each node's devices and ask the jobs running there to checkpoint and move elsewhere."""
    by = request.user.get_username()
    nodes, moved = 0, []
    for node in queryset.order_by("name"):
        try:
            moved += services.drain_node(node.name, by=by)
        except services.UnknownDevices as exc:
            admin_.message_user(request, f"{node.name}: {exc}", messages.WARNING)
            continue
        nodes += 1
    ids = f" ({', '.join(f'#{job_id}' for job_id in moved)})" if moved else ""
    admin_.message_user(
        request,
        f"{nodes} node(s) cordoned; {len(moved)} job(s) asked to checkpoint and move{ids}",
        messages.SUCCESS,
    )


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "flavor", "rack", "coords")
    list_filter = ("flavor", "rack")
    search_fields = ("name",)
    actions = [drain]

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # nodes come from the pool file; drain one instead


@admin.register(PoolTopology)
class PoolTopologyAdmin(admin.ModelAdmin):
    list_display = ("kind", "parameters")
    readonly_fields = ("kind", "parameters")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # it comes from the pool file (manage.py load_pool)


def _set_health(admin_: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Device], health: str) -> None:
    ids = list(queryset.values_list("device_id", flat=True))
    changed = services.set_device_health(ids, health, by=request.user.get_username())
    admin_.message_user(request, f"{changed} of {len(ids)} device(s) now {health}", messages.SUCCESS)


# Every health action changes devices: a staff user who may only view them gets none of them.
@admin.action(permissions=["change"], description="Cordon: schedule nothing new on them")
def cordon(admin_: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Device]) -> None:
    _set_health(admin_, request, queryset, DeviceHealth.CORDONED)


@admin.action(permissions=["change"], description="Uncordon: mark healthy again")
def uncordon(admin_: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Device]) -> None:
    _set_health(admin_, request, queryset, DeviceHealth.HEALTHY)


@admin.action(permissions=["change"], description="Mark degraded: schedule on them last")
def mark_degraded(admin_: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Device]) -> None:
    _set_health(admin_, request, queryset, DeviceHealth.DEGRADED)


@admin.action(permissions=["change"], description="Mark failed")
def mark_failed(admin_: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Device]) -> None:
    _set_health(admin_, request, queryset, DeviceHealth.FAILED)


@admin.register(Device)
class DeviceAdmin(admin.ModelAdmin):
    list_display = ("device_id", "flavor", "node", "health", "memory_gib")
    list_filter = ("flavor", "health", "node__rack")
    search_fields = ("device_id", "node__name")
    list_select_related = ("flavor", "node")
    # Health changes go through the actions (a service), never by editing rows.
    readonly_fields = ("health",)
    actions = [cordon, uncordon, mark_degraded, mark_failed]

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # devices come from the pool file (manage.py load_pool); allocations and usage name them

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


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


@admin.action(permissions=["change"], description="Cancel the selected jobs")
def cancel(admin_: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[TrainingJob]) -> None:
    """Through the jobs service, as the API cancels: a job that has ended already is left as it is."""
    done, skipped = [], []
    for job in queryset.order_by("pk"):
        try:
            services.cancel_job(tenant_id=job.tenant_id, job_id=job.pk)
            done.append(job.pk)
        except services.InvalidTransition:
            skipped.append(job.pk)
    admin_.message_user(request, f"{len(done)} job(s) cancelled; {len(skipped)} had already ended", messages.SUCCESS)


@admin.register(TrainingJob)
class TrainingJobAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "tenant", "state", "restarts", "steps_done", "total_steps", "last_loss", "created_at")
    list_filter = ("state", "tenant")
    search_fields = ("name",)
    readonly_fields = [f.name for f in TrainingJob._meta.fields]
    inlines = [AllocationInline, JobEventInline]
    actions = [cancel]

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # a job's events and usage are the record of what happened

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # jobs come in through the API, which validates the spec


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows that only services write (history, measurements): shown, never added, changed or deleted."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(DeviceEvent)
class DeviceEventAdmin(ReadOnlyAdmin):
    """The devices' health history: written by the services that change health, read-only here."""

    list_display = ("created_at", "device", "kind", "from_health", "to_health", "score", "by")
    list_filter = ("kind", "to_health")
    search_fields = ("device__device_id", "by")
    readonly_fields = [f.name for f in DeviceEvent._meta.fields]


@admin.register(ThroughputEntry)
class ThroughputEntryAdmin(ReadOnlyAdmin):
    """Read-only: entries come from ``seed_throughput`` and from step telemetry, never by hand."""

    list_display = ("job_class", "flavor", "devices", "samples_per_s", "source", "samples", "updated_at")
    list_filter = ("source", "job_class", "flavor", "devices")
    search_fields = ("job_class", "flavor")
    ordering = ("job_class", "flavor", "devices")
    readonly_fields = [f.name for f in ThroughputEntry._meta.fields]
