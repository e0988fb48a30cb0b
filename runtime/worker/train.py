"""The training loop of one rank: gloo process group, DDP, disjoint micro-batches, exact loss scaling.

Exactness for any split of the global batch B into micro-batches b_i: rank i back-propagates
``sum of its per-sample losses * world_size / B``; DDP averages gradients over world_size, so the
result is ``sum over all B samples / B``, the gradient of the mean loss over the global batch, the
same as one process training on the whole batch.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from runtime.worker.config import StepHook, StepInfo, TrainResult, WorkerConfig, loss_scale, slice_bounds
from runtime.worker.telemetry import Telemetry
from runtime.worker.workload import SyntheticDataset, build_student, make_optimizer

ARTIFACT_NAME = "model.pt"


class InjectedFailure(RuntimeError):
    """Raised by ``fail_at_step``: a deliberate fault for tests of failure handling."""


def run(config: WorkerConfig, step_hooks: Sequence[StepHook] = ()) -> TrainResult:
    """Train this rank to the end; rank 0 saves the model. Owns the process group it creates."""
    if config.workload.kind != "synthetic-mlp":
        raise ValueError(f"workload.kind {config.workload.kind!r} is not supported by this worker")
    if dist.is_initialized():
        raise RuntimeError("a torch.distributed process group already exists in this process")
    # Several ranks share a few cores; intra-op threads would only fight over them.
    torch.set_num_threads(1)
    telemetry = Telemetry(
        {"job": config.job_id, "rank": config.rank, "device_id": config.device_id, "flavor": config.flavor},
        url=config.telemetry_url,
        token=config.telemetry_token,
        file=config.telemetry_file,
    )
    telemetry.start()
    group_ready = False
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{config.master_addr}:{config.master_port}",
            rank=config.rank,
            world_size=config.world_size,
            timeout=timedelta(seconds=config.collective_timeout_s),
        )
        group_ready = True
        telemetry.emit(
            "started",
            world_size=config.world_size,
            steps=config.workload.steps,
            micro_batch=config.micro_batch,
            global_batch=config.workload.global_batch,
        )
        result = _train(config, step_hooks, telemetry)
        finished: dict[str, object] = {"steps": result.steps, "final_loss": result.final_loss}
        if result.artifact is not None:
            finished["artifact"] = result.artifact
        telemetry.emit("finished", **finished)
        return result
    except BaseException as exc:
        telemetry.emit("failed", error=f"{type(exc).__name__}: {exc}"[:2000])
        raise
    finally:
        # Telemetry first: peers blocked in a collective notice this rank's death only when its
        # group goes away, and the supervisor should see the failing rank exit before its victims.
        telemetry.close()
        if group_ready:
            # Tearing down after a failure must not mask the original error.
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


def _train(config: WorkerConfig, step_hooks: Sequence[StepHook], telemetry: Telemetry) -> TrainResult:
    spec = config.workload
    started = time.monotonic()
    dataset = SyntheticDataset(spec.seed, spec.global_batch)
    model = build_student(spec.hidden, spec.seed)
    ddp = DistributedDataParallel(model)
    optimizer = make_optimizer(ddp.parameters(), spec.lr)
    lo, hi = slice_bounds(config.micro_batches, config.rank)
    samples = hi - lo
    scale = loss_scale(config.world_size, spec.global_batch)
    losses: list[float] = []

    for step in range(1, spec.steps + 1):
        step_started = time.monotonic()
        if config.fail_at_step == step:
            raise InjectedFailure(f"injected failure at step {step} (fail_at_step)")
        inputs, labels = dataset.global_batch_at(step - 1)
        optimizer.zero_grad(set_to_none=True)
        loss_sum = F.cross_entropy(ddp(inputs[lo:hi]), labels[lo:hi], reduction="sum")
        (loss_sum * scale).backward()
        optimizer.step()
        # The global mean loss: one tiny all-reduce, so every rank reports the same number.
        total = loss_sum.detach().reshape(1).clone()
        dist.all_reduce(total)
        loss = total.item() / spec.global_batch
        losses.append(loss)
        compute_time = time.monotonic() - step_started

        info = StepInfo(
            step=step,
            total_steps=spec.steps,
            samples=samples,
            compute_time_s=compute_time,
            started_at=step_started,
        )
        for hook in step_hooks:
            hook(info)
        step_time = time.monotonic() - step_started
        telemetry.set_progress(step)
        telemetry.emit(
            "step",
            step=step,
            total_steps=spec.steps,
            loss=loss,
            samples=samples,
            step_time_s=step_time,
            compute_time_s=compute_time,
            samples_per_s=samples / step_time if step_time > 0 else 0.0,
        )

    artifact: str | None = None
    if config.rank == 0:
        artifact = str(save_model(model, Path(config.artifacts_dir)))
    # Nobody reports "finished" before the artifact is on disk.
    dist.barrier()
    return TrainResult(
        steps=spec.steps,
        final_loss=losses[-1] if losses else float("nan"),
        losses=losses,
        artifact=artifact,
        wall_time_s=time.monotonic() - started,
    )


def save_model(model: nn.Module, artifacts_dir: Path) -> Path:
    """Write the state_dict atomically: a reader sees the old file or the whole new one, never half."""
    artifacts_dir.mkdir(parents=True, exist_ok=True)
    final = artifacts_dir / ARTIFACT_NAME
    tmp = artifacts_dir / f".{ARTIFACT_NAME}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as fh:
            torch.save(model.state_dict(), fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    try:
        dir_fd = os.open(artifacts_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # make the rename itself durable
        finally:
            os.close(dir_fd)
    except OSError:
        pass
    return final
