"""What one rank runs: a built-in model through the training API, or the tenant's own code.

The built-in models are one user of ``runtime.sdk`` among others: the same context that a tenant's
``python`` job gets (its slices of the global batch, the gradient exchange, checkpoints, metrics,
stops) trains them; see ``runtime.sdk.context`` for the step protocol and why it is exact for any
split. A ``python`` job runs its entrypoint with that API (``runtime.sdk.launch.run_python``); a
``torchrun`` job runs its script with torchrun's environment (``run_torchrun``).
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.sdk.context import InjectedFailure, TrainingContext, split_fingerprint
from runtime.sdk.launch import run_python, run_torchrun
from runtime.worker.artifacts import ARTIFACT_NAME, save_model
from runtime.worker.config import DeviceProbe, StepHook, TrainResult, WorkerConfig

__all__ = ["ARTIFACT_NAME", "InjectedFailure", "run", "save_model", "split_fingerprint"]


def run(
    config: WorkerConfig, step_hooks: Sequence[StepHook] = (), device_probe: DeviceProbe | None = None
) -> TrainResult:
    """Train this rank to the end; rank 0 saves the model. ``device_probe`` reads the device's health
    (its rows ride on the heartbeats)."""
    kind = config.workload.kind
    if kind == "builtin":
        return run_builtin(config, step_hooks, device_probe)
    if kind == "python":
        return run_python(config, step_hooks, device_probe)
    if kind == "torchrun":
        return run_torchrun(config, device_probe)
    raise ValueError(
        f"workload.kind {kind!r} does not run on this worker (container images need the Kubernetes backend)"
    )


def run_builtin(
    config: WorkerConfig, step_hooks: Sequence[StepHook] = (), device_probe: DeviceProbe | None = None
) -> TrainResult:
    from runtime.worker.builtin import make_task

    task = make_task(config.workload)
    with TrainingContext(config, step_hooks, device_probe) as ctx:
        # Every rank builds the same initial weights from the seed and applies the same all-reduced
        # gradient, so the replicas stay identical without DDP.
        model = task.build_model()
        optimizer = task.make_optimizer([p for p in model.parameters() if p.requires_grad])
        ctx.prepare(model, optimizer)
        for step in ctx.steps():
            # The data order is a function of the step alone: a resumed run continues with the
            # global batch after the checkpoint's, whatever its new split.
            inputs, targets = task.global_batch_at(step - 1)
            for lo, hi in ctx.slices():
                ctx.backward(task.loss_sum(model, inputs[lo:hi], targets[lo:hi]))
            ctx.step()
            if ctx.is_chief and (step % task.eval_every == 0 or step == ctx.total_steps):
                ctx.report(**task.evaluate(model))
    if ctx.result is None:  # not reached: a context that left without an error has its result
        raise RuntimeError("the training context ended without a result")
    return ctx.result
