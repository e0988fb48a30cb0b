"""The training loop's side of recovery: restore at start, layered saves while training, stop on request.

Every replica holds the same weights and optimizer state (each rank applies the same all-reduced
gradient), so rank 0 alone saves, and what it saves does not depend on the world size: a job saved
on 3 ranks restores on 2 or 4. The data order is a function of the step alone
(``SyntheticDataset.global_batch_at``), so resuming after step s continues with the global batch of
step s + 1: within the epoch no sample is skipped or seen twice, whatever the new split.

What is not restored: the balancer's split (the new set of devices is measured afresh) and the
compression residuals of ``runtime.comm`` (per-rank state tied to the old layout; error feedback
starts again from zero, which costs a few steps of slightly noisier gradients, not correctness).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from runtime.recovery.checkpoint import Checkpointer, RestorePlan, SaveRecord, find_restore, load
from runtime.recovery.store import CheckpointStore, open_store
from runtime.worker.config import WorkerConfig
from runtime.worker.telemetry import Telemetry

# How long the ranks wait for rank 0 to choose (and verify) the checkpoint to restore.
RESTORE_TIMEOUT_S = 1800.0


class Restorable(Protocol):
    def load_state_dict(self, state: dict[str, Any], /) -> Any: ...


class Stopped(Exception):
    """The job was asked to stop (drain, preemption, resize); its state is saved. Not a failure."""


@dataclass(frozen=True)
class Resumed:
    step: int  # the last step whose weights were restored (0: a fresh start)
    optimizer_step: int | None  # where the optimizer state came from (None: fresh)
    restore_s: float


def open_store_for(config: WorkerConfig) -> CheckpointStore | None:
    if config.checkpoint is None or not config.checkpoint_url:
        return None
    return open_store(config.checkpoint_url)


def restore(
    config: WorkerConfig,
    store: CheckpointStore | None,
    model: nn.Module,
    optimizer: Restorable | None,
    telemetry: Telemetry,
) -> Resumed:
    """Load the newest usable checkpoint into ``model`` and ``optimizer`` (an optimizer, or the
    training API's ``TrainingState``; None: weights only) on every rank.

    Rank 0 chooses (verifying checksums, skipping torn or corrupt checkpoints) and broadcasts the
    steps, so every rank loads the same files even if a listing raced a write."""
    started = time.monotonic()
    spec = config.checkpoint
    if store is None or spec is None:
        return Resumed(0, None, 0.0)
    plan: RestorePlan | None = None
    chosen = torch.tensor([-1, -1], dtype=torch.int64)
    if config.rank == 0:
        plan = find_restore(store, spec.restore)
        if plan is not None:
            chosen[0] = plan.weights_step
            chosen[1] = plan.optimizer_step if plan.optimizer_step is not None else -1
    if config.world_size > 1:
        # Rank 0 verifies every candidate (reads and hashes it) before it answers, which on a slow
        # store takes longer than the collective timeout allows: the answer goes over a group of
        # its own with a long one.
        patient = dist.new_group(backend="gloo", timeout=timedelta(seconds=RESTORE_TIMEOUT_S))
        dist.broadcast(chosen, src=0, group=patient)
        dist.destroy_process_group(patient)
    weights_step, optimizer_step = int(chosen[0]), int(chosen[1])
    if weights_step < 0:
        return Resumed(0, None, time.monotonic() - started)
    if plan is None:
        plan = RestorePlan(
            mode=spec.restore,
            weights_step=weights_step,
            optimizer_step=optimizer_step if optimizer_step >= 0 else None,
            meta={},
            skipped=(),
        )
    restored = load(store, plan)
    model.load_state_dict(restored.model_state)
    if restored.optimizer_state is not None and optimizer is not None:
        optimizer.load_state_dict(restored.optimizer_state)
    elapsed = time.monotonic() - started
    if config.rank == 0:
        telemetry.emit(
            "restored",
            step=plan.weights_step,
            optimizer_step=plan.optimizer_step,
            mode=plan.mode,
            skipped=[{"checkpoint": name, "reason": reason} for name, reason in plan.skipped],
            saved_world_size=plan.meta.get("world_size"),
            world_size=config.world_size,
            restore_s=round(elapsed, 4),
        )
    return Resumed(plan.weights_step, plan.optimizer_step, elapsed)


def make_checkpointer(config: WorkerConfig, store: CheckpointStore | None, telemetry: Telemetry) -> Checkpointer | None:
    """Rank 0's checkpointer (None elsewhere, or without a store); each save is a telemetry event."""
    if config.rank != 0 or store is None or config.checkpoint is None:
        return None
    store.clean_partial()  # leftovers of a save that the previous attempt's death cut short

    def saved(record: SaveRecord) -> None:
        telemetry.emit(
            "checkpoint",
            step=record.step,
            checkpoint_kind=record.kind,
            stall_ms=round(record.stall_s * 1000, 3),
            write_ms=round(record.write_s * 1000, 3),
            bytes=record.bytes,
            background=record.background,
            deleted=list(record.deleted),
        )

    return Checkpointer(store, config.checkpoint, background=config.checkpoint_background, on_saved=saved)


def checkpoint_meta(config: WorkerConfig, step: int, batches_per_epoch: int, loss: float) -> dict[str, Any]:
    """What a checkpoint records beside the tensors: enough to check a resume and to read it later."""
    spec = config.workload
    epoch, position = divmod(step, batches_per_epoch)
    return {
        "job_id": config.job_id,
        "world_size": config.world_size,
        "global_batch": spec.global_batch,
        "seed": spec.seed,
        "hidden": spec.hidden,
        "samples_seen": step * spec.global_batch,
        "epoch": epoch,
        "batches_into_epoch": position,
        "loss": loss,
    }


def stop_request(config: WorkerConfig) -> str | None:
    """The reason of a pending stop request, or None. One stat per step when none is pending."""
    if not config.control_file:
        return None
    path = Path(config.control_file)
    try:
        path.stat()
    except FileNotFoundError:
        return None
    except OSError:
        # Unreachable for now (a folder on the way closed to this rank's user): no request seen; a
        # stop that cannot be read ends as a teardown instead.
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return "stop requested"
    if isinstance(data, dict) and data.get("action") == "stop":
        return str(data.get("reason") or "stop requested")
    return None
