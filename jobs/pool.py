"""The pool: flavors, nodes and devices as the pool file gives them, their health, the topology,
and which devices are free to hand out now."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import BooleanField, Count, ExpressionWrapper, F, Q, QuerySet

from controlplane import compiled_queries
from jobs import dispatch, locks
from jobs.errors import UnknownDevices
from jobs.models import (
    TERMINAL_STATES,
    Allocation,
    Device,
    DeviceEvent,
    DeviceHealth,
    Flavor,
    JobAttempt,
    Node,
    PoolTopology,
)
from runtime.inventory import Fabric, Health, Pool, make_topology, rack_fat_tree
from runtime.scheduling import FreeDevice

if TYPE_CHECKING:
    from runtime.backends.kubernetes.inventory import ClusterInventory

log = logging.getLogger(__name__)

# Devices that placement may use: degraded ones last, cordoned and failed ones never.
SCHEDULABLE = (DeviceHealth.HEALTHY, DeviceHealth.DEGRADED)


def known_flavors() -> set[str]:
    return set(Flavor.objects.values_list("name", flat=True))


def devices_per_flavor() -> dict[str, int]:
    """How many devices the pool has of each flavor, whatever their health."""
    rows = Device.objects.values_list("flavor__name").annotate(n=Count("pk"))
    return {name: n for name, n in rows}


@transaction.atomic
def sync_pool(pool: Pool) -> int:
    """Upsert flavors, nodes (rack, coordinates), devices (memory) and the topology from a parsed
    pool file; returns the device count. Running it twice changes nothing the second time, and it
    never touches a device's health: that is the operators' (``set_device_health``)."""
    for flavor in pool.flavors.values():
        Flavor.objects.update_or_create(
            name=flavor.name,
            defaults={
                "vendor": flavor.vendor,
                "kind": flavor.kind.value,
                "model": flavor.model,
                "peak_bf16_tflops": flavor.peak_bf16_tflops,
                "memory_gib": flavor.memory_gib,
                "interconnect": flavor.interconnect,
                "interconnect_gbps": flavor.interconnect_gbps,
                "torch_device_type": flavor.torch_device_type,
                "collective_backend": flavor.collective_backend,
            },
        )
    flavors = {f.name: f for f in Flavor.objects.all()}
    for spec in pool.nodes:
        Node.objects.update_or_create(
            name=spec.name, defaults={"flavor": flavors[spec.flavor], "rack": spec.rack, "coords": list(spec.coords)}
        )
    nodes = {n.name: n for n in Node.objects.all()}
    devices = pool.devices()
    for device in devices:
        Device.objects.update_or_create(
            device_id=device.device_id,
            defaults={
                "node": nodes[device.node],
                "flavor": flavors[device.flavor],
                "index": device.index,
                "memory_gib": device.memory_gib,
            },
        )
    if pool.topology is None:
        PoolTopology.objects.filter(pk=1).delete()  # derived from the racks, as the file says
    else:
        PoolTopology.objects.update_or_create(
            pk=1, defaults={"kind": pool.topology.kind, "parameters": pool.topology.parameters()}
        )
    return len(devices)


CLUSTER = "cluster"  # the actor on the health changes the cluster's word makes


@transaction.atomic
def sync_cluster(inventory: ClusterInventory) -> dict[str, int]:
    """The cluster's nodes into the pool (``sync_pool`` of what it found), and its word on their health:
    a device on a node that is not ready, cordoned, tainted or under pressure (or one its device plugin
    withdrew, or on a node the cluster no longer has) takes that health, by ``cluster: <why>``; one that
    the cluster took out and now shows
    healthy comes back. A device that an operator or recovery took out is theirs: the cluster neither
    changes nor returns it (so an operator's cordon outlives a node's outage). Returns the devices
    synced and the health changes made."""
    from runtime.backends.kubernetes.inventory import NodeState

    # Under the admission lock from the first read: an operator's cordon cannot slip in between.
    dispatch.admit_requests_left_to_this_transaction()
    locks.admission_lock(wait=True)
    devices = sync_pool(inventory.pool)
    states: dict[str, Any] = dict(inventory.device_health())
    # Devices of nodes the cluster no longer has (deleted, relabelled, or allocating none) are out too.
    present = {node.name for node in inventory.pool.nodes}
    for device_id, node in Device.objects.exclude(node__name__in=present).values_list("device_id", "node__name"):
        why = inventory.left_out.get(node, "no longer in the cluster")
        states[device_id] = NodeState(Health.CORDONED, f"node {node}: {why}")
    current = dict(Device.objects.filter(device_id__in=states).values_list("device_id", "health"))
    differing = [d for d, state in states.items() if current[d] != state.health.value]
    last_by = _last_health_actors(differing)  # only where the cluster's word would change something
    order = {DeviceHealth.HEALTHY: 0, DeviceHealth.DEGRADED: 1, DeviceHealth.CORDONED: 2, DeviceHealth.FAILED: 3}
    changes: dict[tuple[str, str], list[str]] = {}
    for device_id in differing:
        state = states[device_id]
        now, wanted = DeviceHealth(current[device_id]), DeviceHealth(state.health.value)
        ours = last_by.get(device_id, "").startswith(CLUSTER)
        if ours or (now in SCHEDULABLE and order[wanted] > order[now]):
            why = f"{CLUSTER}: {state.reason}" if state.reason else f"{CLUSTER}: ready again"
            changes.setdefault((wanted, why), []).append(device_id)
    changed = sum(set_device_health(ids, health, by=why) for (health, why), ids in sorted(changes.items()))
    for name, why in sorted(inventory.left_out.items()):
        log.debug("cluster node %s is not in the pool: %s", name, why)  # every 30 s: not at the default level
    return {"devices": devices, "health_changes": changed}


def _last_health_actors(device_ids: Iterable[str]) -> dict[str, str]:
    actors: dict[str, str] = {}
    rows = DeviceEvent.objects.filter(device__device_id__in=list(device_ids), kind=DeviceEvent.Kind.HEALTH)
    for device_id, by in rows.order_by("pk").values_list("device__device_id", "by"):
        actors[device_id] = by  # the last one wins
    return actors


def pool_fabric() -> Fabric:
    """The pool's topology with every node's coordinates: ``pool_fabric().hops(a, b)`` by node name.

    Built from the stored topology and the nodes' coordinates (two queries, so that a reloaded pool
    counts at once in every process); a pool without a stored topology, or with a node that has no
    usable coordinates in it, gets the fat tree that the nodes' racks describe.
    """
    rows = compiled_queries.rows(
        "jobs.pool.nodes", lambda: Node.objects.order_by("pk").values_list("name", "rack", "coords")
    )
    stored = compiled_queries.rows(
        "jobs.pool.topology", lambda: PoolTopology.objects.filter(pk=1).values_list("kind", "parameters")
    )
    if stored:
        kind, parameters = stored[0]
        try:
            topology = make_topology(kind, parameters)
        except ValueError as exc:
            log.warning("stored pool topology is not usable (%s); using the racks", exc)
        else:
            if all(isinstance(c, list) and topology.check(c) is None for _, _, c in rows):
                return Fabric(topology=topology, coords={name: tuple(c) for name, _, c in rows})
            log.warning("some nodes have no usable %s coordinates; using the racks", topology.kind)
    return rack_fat_tree([(name, rack) for name, rack, _ in rows])


@transaction.atomic
def set_device_health(device_ids: Iterable[str], health: DeviceHealth | str, *, by: str = "") -> int:
    """Set the health of devices (cordon, uncordon, mark failed); returns how many changed.

    A cordoned or failed device is never admitted again until it is healthy (or degraded); jobs
    already running on it keep running (failure handling comes with recovery). Unknown ids change
    nothing and raise ``UnknownDevices``.
    """
    try:
        state = DeviceHealth(health)
    except ValueError:
        raise ValueError(f"health: {health!r} is not one of {', '.join(DeviceHealth.values)}") from None
    ids = sorted(set(device_ids))
    # The admission lock first: a cycle holds it from loading its snapshot of free devices to
    # committing its allocations; without it a cordon could commit mid-cycle and the cycle would
    # still hand out the devices it had read as healthy. Waiting here means a running cycle ends
    # first and the next one reads the new health.
    dispatch.admit_requests_left_to_this_transaction()
    locks.admission_lock(wait=True)
    known = set(Device.objects.filter(device_id__in=ids).values_list("device_id", flat=True))
    missing = [i for i in ids if i not in known]
    if missing:
        raise UnknownDevices(f"device_ids: no such device {missing[0]!r}")
    # A device that changes health starts its failure prediction afresh: an operator who returns it
    # has dealt with what the old readings showed.
    moving = Device.objects.filter(device_id__in=ids).exclude(health=state)
    before = list(moving.values_list("pk", "health"))
    changed = moving.update(health=state, alert_streak=0, health_readings=[], unscored_rows=0, failure_score=None)
    DeviceEvent.objects.bulk_create(
        DeviceEvent(device_id=pk, kind=DeviceEvent.Kind.HEALTH, from_health=old, to_health=state, by=by[:300])
        for pk, old in before
    )
    if changed:
        log.info("%d device(s) set %s%s", changed, state, f" by {by}" if by else "")
    return changed


def untorn_attempts() -> Q:
    """Attempts whose run the backend has not confirmed gone although nothing should run of it: an
    attempt that is no longer its job's current one (preempted, recovered), or the current attempt
    of a job that ended. As a filter on ``JobAttempt``."""
    return Q(backend_handle__isnull=False, torn_down_at__isnull=True) & (
        ~Q(number=F("job__attempt")) | Q(job__state__in=TERMINAL_STATES)
    )


def as_free_device(device: Device) -> FreeDevice:
    """A device as the scheduler sees it (``select_related("node", "flavor")`` beforehand)."""
    return FreeDevice(
        device_id=device.device_id,
        node=device.node.name,
        flavor=device.flavor.name,
        degraded=device.health == DeviceHealth.DEGRADED,
    )


def scheduler_devices(devices: QuerySet[Device]) -> list[FreeDevice]:
    """``devices`` as the scheduler sees them, by device id, read as flat rows: a pool of thousands is
    read at every admission cycle and every submit's never-fits check, and a model per device (with its
    health readings) cost several times the SQL."""
    rows = devices.order_by("device_id").values_list("device_id", "node__name", "flavor__name", "health")
    return [
        FreeDevice(device_id=device_id, node=node, flavor=flavor, degraded=health == DeviceHealth.DEGRADED)
        for device_id, node, flavor, health in rows
    ]


def free_and_releasing_devices() -> tuple[list[FreeDevice], list[FreeDevice]]:
    """(free, releasing) among the schedulable devices that no open allocation holds, in one query (an
    admission cycle needs both): free when nothing runs on it; releasing while a run the backend has not
    confirmed gone (an ended or preempted attempt's) still occupies it, which ``free`` leaves out until
    its teardown is confirmed."""
    free: list[FreeDevice] = []
    releasing: list[FreeDevice] = []
    for device_id, node, flavor, health, still_occupied in compiled_queries.rows(
        "jobs.pool.unheld_devices", _unheld_devices_query
    ):
        device = FreeDevice(device_id=device_id, node=node, flavor=flavor, degraded=health == DeviceHealth.DEGRADED)
        (releasing if still_occupied else free).append(device)
    return free, releasing


def _unheld_devices_query() -> QuerySet[Device, tuple[Any, ...]]:
    """Schedulable devices that no open allocation holds, each with whether a run not confirmed gone
    still occupies it."""
    held = Allocation.objects.filter(ended_at__isnull=True).values("device_id")
    untorn_jobs = JobAttempt.objects.filter(untorn_attempts()).values("job_id")
    # A set read once (a hashed subplan), not an EXISTS per device over its whole allocation history.
    lingering = Allocation.objects.filter(job__in=untorn_jobs).values("device_id")
    return (
        Device.objects.filter(health__in=SCHEDULABLE)
        .exclude(pk__in=held)
        .annotate(lingering=ExpressionWrapper(Q(pk__in=lingering), output_field=BooleanField()))
        .order_by("device_id")
        .values_list("device_id", "node__name", "flavor__name", "health", "lingering")
    )


def releasing_devices() -> list[FreeDevice]:
    """Schedulable devices that no open allocation holds but a run not yet confirmed gone still
    occupies: the devices ``free_devices`` leaves out until their teardown is confirmed."""
    return free_and_releasing_devices()[1]


def free_devices() -> list[FreeDevice]:
    """Schedulable devices that no open allocation holds and no lingering run still occupies."""
    return free_and_releasing_devices()[0]
