"""The built-in real models learn on a mixed gang: two unlike chips, dynamic balancing, the local backend."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runtime.backends.base import LaunchRequest, Phase, RankPlacement
from runtime.backends.local import LocalBackend
from runtime.jobspec import BUILTIN_MODELS, WorkloadSpec
from tests.runtime.conftest import wait_until_final

pytestmark = pytest.mark.runtime

# Relative speeds 1.0 and 0.32 in the demo pool; at 1 ms a sample the emulated speeds outweigh the
# models' own compute, which is the same on both ranks of this host.
GANG = ("h100-sxm", "a100-sxm")


def train_on_gang(backend: LocalBackend, model: str, tmp_path: Path) -> list[dict[str, Any]]:
    request = LaunchRequest(
        job_id=f"gang-{model}",
        placements=tuple(
            RankPlacement(rank=i, device_id=f"dev/{i}", flavor=flavor, node="node") for i, flavor in enumerate(GANG)
        ),
        workload=WorkloadSpec(kind="builtin", model=model, **BUILTIN_MODELS[model]),
        telemetry_url=None,
        telemetry_token="",
        artifacts_dir=str(tmp_path / "artifacts" / model),
        balancing="dynamic",
    )
    handle = backend.provision(request)
    observation = wait_until_final(backend, handle, timeout_s=300)
    assert observation.phase == Phase.SUCCEEDED, observation.reason
    path = Path(handle["run_dir"]) / "telemetry.rank0.jsonl"
    steps = [e for e in map(json.loads, path.read_text().splitlines()) if e["kind"] == "step"]
    # Once it had measured both, the balancer gave the faster chip the larger share (summed over the
    # steps, so that a moment of contention on this shared host does not decide it).
    measured = [step["split"][0] for step in steps[10:]]
    assert sum(fast for fast, _ in measured) > 1.2 * sum(slow for _, slow in measured), measured[-5:]
    return steps


def held_out(steps: list[dict[str, Any]]) -> dict[str, float]:
    figures: dict[str, float] = {}
    for step in steps:
        figures.update(step.get("metrics") or {})
    return figures


def test_the_character_lm_learns_on_a_mixed_gang(make_backend: Callable[..., LocalBackend], tmp_path: Path) -> None:
    steps = train_on_gang(make_backend(telemetry_files=True, sample_time_ms=1.0), "charlm", tmp_path)
    assert held_out(steps)["val_loss"] <= 0.7 * steps[0]["loss"]


def test_the_digits_cnn_learns_on_a_mixed_gang(make_backend: Callable[..., LocalBackend], tmp_path: Path) -> None:
    steps = train_on_gang(make_backend(telemetry_files=True, sample_time_ms=1.0), "digits-cnn", tmp_path)
    assert held_out(steps)["val_accuracy"] >= 0.95
