"""One step over unequal micro-batches on three ranks equals one step on the whole batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from runtime.backends.local import find_free_port
from runtime.jobspec import WorkloadSpec
from runtime.worker import WorkerConfig
from runtime.worker.workload import SyntheticDataset, build_student, make_optimizer
from tests.runtime.conftest import REPO

pytestmark = pytest.mark.runtime

SPLIT = (10, 30, 56)
STEPS = 12


def _reference(workload: WorkloadSpec) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Plain single-process training on the same global batches: no torch.distributed at all."""
    dataset = SyntheticDataset(workload.seed, workload.global_batch)
    model = build_student(workload.hidden, workload.seed)
    optimizer = make_optimizer(model.parameters(), workload.lr)
    losses = []
    for step in range(workload.steps):
        inputs, labels = dataset.global_batch_at(step)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model.state_dict(), losses


def test_an_uneven_three_rank_run_matches_a_single_process(tmp_path: Path) -> None:
    workload = WorkloadSpec(steps=STEPS, global_batch=sum(SPLIT), lr=0.05, seed=7, hidden=32)
    port = find_free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    procs = []
    for rank in range(len(SPLIT)):
        config = WorkerConfig(
            job_id="exact",
            rank=rank,
            world_size=len(SPLIT),
            master_addr="127.0.0.1",
            master_port=port,
            flavor="cpu",
            device_id=f"cpu/{rank}",
            workload=workload,
            micro_batches=SPLIT,
            artifacts_dir=str(tmp_path / "artifacts"),
            telemetry_file=str(tmp_path / f"telemetry.rank{rank}.jsonl"),
            collective_timeout_s=60,
        )
        path = tmp_path / f"rank{rank}.json"
        path.write_text(json.dumps(config.to_dict()))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "runtime.worker", "--config", str(path)],
                env=env,
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    try:
        # The reference trains while the ranks start up.
        expected, expected_losses = _reference(workload)
        deadline = time.monotonic() + 120
        outputs = [p.communicate(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err.decode()[-2000:]

    trained = torch.load(tmp_path / "artifacts" / "model.pt", weights_only=True)
    assert trained.keys() == expected.keys()
    for name, tensor in expected.items():
        difference = (trained[name] - tensor).abs().max().item()
        assert torch.allclose(trained[name], tensor, rtol=1e-5, atol=1e-6), (name, difference)
    # Training moved the weights: the comparison is not between two untouched inits.
    untrained = build_student(workload.hidden, workload.seed).state_dict()
    assert not torch.allclose(trained["0.weight"], untrained["0.weight"])

    for rank, samples in enumerate(SPLIT):
        events = [json.loads(line) for line in (tmp_path / f"telemetry.rank{rank}.jsonl").read_text().splitlines()]
        steps = [e for e in events if e["kind"] == "step"]
        assert [e["samples"] for e in steps] == [samples] * STEPS
        assert [e["loss"] for e in steps] == pytest.approx(expected_losses, rel=1e-5)
