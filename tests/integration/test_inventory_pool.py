"""The pool in the control plane: topology and coordinates persisted, health counts over the API,
cordoning through the service, and admission that skips cordoned devices and chooses by topology."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from jobs import services
from jobs.models import Device, DeviceHealth, Node, PoolTopology
from runtime.inventory import parse_pool
from tests.pools import H100_FLAVOR

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def torus_pool():
    return parse_pool(
        {
            "flavors": {"h100-sxm": H100_FLAVOR},
            "topology": {"kind": "torus3d", "dims": [4, 1, 1]},
            "nodes": [
                {"name": f"t{x}", "flavor": "h100-sxm", "devices": 2, "rack": "r", "coords": [x, 0, 0]}
                for x in range(4)
            ],
        }
    )


def test_the_pool_persists_topology_coordinates_and_memory_idempotently():
    pool = torus_pool()
    assert services.sync_pool(pool) == 8
    assert services.sync_pool(pool) == 8  # twice changes nothing
    assert Node.objects.count() == 4 and Device.objects.count() == 8
    assert Node.objects.get(name="t3").coords == [3, 0, 0]
    assert set(Device.objects.values_list("memory_gib", flat=True)) == {80.0}
    stored = PoolTopology.objects.get()
    assert (stored.kind, stored.parameters) == ("torus3d", {"dims": [4, 1, 1]})
    fabric = services.pool_fabric()
    assert fabric.hops("t0", "t3") == 1 and fabric.hops("t0", "t2") == 2  # wraps around


def test_a_reload_keeps_what_operators_set(pool):
    services.set_device_health(["gpu-h100-0/0"], DeviceHealth.CORDONED, by="op")
    from django.conf import settings

    from runtime.inventory import load_pool

    services.sync_pool(load_pool(settings.POLYCHIP_POOL_FILE))
    assert Device.objects.get(device_id="gpu-h100-0/0").health == DeviceHealth.CORDONED
    assert services.pool_fabric().topology.kind == "fat-tree"  # the demo pool names none: from racks


def test_cordon_service_and_api_health_counts(pool, tenants):
    assert services.set_device_health(["gpu-h100-0/0"], "cordoned", by="op") == 1
    assert services.set_device_health(["gpu-h100-0/0"], "cordoned", by="op") == 0  # already
    assert services.set_device_health(["npu-910b-0/1"], DeviceHealth.FAILED) == 1
    assert services.set_device_health(["npu-910b-0/2"], DeviceHealth.DEGRADED) == 1
    with pytest.raises(services.UnknownDevices, match="device_ids: no such device 'nope'"):
        services.set_device_health(["npu-910b-0/3", "nope"], DeviceHealth.FAILED)
    assert Device.objects.get(device_id="npu-910b-0/3").health == DeviceHealth.HEALTHY  # nothing changed
    # Each change is in the history, newest first, once (the second cordon changed nothing).
    history = [(e.device_id, e.from_health, e.to_health, e.by) for e in services.device_events()]
    assert history == [
        ("npu-910b-0/2", "healthy", "degraded", ""),
        ("npu-910b-0/1", "healthy", "failed", ""),
        ("gpu-h100-0/0", "healthy", "cordoned", "op"),
    ]
    assert [e.device_id for e in services.device_events(device_id="npu-910b-0/1")] == ["npu-910b-0/1"]
    with pytest.raises(ValueError, match="health: 'broken' is not one of"):
        services.set_device_health(["npu-910b-0/3"], "broken")

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {tenants[0].token}")
    body = client.get("/api/v1/pool").json()
    assert body["topology"]["kind"] == "fat-tree"
    rows = {row["flavor"]: row for row in body["flavors"]}
    assert rows["h100-sxm"]["health"] == {"healthy": 1, "degraded": 0, "cordoned": 1, "failed": 0}
    assert rows["h100-sxm"]["devices"] == {"total": 2, "healthy": 1, "allocated": 0}
    assert rows["ascend-910b"]["health"] == {"healthy": 2, "degraded": 1, "cordoned": 0, "failed": 1}

    assert services.set_device_health(["gpu-h100-0/0"], DeviceHealth.HEALTHY) == 1  # uncordon


def test_admission_skips_cordoned_devices(pool):
    from datetime import UTC, datetime

    from jobs import snapshot as admission

    services.set_device_health(["gpu-h100-0/1", "tpu-v4-0/0"], DeviceHealth.CORDONED)
    services.set_device_health(["tpu-v4-0/1"], DeviceHealth.FAILED)
    snapshot = admission.load_snapshot(datetime.now(UTC))
    free = {d.device_id for d in snapshot.free}
    assert "gpu-h100-0/0" in free
    assert not free & {"gpu-h100-0/1", "tpu-v4-0/0", "tpu-v4-0/1"}
    assert snapshot.distance is not None and snapshot.distance("gpu-h100-0", "gpu-a100-0") == 2


def test_degraded_devices_are_offered_but_taken_last(pool):
    from datetime import UTC, datetime

    from jobs import snapshot as admission
    from runtime.scheduling import FreePool

    services.set_device_health(["npu-910b-0/0"], DeviceHealth.DEGRADED)
    snapshot = admission.load_snapshot(datetime.now(UTC))
    offered = {d.device_id: d for d in snapshot.free}
    assert offered["npu-910b-0/0"].degraded and not offered["npu-910b-0/1"].degraded

    free = FreePool(snapshot.free, distance=snapshot.distance)
    three = {d.device_id for d in free.take("ascend-910b", 3)}
    assert "npu-910b-0/0" not in three  # three healthy ones are free: the degraded one waits
    assert [d.device_id for d in free.take("ascend-910b", 1)] == ["npu-910b-0/0"]  # then it is the last


def _staff(username: str, *codenames: str):
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    user = get_user_model().objects.create_user(username=username, password="pw-12345678", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="jobs", codename__in=codenames))
    return get_user_model().objects.get(pk=user.pk)  # a fresh instance: no cached permissions


HEALTH_ACTIONS = {"cordon", "uncordon", "mark_degraded", "mark_failed"}


def test_only_staff_who_may_change_devices_get_the_health_actions(pool):
    from django.contrib import admin
    from django.test import Client, RequestFactory

    device_admin = admin.site._registry[Device]
    viewer = _staff("viewer", "view_device")
    operator = _staff("operator", "view_device", "change_device")
    for user, expected in ((viewer, set()), (operator, HEALTH_ACTIONS)):
        request = RequestFactory().get("/admin/jobs/device/")
        request.user = user
        assert set(device_admin.get_actions(request)) & HEALTH_ACTIONS == expected

    # Through the changelist as a browser posts it: the viewer's cordon does nothing.
    device = Device.objects.get(device_id="gpu-h100-0/0")
    form = {"action": "cordon", "_selected_action": [device.pk], "index": 0}
    client = Client()
    client.force_login(viewer)
    assert client.get("/admin/jobs/device/").status_code == 200  # viewing is allowed
    client.post("/admin/jobs/device/", form)
    assert Device.objects.get(pk=device.pk).health == DeviceHealth.HEALTHY

    client.force_login(operator)
    client.post("/admin/jobs/device/", form)
    assert Device.objects.get(pk=device.pk).health == DeviceHealth.CORDONED
    client.post("/admin/jobs/device/", {**form, "action": "mark_degraded"})
    assert Device.objects.get(pk=device.pk).health == DeviceHealth.DEGRADED


@pytest.mark.django_db(transaction=True)
def test_cordoning_waits_for_a_running_admission_cycle(pool):
    import threading

    from django.db import connection, transaction

    from jobs.models import AdmissionLock

    AdmissionLock.objects.get_or_create(pk=1)
    changed: list[int] = []

    def cordon() -> None:
        try:
            changed.append(services.set_device_health(["gpu-h100-0/0"], DeviceHealth.CORDONED, by="op"))
        finally:
            connection.close()

    worker = threading.Thread(target=cordon)
    with transaction.atomic():
        AdmissionLock.objects.select_for_update().get(pk=1)  # as a cycle holds it
        worker.start()
        worker.join(0.5)
        # The cordon waits for the cycle: the cycle's snapshot and allocations see the old health.
        assert worker.is_alive() and not changed
        assert Device.objects.get(device_id="gpu-h100-0/0").health == DeviceHealth.HEALTHY
    worker.join(10)
    assert changed == [1]
    assert Device.objects.get(device_id="gpu-h100-0/0").health == DeviceHealth.CORDONED


def test_usage_history_counts_every_device_a_job_held_over_its_interval(pool, tenants):
    from datetime import UTC, datetime, timedelta

    from django.conf import settings

    from jobs import snapshot as admission
    from jobs.models import Allocation, JobState, TrainingJob
    from runtime.scheduling import NAU
    from runtime.scheduling.fairshare import decayed_usage

    now = datetime.now(UTC)
    rates = {("synthetic-mlp", "h100-sxm"): 1500, ("synthetic-mlp", "a100-sxm"): 700}
    held = {  # device -> (started, ended): two jobs of two devices each, one ended
        "gpu-h100-0/0": (now - timedelta(hours=3), now - timedelta(hours=1)),
        "gpu-h100-0/1": (now - timedelta(hours=3), now - timedelta(hours=1)),
        "gpu-a100-0/0": (now - timedelta(minutes=40), None),
        "gpu-a100-0/1": (now - timedelta(minutes=40), None),
    }
    first, second = (
        TrainingJob.objects.create(tenant_id=tenants[0].id, name=n, spec={}, state=JobState.RUNNING) for n in "ab"
    )
    for rank, (device_id, (started, ended)) in enumerate(held.items()):
        job = first if ended is not None else second
        device = Device.objects.get(device_id=device_id)
        Allocation.objects.create(job=job, device=device, rank=rank % 2, started_at=started, ended_at=ended)

    history = admission.usage_history(now, rates)[tenants[0].id]

    half_life_s = settings.POLYCHIP_FAIR_SHARE_HALF_LIFE_H * 3600.0
    flavor_of = {d: Device.objects.get(device_id=d).flavor.name for d in held}
    spans = {
        flavor: [(s.timestamp(), e and e.timestamp(), 1.0) for d, (s, e) in held.items() if flavor_of[d] == flavor]
        for flavor in set(flavor_of.values())
    }
    nau = [
        (s.timestamp(), e and e.timestamp(), float(rates[("synthetic-mlp", flavor_of[d])]))
        for d, (s, e) in held.items()
    ]
    expected = {flavor: decayed_usage(s, now.timestamp(), half_life_s) for flavor, s in spans.items()}
    expected[NAU] = decayed_usage(nau, now.timestamp(), half_life_s)
    assert history == pytest.approx(expected, rel=1e-12)
    assert expected["h100-sxm"] > expected["a100-sxm"] > 0
