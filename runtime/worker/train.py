"""The training loop of one rank: gloo process group, an explicit synchronous step, exact loss scaling.

The step protocol (every rank, every step):

1. For each accumulation chunk ``a`` of the current split, forward and backward on the rank's slice
   ``[lo, hi)`` of the global batch with the summed per-sample loss scaled by ``1 / B`` (B the global
   batch); the gradients accumulate over the chunks.
2. The step hooks run (the local backend's device emulation pads the step here), then the rank takes
   its own time: from the step's start to after the hooks. Nothing so far waited for another rank,
   so ``samples / own time`` is this rank's own speed, not the gang's.
3. The gradients are summed over all ranks by ``runtime.comm``'s ``GradientReducer``: in buckets, each
   sent as soon as the last backward pass finished it (overlapping the rest of the backward pass and
   the hooks), hierarchically across vendor groups, under the job's compression policy. Then one
   small SUM all-reduce of the rank's summed loss, its samples/s at its own index and its split
   fingerprint (zeros elsewhere). Each sample of the global batch appears in exactly one rank's
   chunk, so the summed gradient is ``(sum over all B samples of grad loss) / B``: the gradient of the
   global-batch mean, the same as one process on the whole batch, for any split and any number of
   chunks (exactly so with ``compression: none``). Every rank learns the global loss and everyone's
   speed from the same collective.
4. The optimizer steps (the same update on every rank, so parameters stay identical).
5. On a check step (every step after the first, when the job balances), rank 0 gives the speeds to
   its ``Balancer`` and broadcasts ``[changed, accumulation]``; when the split changed it then
   broadcasts the new split (an int tensor, accumulation x world_size). All ranks switch at the next
   step, so every step's split covers the global batch exactly once.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import zlib
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from runtime.balancing import Balancer, Decision, Split
from runtime.comm.collectives import ring_allreduce
from runtime.comm.reducer import StepComm, exchange_still_running, policy_label
from runtime.comm.session import Exchange, open_exchange
from runtime.recovery.checkpoint import Checkpointer
from runtime.worker.checkpointing import (
    Stopped,
    checkpoint_meta,
    make_checkpointer,
    open_store_for,
    restore,
    stop_request,
)
from runtime.worker.config import (
    DeviceProbe,
    StepHook,
    StepInfo,
    TrainResult,
    WorkerConfig,
    initial_split,
    make_balancer,
)
from runtime.worker.telemetry import Telemetry
from runtime.worker.workload import SyntheticDataset, build_student, make_optimizer

ARTIFACT_NAME = "model.pt"


class InjectedFailure(RuntimeError):
    """Raised by ``fail_at_step``: a deliberate fault for tests of failure handling."""


def run(
    config: WorkerConfig, step_hooks: Sequence[StepHook] = (), device_probe: DeviceProbe | None = None
) -> TrainResult:
    """Train this rank to the end; rank 0 saves the model. Owns the process group it creates.

    ``device_probe`` reads the device's health (its rows ride on the heartbeats)."""
    if config.workload.kind != "builtin" or config.workload.model != "synthetic-mlp":
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
        heartbeat_file=config.heartbeat_file,
        device_probe=device_probe,
    )
    telemetry.start()
    group_ready = False
    try:
        _init_process_group(config)
        group_ready = True
        telemetry.emit(
            "started",
            world_size=config.world_size,
            steps=config.workload.steps,
            micro_batch=config.micro_batch,
            global_batch=config.workload.global_batch,
            split=initial_split(config).to_json(),
            balancing=config.balancing.mode if config.balancing is not None else "fixed",
        )
        with contextlib.ExitStack() as cleanup:
            result = _train(config, step_hooks, telemetry, cleanup)
        finished: dict[str, object] = {"steps": result.steps, "final_loss": result.final_loss}
        if result.artifact is not None:
            finished["artifact"] = result.artifact
        telemetry.emit("finished", **finished)
        return result
    except Stopped as exc:
        telemetry.emit("stopped", reason=str(exc))
        raise
    except BaseException as exc:
        telemetry.emit("failed", error=f"{type(exc).__name__}: {exc}"[:2000])
        raise
    finally:
        # Telemetry first: peers blocked in a collective notice this rank's death only when its
        # group goes away, and the supervisor should see the failing rank exit before its victims.
        telemetry.close()
        # Not under a gradient exchange still blocked in a collective (a failure mid-step whose peers
        # never answered): the process's exit takes the group down with it.
        if group_ready and not exchange_still_running():
            # Tearing down after a failure must not mask the original error.
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


def _init_process_group(config: WorkerConfig) -> None:
    timeout = timedelta(seconds=config.collective_timeout_s)
    if config.rendezvous == "store_host":
        # The store lives in a process of its own (runtime.recovery.storehost): every rank is a
        # client, so no rank's death takes the rendezvous down.
        store = dist.TCPStore(config.master_addr, config.master_port, world_size=None, is_master=False, timeout=timeout)
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(config.job_id, store),
            rank=config.rank,
            world_size=config.world_size,
            timeout=timeout,
        )
        return
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{config.master_addr}:{config.master_port}",
        rank=config.rank,
        world_size=config.world_size,
        timeout=timeout,
    )


class _Rebalancer:
    """Rank 0's side of re-balancing: the Balancer, drift bookkeeping and what goes to telemetry."""

    def __init__(self, config: WorkerConfig, balancer: Balancer, telemetry: Telemetry) -> None:
        self.config = config
        self.balancer = balancer
        self.telemetry = telemetry
        self.drift_since: int | None = None
        self.stragglers: set[int] = set()
        self.rebalances = 0

    def observe(self, step: int, speeds: list[float]) -> Decision:
        decision = self.balancer.observe(step, speeds)
        # Drift bookkeeping for "steps_since_drift": the first check of the current run of checks on
        # which a re-split would have paid (the Balancer says "balanced ..." when it would not).
        if not decision.changed:
            if decision.drifting == 0:
                self.drift_since = None
            elif self.drift_since is None:
                self.drift_since = step
        self._report_stragglers(step, decision)
        return decision

    def _report_stragglers(self, step: int, decision: Decision) -> None:
        now = set(decision.stragglers)
        for rank in sorted(now - self.stragglers):
            expected = self.balancer.promised(rank)
            self.telemetry.emit(
                "straggler",
                step=step,
                straggler_rank=rank,
                measured_samples_per_s=round(decision.predicted[rank], 3),
                expected_samples_per_s=round(expected, 3),
            )
        self.stragglers = now

    def rebalanced(self, step: int, old: Split, decision: Decision, cost_s: float) -> None:
        self.rebalances += 1
        since = step - self.drift_since + 1 if self.drift_since is not None else 1
        self.drift_since = None
        self.telemetry.emit(
            "rebalanced",
            step=step,
            old_split=old.to_json(),
            new_split=decision.split.to_json(),
            reason=decision.reason,
            steps_since_drift=since,
            rebalances=self.rebalances,
            cost_s=round(cost_s, 6),
        )


def split_fingerprint(split: Split) -> float:
    """A number that differs, with near certainty, between two different splits; exact in float32
    (below 2**24), so that a SUM all-reduce carries it unchanged from the rank that wrote it."""
    return float(zlib.crc32(json.dumps(split.to_json()).encode()) % (1 << 24))


def _train(
    config: WorkerConfig, step_hooks: Sequence[StepHook], telemetry: Telemetry, cleanup: contextlib.ExitStack
) -> TrainResult:
    spec = config.workload
    started = time.monotonic()
    dataset = SyntheticDataset(spec.seed, spec.global_batch)
    # Every rank builds the same initial weights from the seed, and every rank applies the same
    # all-reduced gradient, so the replicas stay identical without DDP.
    model = build_student(spec.hidden, spec.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(params, spec.lr)
    store = open_store_for(config)
    resumed = restore(config, store, model, optimizer, telemetry)
    checkpointer = make_checkpointer(config, store, telemetry)
    if checkpointer is not None:
        # Registered before the exchange's close, so it runs after it: an in-flight save completes.
        cleanup.callback(checkpointer.close)
    split = initial_split(config)
    # Every rank runs the same balancer on the same all-reduced speeds, so every rank reaches the same
    # decision without another collective; the split fingerprints in the next all-reduce prove it.
    balancer = make_balancer(config)
    rebalancer = _Rebalancer(config, balancer, telemetry) if balancer is not None and config.rank == 0 else None
    scale = 1.0 / spec.global_batch
    world = config.world_size
    losses: list[float] = []
    exchange = _open_exchange(config, params, telemetry)
    # Closed when _train ends, by success or failure: after a failure mid-step it stops the exchange
    # thread before the process group is torn down.
    cleanup.callback(exchange.reducer.close)
    transport = exchange.transport
    totals = _CommTotals()

    first_step = resumed.step + 1
    for step in range(first_step, spec.steps + 1):
        step_started = time.monotonic()
        if config.fail_at_step == step:
            raise InjectedFailure(f"injected failure at step {step} (fail_at_step)")
        inputs, labels = dataset.global_batch_at(step - 1)
        before = transport.counters.snapshot()
        exchange.reducer.begin_step()  # zeroes the gradient buckets that backward accumulates into
        loss_sum = torch.zeros(())
        slices = split.slices(config.rank)
        last_chunk = max((i for i, (lo, hi) in enumerate(slices) if hi > lo), default=-1)
        for i, (lo, hi) in enumerate(slices):
            if hi == lo:
                continue
            if i == last_chunk:
                exchange.reducer.arm()  # this backward pass finishes the gradients: buckets may go
            chunk_loss = F.cross_entropy(model(inputs[lo:hi]), labels[lo:hi], reduction="sum")
            (chunk_loss * scale).backward()  # type: ignore[no-untyped-call]  # torch: no annotations
            loss_sum += chunk_loss.detach()
        samples = sum(hi - lo for lo, hi in slices)
        compute_time = time.monotonic() - step_started
        info = StepInfo(
            step=step, total_steps=spec.steps, samples=samples, compute_time_s=compute_time, started_at=step_started
        )
        for hook in step_hooks:
            hook(info)
        own_time = time.monotonic() - step_started
        own_rate = samples / own_time if own_time > 0 else 0.0

        comm = exchange.reducer.finish()  # the gradients are now the sums over all ranks
        # The loss, everyone's own speed and split fingerprint. Each speed and fingerprint slot has
        # one writer, so its sum is that rank's value on every rank.
        # The last slot: how many ranks were asked to stop (a drain, a preemption), so that every
        # rank stops after the same step.
        extra = torch.zeros(2 + 2 * world, dtype=torch.float32)
        extra[0] = loss_sum
        extra[1 + config.rank] = own_rate
        extra[1 + world + config.rank] = split_fingerprint(split)
        stop_reason = stop_request(config)
        extra[1 + 2 * world] = 1.0 if stop_reason is not None else 0.0
        sums = ring_allreduce(transport, exchange.all_ranks(), extra).tolist()
        optimizer.step()
        moved = transport.counters.since(before)
        totals.add(comm, moved.intra_bytes, moved.cross_bytes)
        loss = sums[0] / spec.global_batch
        speeds = sums[1 : 1 + world]
        if len(set(sums[1 + world : 1 + 2 * world])) > 1:
            fingerprints = sums[1 + world : 1 + 2 * world]
            raise RuntimeError(f"step {step}: the ranks disagree on the split (fingerprints {fingerprints})")
        losses.append(loss)
        if checkpointer is not None:
            checkpointer.maybe_save(
                step, model, optimizer, checkpoint_meta(config, step, dataset.batches_per_epoch, loss)
            )

        step_split = split
        decision: Decision | None = None
        decide_time = 0.0
        if balancer is not None and step > 1:  # step 1 includes the rendezvous and first calls: not a speed
            decide_started = time.monotonic()
            decision = rebalancer.observe(step, speeds) if rebalancer is not None else balancer.observe(step, speeds)
            decide_time = time.monotonic() - decide_started
            if decision.changed:
                split = decision.split
                if rebalancer is not None:
                    rebalancer.rebalanced(step, step_split, decision, decide_time)

        step_time = time.monotonic() - step_started
        telemetry.set_progress(step)
        fields: dict[str, Any] = {
            "step": step,
            "total_steps": spec.steps,
            "loss": loss,
            "samples": samples,
            "chunks": sum(1 for lo, hi in slices if hi > lo),
            "step_time_s": step_time,
            "compute_time_s": compute_time,
            "own_time_s": own_time,
            "samples_per_s": own_rate,
            "comm_bytes_intra": moved.intra_bytes,
            "comm_bytes_cross": moved.cross_bytes,
            "collective_s": comm.collective_s,
            "exposed_s": comm.exposed_s,
            "hidden_share": round(comm.hidden_share, 4),
        }
        if config.rank == 0:
            fields["split"] = step_split.to_json()
            fields["global_samples_per_s"] = spec.global_batch / step_time if step_time > 0 else 0.0
            if decision is not None:
                fields["predicted"] = [round(p, 3) for p in decision.predicted]
                fields["efficiency"] = round(decision.efficiency, 4)
        telemetry.emit("step", **fields)
        if step == first_step and resumed.step > 0 and config.rank == 0:
            telemetry.emit("resumed", step=step, restored_step=resumed.step, restore_s=round(resumed.restore_s, 4))
        if sums[1 + 2 * world] > 0:
            _stop_after(config, step, checkpointer, model, optimizer, dataset, loss, stop_reason)

    comm_summary = totals.summary()
    telemetry.emit("comm_summary", **comm_summary)
    if checkpointer is not None:
        checkpointer.close()  # every save is on disk before the run reports success
    artifact: str | None = None
    if config.rank == 0:
        artifact = str(save_model(model, Path(config.artifacts_dir)))
    # Nobody reports "finished" before the artifact is on disk.
    dist.barrier()
    return TrainResult(
        steps=spec.steps,
        first_step=first_step,
        final_loss=losses[-1] if losses else float("nan"),
        losses=losses,
        artifact=artifact,
        wall_time_s=time.monotonic() - started,
        comm=comm_summary,
    )


def _stop_after(
    config: WorkerConfig,
    step: int,
    checkpointer: Checkpointer | None,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    dataset: SyntheticDataset,
    loss: float,
    reason: str | None,
) -> NoReturn:
    """Every rank saw the stop request in the same step's all-reduce: save everything, then stop."""
    if checkpointer is not None:
        checkpointer.wait()
        if not any(r.step == step and r.kind == "full" for r in checkpointer.records):
            meta = checkpoint_meta(config, step, dataset.batches_per_epoch, loss)
            checkpointer.save(step, "full", model, optimizer, meta)
        checkpointer.close()
        if not any(r.step == step and r.kind == "full" for r in checkpointer.records):
            # A stop without its checkpoint would throw work away: report it as the failure it is.
            raise RuntimeError(f"the checkpoint before stopping failed: {checkpointer.last_error}")
    # A rank that read the control file just before it appeared learned of the stop from the all-reduce:
    # the file is there now, so every rank reports the reason the stop was asked for.
    reason = reason or stop_request(config) or "another rank was asked to stop"
    # No barrier: the other ranks may leave while rank 0 writes (however long that takes); the
    # supervisor reports the stop only once every rank has ended, none of them failed.
    raise Stopped(f"stopped after step {step} with a full checkpoint: {reason}")


class _CommTotals:
    """This rank's exchange over the run, for the ``comm_summary`` event and ``TrainResult.comm``."""

    def __init__(self) -> None:
        self.steps = 0
        self.bytes_intra = 0
        self.bytes_cross = 0
        self.time = StepComm()  # the run's collective and exposed seconds, summed

    def add(self, comm: StepComm, bytes_intra: int, bytes_cross: int) -> None:
        self.steps += 1
        self.bytes_intra += bytes_intra
        self.bytes_cross += bytes_cross
        self.time.collective_s += comm.collective_s
        self.time.exposed_s += comm.exposed_s

    def summary(self) -> dict[str, Any]:
        steps = max(1, self.steps)
        return {
            "steps": self.steps,
            "bytes_intra_per_step": self.bytes_intra / steps,
            "bytes_cross_per_step": self.bytes_cross / steps,
            "collective_s_per_step": self.time.collective_s / steps,
            "exposed_s_per_step": self.time.exposed_s / steps,
            "hidden_share": round(self.time.hidden_share, 4),
        }


def _open_exchange(config: WorkerConfig, params: Sequence[nn.Parameter], telemetry: Telemetry) -> Exchange:
    groups = config.vendor_groups if config.vendor_groups is not None else (0,) * config.world_size
    exchange = open_exchange(
        params, config.comm, rank=config.rank, vendor_groups=groups, link=config.link, seed=config.workload.seed
    )
    telemetry.emit(
        "comm",
        policy=policy_label(exchange.plan),
        compression=exchange.plan.compression,
        reason=exchange.reason,
        hierarchical=exchange.reducer.layout.hierarchical,
        groups=[list(g) for g in exchange.reducer.layout.groups],
        buckets=len(exchange.reducer.buckets),
        overlap=exchange.plan.overlap,
        link=config.link.to_json(),
        link_gbit_measured=exchange.link_gbit_measured,
    )
    return exchange


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
