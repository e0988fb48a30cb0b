"""Recovery in the admin: an operator drains a node (its devices cordoned, its jobs asked to checkpoint
and move), only staff who may change nodes get the action, and job lists show restarts."""

from __future__ import annotations

import pytest

from jobs.models import Device, DeviceHealth, JobState, Node, TrainingJob

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

DRAIN = "drain"


def _staff(username: str, *codenames: str, superuser: bool = False):
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    model = get_user_model()
    if superuser:
        return model.objects.create_superuser(username=username, password="pw-12345678")
    user = model.objects.create_user(username=username, password="pw-12345678", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="jobs", codename__in=codenames))
    return model.objects.get(pk=user.pk)  # a fresh instance: no cached permissions


def _messages(response) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


def test_draining_an_idle_node_cordons_its_devices_and_moves_no_job(pool):
    from django.test import Client

    node = Node.objects.get(name="gpu-h100-0")
    other = set(Device.objects.exclude(node=node).values_list("health", flat=True))
    client = Client()
    client.force_login(_staff("root", superuser=True))
    form = {"action": DRAIN, "_selected_action": [node.pk], "index": 0}
    response = client.post("/admin/jobs/node/", form, follow=True)

    assert response.status_code == 200
    assert "1 node(s) cordoned; 0 job(s) asked to checkpoint and move" in _messages(response)
    assert set(Device.objects.filter(node=node).values_list("health", flat=True)) == {DeviceHealth.CORDONED}
    assert set(Device.objects.exclude(node=node).values_list("health", flat=True)) == other  # only that node's

    # Draining it again changes nothing and still answers.
    response = client.post("/admin/jobs/node/", form, follow=True)
    assert "1 node(s) cordoned; 0 job(s) asked to checkpoint and move" in _messages(response)


def test_draining_a_node_asks_its_running_job_to_checkpoint_and_move(pool, tenants, monkeypatch):
    from django.test import Client
    from django.utils import timezone

    from jobs import moving, recovery
    from jobs.models import Allocation, JobAttempt, JobEvent

    stops: list[tuple[dict, str]] = []

    class Backend:
        def request_stop(self, handle: dict, reason: str) -> None:
            stops.append((handle, reason))

    monkeypatch.setattr(recovery, "get_backend", lambda: Backend())
    monkeypatch.setattr(moving, "get_backend", lambda: Backend())
    spec = {"name": "busy", "devices": 1, "flavors": ["h100-sxm"]}
    job = TrainingJob.objects.create(
        tenant_id=tenants[0].id,
        name="busy",
        spec=spec,
        state=JobState.RUNNING,
        total_steps=100,
    )
    JobAttempt.objects.create(job=job, number=0, backend_handle={"run": "fake"})
    Allocation.objects.create(
        job=job, device=Device.objects.get(device_id="gpu-h100-0/1"), rank=0, started_at=timezone.now()
    )
    client = Client()
    client.force_login(_staff("root", superuser=True))
    node = Node.objects.get(name="gpu-h100-0")
    response = client.post(
        "/admin/jobs/node/", {"action": DRAIN, "_selected_action": [node.pk], "index": 0}, follow=True
    )

    assert f"1 node(s) cordoned; 1 job(s) asked to checkpoint and move (#{job.pk})" in _messages(response)
    run = JobAttempt.objects.get(job=job, number=job.attempt)
    assert run.stop_requested == "node gpu-h100-0 drained by root"
    assert stops == [({"run": "fake"}, "node gpu-h100-0 drained by root")]
    event = JobEvent.objects.filter(job=job, kind=JobEvent.Kind.RECOVERY).get()
    assert event.message == "asked to checkpoint and move: node gpu-h100-0 drained by root"


def test_only_staff_who_may_change_nodes_get_the_drain_action(pool):
    from django.contrib import admin
    from django.test import Client, RequestFactory

    node_admin = admin.site._registry[Node]
    viewer = _staff("viewer", "view_node", "view_device")
    operator = _staff("operator", "view_node", "change_node")
    for user, expected in ((viewer, False), (operator, True)):
        request = RequestFactory().get("/admin/jobs/node/")
        request.user = user
        assert (DRAIN in node_admin.get_actions(request)) is expected

    # Posted as a browser would, the viewer's drain does nothing.
    node = Node.objects.get(name="gpu-h100-0")
    client = Client()
    client.force_login(viewer)
    assert client.get("/admin/jobs/node/").status_code == 200  # viewing is allowed
    client.post("/admin/jobs/node/", {"action": DRAIN, "_selected_action": [node.pk], "index": 0})
    assert set(Device.objects.filter(node=node).values_list("health", flat=True)) == {DeviceHealth.HEALTHY}


def test_the_job_list_shows_restarts_and_filters_recovering_jobs(pool, tenants):
    from django.test import Client

    spec = {"name": "r", "devices": 1, "flavors": ["h100-sxm"]}
    common = {"tenant_id": tenants[0].id, "spec": spec, "total_steps": 10}
    TrainingJob.objects.create(name="mending", state=JobState.RECOVERING, restarts=2, **common)
    TrainingJob.objects.create(name="waiting", state=JobState.QUEUED, **common)
    client = Client()
    client.force_login(_staff("root", superuser=True))

    response = client.get("/admin/jobs/trainingjob/")
    assert response.status_code == 200
    assert "column-restarts" in response.content.decode()
    response = client.get("/admin/jobs/trainingjob/", {"state__exact": JobState.RECOVERING})
    assert response.status_code == 200
    page = response.content.decode()
    assert "mending" in page and "waiting" not in page
