"""The tenant's own code in tests and benches: bundles of the repository's examples, launch requests
for them, and the example run alone as its author would try it."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

from runtime.backends.base import LaunchRequest, RankPlacement
from runtime.jobspec import CheckpointSpec, WorkloadSpec

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "runtime" / "sdk" / "examples"
SDK_EXAMPLE = EXAMPLES / "python_sdk" / "train.py"
DDP_EXAMPLE = EXAMPLES / "torchrun_ddp" / "train.py"
# The example's own defaults (``sdk.init(steps=120, global_batch=64, lr=0.05, seed=0)``): a job with
# this workload trains on the same global batches as the script run alone.
EXAMPLE_WORKLOAD = {"steps": 120, "global_batch": 64, "lr": 0.05, "seed": 0}
# Unlike chips: the h100 emulation runs about 3.5 times as fast as the other two.
MIXED = ("h100-sxm", "a100-sxm", "tpu-v4")


def make_bundle(folder: Path, files: dict[str, str]) -> tuple[Path, str]:
    """A tar.gz of ``files`` (name -> text) and its content address."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "code.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return path, "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def user_request(
    job_id: str,
    tmp_path: Path,
    bundle: tuple[Path, str],
    *,
    kind: str = "python",
    entrypoint: str = "train.py",
    flavors: tuple[str, ...] = MIXED,
    checkpoint: CheckpointSpec | None = None,
    job_key: str = "",
    args: tuple[str, ...] = (),
    **workload: Any,
) -> LaunchRequest:
    path, ref = bundle
    placements = tuple(
        RankPlacement(rank=i, device_id=f"dev/{i}", flavor=flavor, node="node") for i, flavor in enumerate(flavors)
    )
    return LaunchRequest(
        job_id=job_id,
        placements=placements,
        workload=WorkloadSpec(
            kind=kind, model="", bundle=ref, entrypoint=entrypoint, args=args, **{**EXAMPLE_WORKLOAD, **workload}
        ),
        telemetry_url=None,
        telemetry_token="",
        artifacts_dir=str(tmp_path / "artifacts" / job_id),
        checkpoint=checkpoint,
        checkpoint_url=str(tmp_path / "checkpoints" / (job_key or job_id))
        if checkpoint or kind == "torchrun"
        else None,
        bundle_path=str(path),
        job_key=job_key or job_id,
    )


def run_alone(script: Path, folder: Path) -> tuple[Path, list[str]]:
    """The script as its author tries it: ``python train.py``, one process, no Polychip."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, str(script)], cwd=folder, env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return folder / "polychip-artifacts" / "model.pt", done.stdout.splitlines()
