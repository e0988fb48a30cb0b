"""The tenant's own code through the whole stack: a bundle uploaded over the API, a python job that
is killed and comes back by itself, its logs, metrics, checkpoints and model read back over the API,
an unmodified torchrun script, and the specs the control plane refuses before anything runs.

The stack is real (tests/stack.py: the ASGI server, a Celery worker and beat, PostgreSQL, Redis, real
gloo ranks under the local backend).
"""

from __future__ import annotations

import io
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from jobs import services
from jobs.models import Device, DeviceHealth, MetricPoint
from tests.attempts import handle_of, wait_until
from tests.usercode import DDP_EXAMPLE, EXAMPLE_WORKLOAD, SDK_EXAMPLE, make_bundle, run_alone

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

FINAL = {"succeeded", "failed", "cancelled"}


def upload(api: Any, tmp_path: Path, files: dict[str, str]) -> str:
    """The bundle of ``files`` uploaded as a raw body, as the README's curl does; its content address."""
    path, ref = make_bundle(tmp_path, files)
    response = api.session.post(
        f"{api.url}/api/v1/bundles",
        data=path.read_bytes(),
        headers={"Content-Type": "application/gzip"},
        timeout=30,
    )
    assert response.status_code in (200, 201), response.text
    assert response.json()["sha256"] == ref.removeprefix("sha256:")
    return ref


def last_step(job_id: int) -> int:
    steps = MetricPoint.objects.filter(job_id=job_id, name="loss").values_list("step", flat=True)
    return max(steps, default=0)


def logged_losses(api: Any, job_id: int) -> list[float]:
    response = api.get(f"/api/v1/jobs/{job_id}/logs?rank=0")
    assert response.status_code == 200, response.text
    return [float(line.split("loss ")[1].split()[0]) for line in response.text.splitlines() if ": loss " in line]


@pytest.mark.timeout(600)
def test_a_python_job_killed_by_kill_9_comes_back_by_itself_and_keeps_everything(api_for, tenants, pool, tmp_path):
    api = api_for(tenants[0].token)
    bundle = upload(api, tmp_path / "bundle", {"train.py": SDK_EXAMPLE.read_text()})
    spec = {
        "name": "own-code",
        "devices": 3,
        "flavors": ["h100-sxm", "a100-sxm"],  # unlike chips: the pool has two of each
        "workload": {"kind": "python", "bundle": bundle, "entrypoint": "train.py", **EXAMPLE_WORKLOAD},
        "checkpoint": {"weights_every": 10, "keep": 3},
        "max_restarts": 2,
    }
    response = api.post("/api/v1/jobs", spec)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]

    run_dir = Path(wait_until(lambda: handle_of(job_id), 120, "a launched run")["run_dir"])
    wait_until(lambda: last_step(job_id) >= 25, 120, "step 25 of the first attempt")
    status = json.loads((run_dir / "status.json").read_text())
    os.kill(next(r["pid"] for r in status["ranks"] if r["rank"] == 1), signal.SIGKILL)

    job = api.wait_for(job_id, FINAL, timeout_s=300)
    assert job["state"] == "succeeded", job["failure_reason"]
    assert job["restarts"] == 1 and job["attempt"] == 1
    assert job["recovery"]["restored"]["step"] >= 10  # the user's registered state, not step 0

    # The same model as the script run alone on the same global batches: the loss within 1%.
    _, alone = run_alone(SDK_EXAMPLE, tmp_path / "alone")
    alone_loss = float(next(line for line in reversed(alone) if ": loss " in line).split("loss ")[1].split()[0])
    losses = logged_losses(api, job_id)
    assert losses and losses[-1] == pytest.approx(alone_loss, rel=0.01)
    first_attempt = api.get(f"/api/v1/jobs/{job_id}/logs?rank=0&attempt=0").text
    assert "resumed at step" not in first_attempt and "resumed at step" in api.get(f"/api/v1/jobs/{job_id}/logs").text

    # The metrics history holds the loss of every step and the scheduler's learning rate.
    metrics = api.get(f"/api/v1/jobs/{job_id}/metrics").json()
    series = {s["name"]: s for s in metrics["series"]}
    assert {"loss", "lr"} <= set(series)
    assert series["loss"]["points"][-1]["step"] == EXAMPLE_WORKLOAD["steps"]

    # Checkpoints are listed and downloadable, and the final model loads into the same shapes.
    listed = api.get(f"/api/v1/jobs/{job_id}/checkpoints").json()
    assert listed["checkpoints"], listed
    step = listed["checkpoints"][-1]["step"]
    download = api.get(f"/api/v1/jobs/{job_id}/checkpoints/{step}/download")
    assert download.status_code == 200 and int(download.headers["Content-Length"]) == len(download.content)
    model = api.get(f"/api/v1/jobs/{job_id}/model")
    assert model.status_code == 200
    weights = torch.load(io.BytesIO(model.content), weights_only=True)
    assert weights and all(isinstance(t, torch.Tensor) for t in weights.values())

    # Another tenant sees none of it.
    other = api_for(tenants[1].token)
    for path in ("logs", "metrics", "checkpoints", "model"):
        assert other.get(f"/api/v1/jobs/{job_id}/{path}").status_code == 404

    failed = list(Device.objects.filter(health=DeviceHealth.FAILED).values_list("device_id", flat=True))
    if failed:
        services.set_device_health(failed, DeviceHealth.HEALTHY, by="test operator")


@pytest.mark.timeout(300)
def test_an_unmodified_torchrun_script_succeeds_on_two_ranks(api_for, tenants, pool, tmp_path):
    api = api_for(tenants[0].token)
    bundle = upload(api, tmp_path / "bundle", {"train.py": DDP_EXAMPLE.read_text()})
    spec = {
        "name": "ddp",
        "devices": 2,
        "flavors": ["tpu-v4"],
        "workload": {"kind": "torchrun", "bundle": bundle, "entrypoint": "train.py", "steps": 40},
    }
    response = api.post("/api/v1/jobs", spec)
    assert response.status_code == 201, response.text
    job = api.wait_for(response.json()["id"], FINAL, timeout_s=240)
    assert job["state"] == "succeeded", job["failure_reason"]
    assert "done" in api.get(f"/api/v1/jobs/{job['id']}/logs?rank=0").text.splitlines()


def test_specs_that_cannot_run_are_refused_at_submit_naming_the_field(api_for, tenants, pool, tmp_path):
    api = api_for(tenants[0].token)
    bundle = upload(api, tmp_path / "bundle", {"train.py": "print('hi')\n"})
    unknown = "sha256:" + "0" * 64
    cases = [
        ({"kind": "python", "entrypoint": "train.py"}, "workload.bundle"),
        ({"kind": "python", "bundle": unknown, "entrypoint": "train.py"}, "workload.bundle"),
        ({"kind": "python", "bundle": bundle, "entrypoint": "missing.py"}, "workload.entrypoint"),
        ({"kind": "python", "bundle": bundle, "entrypoint": "../train.py"}, "workload.entrypoint"),
        ({"kind": "container", "image": "registry.example/train:1", "command": ["python", "t.py"]}, "workload.kind"),
    ]
    before = api.get("/api/v1/jobs").json()
    for workload, field in cases:
        spec = {"name": "refused", "devices": 1, "flavors": ["tpu-v4"], "workload": workload}
        response = api.post("/api/v1/jobs", spec)
        assert response.status_code == 400, (workload, response.text)
        error = response.json()["error"]
        assert error["field"] == field, (workload, error)
    assert "Kubernetes" in error["message"]  # the container: which backend runs it
    assert api.get("/api/v1/jobs").json() == before  # nothing was submitted
