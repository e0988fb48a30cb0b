"""Steps over unequal micro-batches on three ranks equal steps on the whole batch: for fixed splits,
splits with gradient accumulation, and a split that the balancer changes while the job runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from runtime.backends.local import find_free_port
from runtime.backends.local.bench import run_emulated_ranks
from runtime.balancing import BalancerConfig
from runtime.jobspec import WorkloadSpec
from runtime.worker import WorkerConfig
from runtime.worker.config import initial_split
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


def _assert_matches_reference(artifact: Path, workload: WorkloadSpec) -> list[float]:
    expected, expected_losses = _reference(workload)
    trained = torch.load(artifact, weights_only=True)
    assert trained.keys() == expected.keys()
    for name, tensor in expected.items():
        difference = (trained[name] - tensor).abs().max().item()
        assert torch.allclose(trained[name], tensor, rtol=1e-5, atol=1e-6), (name, difference)
    untrained = build_student(workload.hidden, workload.seed).state_dict()
    assert not torch.allclose(trained["0.weight"], untrained["0.weight"])
    return expected_losses


def _configs(tmp_path: Path, workload: WorkloadSpec, world: int, **changes: Any) -> list[WorkerConfig]:
    port = find_free_port()
    configs = []
    for rank in range(world):
        config = WorkerConfig(
            job_id="exact",
            rank=rank,
            world_size=world,
            master_addr="127.0.0.1",
            master_port=port,
            flavor="cpu",
            device_id=f"cpu/{rank}",
            workload=workload,
            micro_batches=(),
            artifacts_dir=str(tmp_path / "artifacts"),
            collective_timeout_s=60,
        )
        config = replace(config, **changes)
        configs.append(replace(config, micro_batches=initial_split(config).per_rank()))
    return configs


@pytest.mark.parametrize(
    "fixed",
    [
        pytest.param({"split": ((70, 1, 25),)}, id="another-uneven-split"),
        # Two and three accumulation chunks, uneven inside each chunk, a rank idle in one chunk.
        pytest.param({"split": ((5, 10, 20), (10, 20, 31))}, id="two-chunks"),
        pytest.param({"split": ((30, 0, 2), (1, 1, 30), (10, 11, 11))}, id="three-chunks"),
    ],
)
def test_other_fixed_splits_and_accumulation_match_a_single_process(tmp_path: Path, fixed: dict[str, Any]) -> None:
    workload = WorkloadSpec(steps=10, global_batch=96, lr=0.05, seed=3, hidden=32)
    configs = _configs(tmp_path, workload, 3, **fixed)
    runs = run_emulated_ranks(configs, [1.0, 1.0, 1.0], sample_time_ms=0.0, workdir=tmp_path / "ranks", timeout_s=120)
    for run in runs:
        assert run.exit_code == 0, run.stderr_tail
    expected_losses = _assert_matches_reference(tmp_path / "artifacts" / "model.pt", workload)
    per_rank = configs[0].micro_batches
    for run in runs:
        assert [e["samples"] for e in run.steps] == [per_rank[run.rank]] * workload.steps
        assert [e["loss"] for e in run.steps] == pytest.approx(expected_losses, rel=1e-5)


def test_a_split_that_changes_mid_run_with_accumulation_matches_a_single_process(tmp_path: Path) -> None:
    # Scores that promise the opposite of the emulated speeds: the balancer starts from 1:2:4 and
    # re-splits towards 4:2:1 as it measures; memory caps force two accumulation chunks throughout.
    workload = WorkloadSpec(steps=24, global_batch=96, lr=0.05, seed=5, hidden=32)
    configs = _configs(
        tmp_path,
        workload,
        3,
        balancing=BalancerConfig(mode="dynamic"),
        scores=(1.0, 2.0, 4.0),
        caps=(30, 30, 30),
    )
    runs = run_emulated_ranks(configs, [4.0, 2.0, 1.0], sample_time_ms=0.3, workdir=tmp_path / "ranks", timeout_s=120)
    for run in runs:
        assert run.exit_code == 0, run.stderr_tail
    _assert_matches_reference(tmp_path / "artifacts" / "model.pt", workload)

    splits = [tuple(tuple(chunk) for chunk in e["split"]) for e in runs[0].steps]
    assert len(splits) == workload.steps
    assert len(set(splits)) >= 2, splits  # the split changed while the job ran
    for step, split in enumerate(splits):
        assert len(split) >= 2  # accumulation: the caps hold less than the batch
        assert sum(map(sum, split)) == workload.global_batch
        for run in runs:
            assert run.steps[step]["samples"] == sum(chunk[run.rank] for chunk in split)
    # The split moved towards the measured speeds: more for the fast rank 0, less for the slow rank 2.
    first, last = ([sum(chunk[r] for chunk in split) for r in range(3)] for split in (splits[0], splits[-1]))
    assert last[0] > first[0] and last[2] < first[2], (first, last)
