"""The training context: what one rank of a Polychip job gets from the platform.

The step protocol (every rank, every step) that ``TrainingContext`` runs for the code that uses it:

1. ``slices()`` gives this rank's accumulation chunks ``[lo, hi)`` of the step's global batch (the
   balancer's split: uneven across unlike devices, exact for any split). The code computes the
   summed per-sample loss of each chunk and hands it to ``backward``, which scales it by ``1 / B``
   (B the global batch) and runs the backward pass; the gradients accumulate over the chunks.
2. ``step()``: the step hooks run (the local backend's device emulation pads the step here), then
   the rank takes its own time: from the step's start to after the hooks. Nothing so far waited for
   another rank, so ``samples / own time`` is this rank's own speed, not the gang's.
3. The gradients are summed over all ranks by ``runtime.comm``'s ``GradientReducer``: in buckets,
   each sent as soon as the last backward pass finished it (overlapping the rest of the backward
   pass and the hooks), hierarchically across vendor groups, under the job's compression policy.
   The last bucket carries the step's other sums (SUM over ranks, one writer per slot): the rank's
   summed loss, its samples/s at its own index, its split fingerprint (zeros elsewhere) and whether
   it was asked to stop. They are written when the last backward pass begins, so that this one
   exchange leaves while the step's tail (the hooks) still runs: a second collective after the
   hooks would wait for the slowest rank and then cost a round trip on every step. The speed it
   carries is therefore the rank's previous step's (its own time is known only after the hooks):
   the balancer decides on speeds one step old, every rank on the same ones. Each sample of the
   global batch appears in exactly one rank's chunk, so the summed gradient is ``(sum over all B
   samples of grad loss) / B``: the gradient of the global-batch mean, the same as one process on
   the whole batch, for any split and any number of chunks (exactly so with ``compression: none``).
4. The optimizer steps (the same update on every rank, so parameters stay identical), rank 0 saves
   a checkpoint when the schedule says so, and the balancer (the same on every rank, fed the same
   all-reduced speeds) may choose a new split, which all ranks take from the next step on.
5. When any rank was asked to stop (a drain, a preemption, a move), every rank saves a full
   checkpoint after the same step and ``step()`` raises ``Stopped``.

What is checkpointed: the model's weights (every save) and, in full saves, the optimizer's state
and every object given to ``prepare`` by name (anything with ``state_dict``/``load_state_dict``: a
scheduler, a data position). Checkpoints do not depend on the world size: a job saved on 3 ranks
restores on 2 or 4, on other flavors. Not restored: the balancer's split (the new devices are
measured afresh) and the compression residuals (per-rank state tied to the old layout).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from runtime.balancing import Balancer, Decision, Split
from runtime.comm.reducer import StepComm, exchange_still_running, policy_label
from runtime.comm.session import Exchange, open_exchange
from runtime.jobspec import WorkloadSpec
from runtime.recovery.checkpoint import Checkpointer
from runtime.worker.checkpointing import (
    Stopped,
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


class SdkError(RuntimeError):
    """The training code used the API out of order (e.g. ``step()`` before ``prepare``)."""


class InjectedFailure(RuntimeError):
    """Raised by ``fail_at_step``: a deliberate fault for tests of failure handling."""


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any, /) -> Any: ...


# How many user metrics one report may carry (the control plane refuses more).
MAX_METRICS = 32


class TrainingState:
    """The optimizer's state and the registered objects' states as one ``state_dict``: what a full
    checkpoint keeps beside the weights. Its state keeps the optimizer's own keys at the top (the
    checkpoint format checks them) and the registered objects under ``"registered"``."""

    def __init__(self, optimizer: torch.optim.Optimizer, registered: dict[str, Stateful]) -> None:
        self.optimizer = optimizer
        self.registered = registered

    def state_dict(self) -> dict[str, Any]:
        state = dict(self.optimizer.state_dict())
        state["registered"] = {name: obj.state_dict() for name, obj in self.registered.items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = dict(state)
        registered = state.pop("registered", {}) or {}
        self.optimizer.load_state_dict(state)
        for name, obj in self.registered.items():
            if name in registered:
                obj.load_state_dict(registered[name])


def split_fingerprint(split: Split) -> float:
    """A number that differs, with near certainty, between two different splits; exact in float32
    (below 2**24), so that a SUM all-reduce carries it unchanged from the rank that wrote it."""
    return float(zlib.crc32(json.dumps(split.to_json()).encode()) % (1 << 24))


class TrainingContext:
    """One rank's view of its job: its batch slices, the gradient step, checkpoints, metrics, stops.

    Used as a context manager; owns the process group it creates::

        with TrainingContext(config) as ctx:
            ctx.prepare(model, optimizer, scheduler=scheduler)
            for step in ctx.steps():
                inputs, targets = global_batch(step)          # the same on every rank
                for lo, hi in ctx.slices():
                    ctx.backward(loss_fn(model(inputs[lo:hi]), targets[lo:hi], reduction="sum"))
                ctx.step()
                ctx.report(lr=scheduler.get_last_lr()[0])
    """

    def __init__(
        self, config: WorkerConfig, step_hooks: Sequence[StepHook] = (), device_probe: DeviceProbe | None = None
    ) -> None:
        self.config = config
        self._hooks = tuple(step_hooks)
        self._telemetry = Telemetry(
            {"job": config.job_id, "rank": config.rank, "device_id": config.device_id, "flavor": config.flavor},
            url=config.telemetry_url,
            token=config.telemetry_token,
            file=config.telemetry_file,
            heartbeat_file=config.heartbeat_file,
            device_probe=device_probe,
        )
        self._cleanup = contextlib.ExitStack()
        self._group_ready = False
        self._started = time.monotonic()
        # Set by prepare.
        self._model: nn.Module | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._state: TrainingState | None = None
        self._exchange: Exchange | None = None
        self._checkpointer: Checkpointer | None = None
        self._balancer: Balancer | None = None
        self._rebalancer: _Rebalancer | None = None
        self._split = initial_split(config)
        self.start_step = 1
        self._restored_step = 0
        self._restore_s = 0.0
        # The step in progress.
        self._step: int | None = None
        self._step_started = 0.0
        self._chunks_done = 0
        self._loss_sum = torch.zeros(())
        self._extras_given = False  # this step's extras went with arm() (the last chunk's backward)
        self._stop_reason: str | None = None  # read when the extras were written
        self._previous_rate = 0.0  # this rank's own samples/s in its previous step (0: none yet)
        self._pending_metrics: dict[str, float] = {}
        # What step() measured, for the end of the step: its loss, its telemetry, the stop request.
        self._ended: _Ended | None = None
        self._last_step = 0
        self._totals = _CommTotals()
        self.losses: list[float] = []
        self.result: TrainResult | None = None

    # -- what the rank is ---------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self.config.rank

    @property
    def world_size(self) -> int:
        return self.config.world_size

    @property
    def is_chief(self) -> bool:
        """Rank 0: it speaks for the job (its metrics are the job's; it saves checkpoints and the model)."""
        return self.config.rank == 0

    @property
    def workload(self) -> WorkloadSpec:
        return self.config.workload

    @property
    def global_batch(self) -> int:
        return self.config.workload.global_batch

    @property
    def total_steps(self) -> int:
        return self.config.workload.steps

    @property
    def split(self) -> Split:
        """The split in force for the current step: every rank's chunks of the global batch."""
        return self._split

    # -- life of the context -------------------------------------------------------------------------

    def __enter__(self) -> TrainingContext:
        if dist.is_initialized():
            raise RuntimeError("a torch.distributed process group already exists in this process")
        # Several ranks share a few cores; intra-op threads would only fight over them.
        torch.set_num_threads(1)
        # The rank is ready (interpreter, torch and the code loaded) and about to join the
        # rendezvous: the "started" event's ts minus this is the rendezvous (bench/recovery.py).
        ready_ts = time.time()
        self._telemetry.start()
        try:
            _init_process_group(self.config)
            self._group_ready = True
            self._telemetry.emit(
                "started",
                ready_ts=round(ready_ts, 4),
                world_size=self.world_size,
                steps=self.total_steps,
                micro_batch=self.config.micro_batch,
                global_batch=self.global_batch,
                split=self._split.to_json(),
                balancing=self.config.balancing.mode if self.config.balancing is not None else "fixed",
                workload=self.workload.job_class,
            )
        except BaseException as exc:
            self._telemetry.emit("failed", error=f"{type(exc).__name__}: {exc}"[:2000])
            self._close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if exc is None:
                try:
                    self.result = self._finish()
                except BaseException as error:
                    self._telemetry.emit("failed", error=f"{type(error).__name__}: {error}"[:2000])
                    raise
                finished: dict[str, object] = {"steps": self.result.steps, "final_loss": self.result.final_loss}
                if self.result.artifact is not None:
                    finished["artifact"] = self.result.artifact
                self._telemetry.emit("finished", **finished)
            elif isinstance(exc, Stopped):
                self._telemetry.emit("stopped", reason=str(exc))
            else:
                self._telemetry.emit("failed", error=f"{type(exc).__name__}: {exc}"[:2000])
        finally:
            self._close()

    def _close(self) -> None:
        try:
            # The exchange thread first (it may still be blocked in a collective after a failure
            # mid-step), then the checkpointer's save in flight.
            self._cleanup.close()
        finally:
            # Telemetry before the group: peers blocked in a collective notice this rank's death only
            # when its group goes away, and the supervisor should see the failing rank exit first.
            self._telemetry.close()
            # Not under a gradient exchange still blocked in a collective: the process's exit takes
            # the group down with it.
            if self._group_ready and not exchange_still_running():
                with contextlib.suppress(Exception):  # must not mask the original error
                    dist.destroy_process_group()
            self._group_ready = False

    # -- set-up ------------------------------------------------------------------------------------

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, **state: Stateful) -> int:
        """Give the context what it trains and keeps: the model (its gradients go through the job's
        exchange), its optimizer, and any other state to checkpoint by name (a scheduler, a data
        position: anything with ``state_dict`` and ``load_state_dict`` whose state holds tensors,
        numbers, strings, lists and dicts). Restores the newest usable checkpoint into all of them
        and returns the first step to train (1 on a fresh start)."""
        if not self._group_ready:
            raise SdkError("prepare() is called inside `with TrainingContext(...)` (or sdk.init())")
        if self._model is not None:
            raise SdkError("prepare() is called once per run")
        for name, obj in state.items():
            if not callable(getattr(obj, "state_dict", None)) or not callable(getattr(obj, "load_state_dict", None)):
                raise SdkError(f"prepare({name}=...): needs state_dict() and load_state_dict() to be checkpointed")
        self._model = model
        self._optimizer = optimizer
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise SdkError("prepare(model): the model has no parameter that requires a gradient")
        self._state = TrainingState(optimizer, dict(state)) if optimizer is not None else None
        store = open_store_for(self.config)
        resumed = restore(self.config, store, model, self._state, self._telemetry)
        self._restored_step, self._restore_s = resumed.step, resumed.restore_s
        self._checkpointer = make_checkpointer(self.config, store, self._telemetry)
        if self._checkpointer is not None:
            self._cleanup.callback(self._checkpointer.close)
        # Every rank runs the same balancer on the same all-reduced speeds, so every rank reaches the
        # same decision without another collective; the split fingerprints in each step prove it.
        self._balancer = make_balancer(self.config)
        if self._balancer is not None and self.is_chief:
            self._rebalancer = _Rebalancer(self._balancer, self._telemetry)
        self._exchange = self._open_exchange(params)
        # Closed when the run ends, by success or failure: after a failure mid-step it stops the
        # exchange thread before the process group is torn down. Registered after the
        # checkpointer, so it runs before it.
        self._cleanup.callback(self._exchange.reducer.close)
        self.start_step = resumed.step + 1
        self._last_step = resumed.step
        return self.start_step

    def _open_exchange(self, params: Sequence[nn.Parameter]) -> Exchange:
        config = self.config
        groups = config.vendor_groups if config.vendor_groups is not None else (0,) * config.world_size
        exchange = open_exchange(
            params,
            config.comm,
            rank=config.rank,
            vendor_groups=groups,
            link=config.link,
            seed=config.workload.seed,
            extras=2 + 2 * config.world_size,  # the loss, a speed and a fingerprint per rank, the stop flag
        )
        self._telemetry.emit(
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

    # -- the loop ------------------------------------------------------------------------------------

    def steps(self) -> Iterator[int]:
        """The 1-based steps left to train: from the one after the restored checkpoint to the job's
        ``workload.steps``. Each must call ``step()``; a step ends when the code asks for the next
        one, so whatever it updates after ``step()`` (a scheduler, a data position, a report) is in
        that step's checkpoint and telemetry."""
        if self._exchange is None:
            raise SdkError("call prepare(model, optimizer) before steps()")
        for step in range(self.start_step, self.total_steps + 1):
            if self.config.fail_at_step == step:
                raise InjectedFailure(f"injected failure at step {step} (fail_at_step)")
            self._begin(step)
            yield step
            if self._ended is None:
                raise SdkError(f"step {step}: call ctx.step() once the chunks' backward passes are done")
            self._end_step()

    def _begin(self, step: int) -> None:
        if self._exchange is None:
            raise SdkError("call prepare(model, optimizer) before steps()")
        self._step = step
        self._ended = None
        self._step_started = time.monotonic()
        self._chunks_done = 0
        self._loss_sum = torch.zeros(())
        self._extras_given = False
        self._before = self._exchange.transport.counters.snapshot()
        self._exchange.reducer.begin_step()  # zeroes the gradient buckets that backward accumulates into

    def slices(self) -> list[tuple[int, int]]:
        """This rank's chunks ``[lo, hi)`` of the current step's global batch (empty ones left out).
        A rank whose device cannot hold its share in one pass gets several (gradient accumulation)."""
        return [(lo, hi) for lo, hi in self._split.slices(self.rank) if hi > lo]

    def backward(self, loss_sum: torch.Tensor) -> None:
        """The backward pass of one chunk: ``loss_sum`` is the SUM over the chunk's samples of each
        sample's loss (``reduction="sum"``), so that the step's gradient is the global batch's mean."""
        if self._step is None or self._exchange is None:
            raise SdkError("backward() belongs inside `for step in ctx.steps():`")
        if self._ended is not None:
            raise SdkError(
                f"step {self._step}: backward() after step(); the next step's chunks come with the next step"
            )
        chunks = self.slices()
        if self._chunks_done >= len(chunks):
            raise SdkError(
                f"step {self._step}: backward() called {self._chunks_done + 1} times; "
                f"this rank has {len(chunks)} chunk(s) (ctx.slices())"
            )
        if loss_sum.dim() != 0:
            raise SdkError("backward(loss_sum): give the chunk's summed loss, a scalar (reduction='sum')")
        if self._chunks_done == len(chunks) - 1:
            # This backward pass finishes the gradients: buckets may go, the last with the step's extras.
            self._exchange.reducer.arm(self._extras(self._loss_sum + loss_sum.detach()))
            self._extras_given = True
        (loss_sum / self.global_batch).backward()  # type: ignore[no-untyped-call]  # torch: no annotations
        self._loss_sum += loss_sum.detach()
        self._chunks_done += 1

    def _extras(self, loss_sum: torch.Tensor) -> torch.Tensor:
        """This rank's slots of the step's extras: the loss, its previous step's speed and its split's
        fingerprint (one writer per slot, so its sum is that rank's value on every rank), and whether
        it was asked to stop (their sum: how many were), so that every rank stops after the same step."""
        world, rank = self.world_size, self.rank
        extra = torch.zeros(2 + 2 * world, dtype=torch.float32)
        extra[0] = loss_sum
        extra[1 + rank] = self._previous_rate
        extra[1 + world + rank] = split_fingerprint(self._split)
        self._stop_reason = stop_request(self.config)
        extra[1 + 2 * world] = 1.0 if self._stop_reason is not None else 0.0
        return extra

    def step(self) -> float:
        """Exchange the gradients, step the optimizer, checkpoint, re-balance; returns the global
        batch's mean loss (the same on every rank). Raises ``Stopped`` after a full checkpoint when
        the job was asked to stop."""
        if self._step is None or self._exchange is None:
            raise SdkError("step() belongs inside `for step in ctx.steps():`, once per step")
        if self._ended is not None:
            raise SdkError(f"step {self._step}: step() was called already; once per step")
        chunks = self.slices()
        if self._chunks_done != len(chunks):
            raise SdkError(
                f"step {self._step}: backward() ran for {self._chunks_done} of this rank's {len(chunks)} chunk(s)"
            )
        step, started, world = self._step, self._step_started, self.world_size
        exchange = self._exchange
        samples = sum(hi - lo for lo, hi in chunks)
        compute_time = time.monotonic() - started
        info = StepInfo(
            step=step, total_steps=self.total_steps, samples=samples, compute_time_s=compute_time, started_at=started
        )
        for hook in self._hooks:
            hook(info)
        own_time = time.monotonic() - started
        own_rate = samples / own_time if own_time > 0 else 0.0

        # The gradients are now the sums over all ranks, and the extras' sums came with the last bucket
        # (a rank without samples never armed: its extras go now).
        comm = exchange.reducer.finish(None if self._extras_given else self._extras(self._loss_sum))
        sums = exchange.reducer.extras_sum.tolist()
        stop_reason = self._stop_reason
        if self._optimizer is not None:
            self._optimizer.step()
        moved = exchange.transport.counters.since(self._before)
        self._totals.add(comm, moved.intra_bytes, moved.cross_bytes)
        loss = float(sums[0]) / self.global_batch
        speeds = sums[1 : 1 + world]  # measured in the previous step
        fingerprints = sums[1 + world : 1 + 2 * world]
        if len(set(fingerprints)) > 1:
            raise RuntimeError(f"step {step}: the ranks disagree on the split (fingerprints {fingerprints})")
        self.losses.append(loss)

        step_split = self._split
        decision: Decision | None = None
        decide_time = 0.0
        # The speeds are the previous step's: none before this process's first step, and step 1's
        # include the rendezvous (not a speed).
        if self._balancer is not None and step > max(2, self.start_step):
            decide_started = time.monotonic()
            if self._rebalancer is not None:
                decision = self._rebalancer.observe(step, speeds)
            else:
                decision = self._balancer.observe(step, speeds)
            decide_time = time.monotonic() - decide_started
            if decision.changed:
                self._split = decision.split  # every rank takes it from the next step on
                if self._rebalancer is not None:
                    self._rebalancer.rebalanced(step, step_split, decision, decide_time)

        self._previous_rate = own_rate
        step_time = time.monotonic() - started
        fields: dict[str, Any] = {
            "step": step,
            "total_steps": self.total_steps,
            "loss": loss,
            "samples": samples,
            "chunks": len(chunks),
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
        if self.is_chief:
            fields["split"] = step_split.to_json()
            fields["global_samples_per_s"] = self.global_batch / step_time if step_time > 0 else 0.0
            if decision is not None:
                fields["predicted"] = [round(p, 3) for p in decision.predicted]
                fields["efficiency"] = round(decision.efficiency, 4)
        stop = (stop_reason or "") if sums[1 + 2 * world] > 0 else None
        self._ended = _Ended(step, loss, fields, stop)
        return loss

    def _end_step(self) -> None:
        """The step's end, once the code is done with it: checkpoint, telemetry, and the stop that
        every rank learned of in the same all-reduce."""
        ended = self._ended
        if ended is None:
            return
        self._ended, self._step, self._last_step = None, None, ended.step
        if self._checkpointer is not None and self._model is not None:
            meta = self._meta(ended.step, ended.loss)
            self._checkpointer.maybe_save(ended.step, self._model, self._state, meta)
        self._telemetry.set_progress(ended.step)
        fields = ended.fields
        if self._pending_metrics:
            fields["metrics"] = self._pending_metrics
            self._pending_metrics = {}
        self._telemetry.emit("step", **fields)
        if ended.step == self.start_step and self._restored_step > 0 and self.is_chief:
            self._telemetry.emit(
                "resumed", step=ended.step, restored_step=self._restored_step, restore_s=round(self._restore_s, 4)
            )
        if ended.stop is not None:
            self._stop_after(ended.step, ended.loss, ended.stop or None)

    def report(self, **metrics: float | torch.Tensor) -> None:
        """Named scalars for the job's charts (rank 0's are the job's; other ranks' are ignored).
        Inside a step (before or after ``step()``) they ride with its telemetry; after the loop they
        are filed under the last step."""
        if not self.is_chief or not metrics:
            return
        values: dict[str, float] = {}
        for name, value in metrics.items():
            number = float(value)
            if not math.isfinite(number):
                continue  # a NaN or an infinity is not a point on a chart
            values[name] = number
        if len(values) + len(self._pending_metrics) > MAX_METRICS:
            raise SdkError(f"report(): at most {MAX_METRICS} metrics per step")
        if self._step is not None:
            self._pending_metrics.update(values)
        elif values:
            self._telemetry.emit("metrics", step=self._last_step, metrics=values)

    def log(self, message: str) -> None:
        """A line in this rank's log (stdout), prefixed with the step: ``print`` works as well."""
        print(f"[step {self._step or self._last_step}] {message}", flush=True)  # noqa: T201

    # -- the end -------------------------------------------------------------------------------------

    def _meta(self, step: int, loss: float) -> dict[str, Any]:
        """What a checkpoint records beside the tensors: enough to check a resume and to read it later."""
        workload = self.workload
        return {
            "job_id": self.config.job_id,
            "world_size": self.world_size,
            "global_batch": workload.global_batch,
            "seed": workload.seed,
            "workload": workload.job_class,
            "hidden": workload.hidden,
            "samples_seen": step * workload.global_batch,
            "loss": loss,
        }

    def _stop_after(self, step: int, loss: float, reason: str | None) -> None:
        """Every rank saw the stop request in the same step's all-reduce: save everything, then stop."""
        checkpointer = self._checkpointer
        if checkpointer is not None and self._model is not None:
            checkpointer.wait()
            if not any(r.step == step and r.kind == "full" for r in checkpointer.records):
                checkpointer.save(step, "full", self._model, self._state, self._meta(step, loss))
            checkpointer.close()
            if not any(r.step == step and r.kind == "full" for r in checkpointer.records):
                # A stop without its checkpoint would throw work away: report it as the failure it is.
                raise RuntimeError(f"the checkpoint before stopping failed: {checkpointer.last_error}")
        # A rank that read the control file just before it appeared learned of the stop from the
        # all-reduce: the file is there now, so every rank reports the reason the stop was asked for.
        reason = reason or stop_request(self.config) or "another rank was asked to stop"
        # No barrier: the others may leave while rank 0 writes; the supervisor reports the stop only
        # once every rank has ended, none of them failed.
        raise Stopped(f"stopped after step {step} with a full checkpoint: {reason}")

    def _finish(self) -> TrainResult:
        # Code that left the loop after step() without asking for another step: end that step here
        # (its checkpoint and telemetry; a stop asked for in it still stops).
        self._end_step()
        comm_summary = self._totals.summary()
        self._telemetry.emit("comm_summary", **comm_summary)
        if self._checkpointer is not None:
            self._checkpointer.close()  # every save is on disk before the run reports success
        artifact: str | None = None
        if self.is_chief and self._model is not None:
            from runtime.worker.artifacts import save_model

            artifact = str(save_model(self._model, self.config.artifacts_dir))
        # Nobody reports "finished" before the artifact is on disk.
        dist.barrier()
        return TrainResult(
            steps=self._last_step,
            first_step=self.start_step,
            final_loss=self.losses[-1] if self.losses else float("nan"),
            losses=list(self.losses),
            artifact=artifact,
            wall_time_s=time.monotonic() - self._started,
            comm=comm_summary,
        )


@dataclass
class _Ended:
    step: int
    loss: float
    fields: dict[str, Any]
    stop: str | None  # None: go on; a reason (maybe empty): every rank stops after this step


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

    def __init__(self, balancer: Balancer, telemetry: Telemetry) -> None:
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
