"""A job's checkpoints and final model over the API: a real checkpoint store written by the runtime's
Checkpointer, listed with its manifest's sizes and checksums, and streamed back byte for byte."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
import torch
from django.conf import settings
from rest_framework.test import APIClient
from torch import nn

from jobs import services
from jobs.models import JobState, TrainingJob
from jobs.runs import checkpoint_url
from runtime.jobspec import CheckpointSpec, parse_job_spec
from runtime.recovery.checkpoint import Checkpointer
from runtime.recovery.store import LocalStore, open_store

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

SPEC = {"name": "keeps", "devices": 1, "flavors": ["tpu-v4"], "workload": {"steps": 50}}


@pytest.fixture(autouse=True)
def own_folders(settings, tmp_path: Path) -> None:
    settings.POLYCHIP_CHECKPOINT_URL = f"file://{tmp_path / 'checkpoints'}"
    settings.POLYCHIP_ARTIFACTS_DIR = tmp_path / "artifacts"


def api(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def a_job(tenant_id: int) -> TrainingJob:
    view = services.submit_job(tenant_id=tenant_id, user_id=None, spec=parse_job_spec(SPEC))
    TrainingJob.objects.filter(pk=view.id).update(state=JobState.RUNNING)
    return TrainingJob.objects.get(pk=view.id)


def save_model(model: nn.Module, folder: Path) -> Path:
    """What rank 0 leaves when training ends: the model's state_dict in its run's artifact folder."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), folder / "model.pt")
    return folder / "model.pt"


def store_of(job: TrainingJob) -> LocalStore:
    store = open_store(checkpoint_url(job))
    assert isinstance(store, LocalStore)
    return store


def train_and_checkpoint(job: TrainingJob) -> dict[int, dict[str, torch.Tensor]]:
    """Steps 10 (full: weights and optimizer state) and 20 (weights only) of a small model, saved
    through the runtime's Checkpointer into the job's own store; the weights of each."""
    torch.manual_seed(18)
    model = nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    saved: dict[int, dict[str, torch.Tensor]] = {}
    spec = CheckpointSpec(weights_every=10, optimizer_every=20, keep=5)
    with Checkpointer(store_of(job), spec, background=False) as checkpointer:
        for step in range(1, 21):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step in (10, 20):
                kind = "full" if step == 10 else "weights"
                checkpointer.save(step, kind, model, optimizer, {"step": step})
                saved[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return saved


def checkpoints(client: APIClient, job: TrainingJob) -> dict[str, Any]:
    response = client.get(f"/api/v1/jobs/{job.pk}/checkpoints")
    assert response.status_code == 200, response.content
    return response.json()


def body_of(response: Any) -> bytes:
    assert response.streaming  # sent in chunks, never built whole
    return b"".join(response.streaming_content)


def test_checkpoints_are_listed_newest_first_with_their_manifests_figures(tenants, pool):
    job = a_job(tenants[0].id)
    client = api(tenants[0].token)
    assert checkpoints(client, job) == {"job": job.pk, "checkpoints": [], "final_model": None}

    train_and_checkpoint(job)
    listing = checkpoints(client, job)
    assert [c["step"] for c in listing["checkpoints"]] == [20, 10]
    newest, full = listing["checkpoints"]
    assert (newest["kind"], newest["layers"]) == ("weights", ["weights"])
    assert (full["kind"], full["layers"]) == ("full", ["optimizer", "weights"])
    folder = store_of(job).root / "step-0000000010"
    for entry in full["files"]:
        data = (folder / entry["name"]).read_bytes()
        assert (entry["size_bytes"], entry["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
    assert full["size_bytes"] == sum(f["size_bytes"] for f in full["files"])
    assert full["download"] == f"/api/v1/jobs/{job.pk}/checkpoints/10/download"
    assert full["created_at"].endswith("+00:00")

    # A checkpoint whose manifest does not parse is not offered (a restore would skip it too).
    torn = store_of(job).root / "step-0000000030"
    torn.mkdir()
    (torn / "manifest.json").write_text("{not json")
    assert [c["step"] for c in checkpoints(client, job)["checkpoints"]] == [20, 10]
    assert client.get(f"/api/v1/jobs/{job.pk}/checkpoints/30/download").status_code == 404


def test_a_checkpoint_downloads_as_one_tar_that_torch_loads(tenants, pool):
    job = a_job(tenants[0].id)
    saved = train_and_checkpoint(job)
    client = api(tenants[0].token)

    response = client.get(f"/api/v1/jobs/{job.pk}/checkpoints/10/download")
    assert response.status_code == 200
    data = body_of(response)
    assert int(response["Content-Length"]) == len(data)
    assert response["Content-Type"] == "application/x-tar"
    assert response["Content-Disposition"] == f'attachment; filename="job-{job.pk}-step-0000000010.tar"'
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = tar.getnames()
        files = {m.name.split("/")[1]: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    assert names == ["step-0000000010/manifest.json", "step-0000000010/optimizer.pt", "step-0000000010/weights.pt"]
    manifest = json.loads(files["manifest.json"])
    for name in ("weights.pt", "optimizer.pt"):  # the manifest vouches for what came with it
        assert manifest["files"][name]["sha256"] == hashlib.sha256(files[name]).hexdigest()
    weights = torch.load(io.BytesIO(files["weights.pt"]), weights_only=True)
    assert weights.keys() == saved[10].keys()
    for key, tensor in saved[10].items():
        assert torch.equal(weights[key], tensor)
    optimizer = torch.load(io.BytesIO(files["optimizer.pt"]), weights_only=True)
    assert set(optimizer) >= {"state", "param_groups"} and optimizer["state"]  # momentum buffers

    # One file alone, as stored.
    response = client.get(f"/api/v1/jobs/{job.pk}/checkpoints/20/download?file=weights.pt")
    data = body_of(response)
    assert int(response["Content-Length"]) == len(data)
    assert response["Content-Disposition"] == f'attachment; filename="job-{job.pk}-step-0000000020-weights.pt"'
    weights = torch.load(io.BytesIO(data), weights_only=True)
    assert all(torch.equal(weights[key], tensor) for key, tensor in saved[20].items())
    assert not torch.equal(weights["weight"], saved[10]["weight"])

    refused = client.get(f"/api/v1/jobs/{job.pk}/checkpoints/20/download?file=optimizer.pt")
    assert refused.status_code == 400 and refused.json()["error"]["field"] == "file"  # a weights-only step


def test_the_final_model_is_listed_and_streamed(tenants, pool):
    job = a_job(tenants[0].id)
    client = api(tenants[0].token)
    assert client.get(f"/api/v1/jobs/{job.pk}/model").status_code == 404

    torch.manual_seed(7)
    model = nn.Linear(5, 2)
    path = save_model(model, settings.POLYCHIP_ARTIFACTS_DIR / services.run_key(job))
    # Rank 0's finished event names it; a later attempt (a new run folder) still finds it there.
    TrainingJob.objects.filter(pk=job.pk).update(artifact_path=str(path), attempt=1)

    final = checkpoints(client, job)["final_model"]
    assert final == {
        "size_bytes": path.stat().st_size,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "download": f"/api/v1/jobs/{job.pk}/model",
    }
    response = client.get(final["download"])
    assert response.status_code == 200
    data = body_of(response)
    assert int(response["Content-Length"]) == len(data) == final["size_bytes"]
    assert response["Content-Disposition"] == f'attachment; filename="job-{job.pk}-model.pt"'
    state = torch.load(io.BytesIO(data), weights_only=True)
    assert all(torch.equal(state[key], tensor) for key, tensor in model.state_dict().items())


def test_a_path_outside_the_jobs_own_folders_is_never_served(tenants, pool):
    mine, other = a_job(tenants[0].id), a_job(tenants[0].id)
    elsewhere = save_model(nn.Linear(2, 2), settings.POLYCHIP_ARTIFACTS_DIR / services.run_key(other))
    TrainingJob.objects.filter(pk=mine.pk).update(artifact_path=str(elsewhere))
    client = api(tenants[0].token)
    assert checkpoints(client, mine)["final_model"] is None
    assert client.get(f"/api/v1/jobs/{mine.pk}/model").status_code == 404


def test_another_tenants_job_and_a_missing_step_answer_404(tenants, pool):
    job = a_job(tenants[0].id)
    train_and_checkpoint(job)
    save_model(nn.Linear(2, 2), settings.POLYCHIP_ARTIFACTS_DIR / services.run_key(job))
    theirs, mine = api(tenants[1].token), api(tenants[0].token)
    for route in ("checkpoints", "checkpoints/10/download", "checkpoints/10/download?file=weights.pt", "model"):
        assert mine.get(f"/api/v1/jobs/{job.pk}/{route}").status_code == 200, route
        other = theirs.get(f"/api/v1/jobs/{job.pk}/{route}")
        missing = theirs.get(f"/api/v1/jobs/999999/{route}")
        assert other.status_code == missing.status_code == 404, route
        assert other.json()["error"]["code"] == missing.json()["error"]["code"] == "not_found"
    for step in (0, 15, 30, 10**12):
        response = mine.get(f"/api/v1/jobs/{job.pk}/checkpoints/{step}/download")
        assert response.status_code == 404, step
        assert response.json()["error"]["field"] == "step"
