"""Polychip's training API: what a rank of a job gets from the platform, for any PyTorch code.

    from runtime import sdk

    with sdk.init() as ctx:
        model, optimizer = build()                      # the same initial weights on every rank
        ctx.prepare(model, optimizer, scheduler=sched)  # restores the newest checkpoint, if any
        for step in ctx.steps():                        # from the restored step on
            inputs, targets = global_batch(step)        # the same global batch on every rank
            for lo, hi in ctx.slices():                 # this rank's share, uneven across chips
                ctx.backward(F.cross_entropy(model(inputs[lo:hi]), targets[lo:hi], reduction="sum"))
            loss = ctx.step()                           # exchange, optimizer step, checkpoint, balance
            ctx.report(lr=sched.get_last_lr()[0])       # any named scalar, for the job's charts

A job of kind ``python`` runs such code from its bundle; the built-in models use the same API. Run
outside Polychip (``python train.py`` on a laptop), ``init`` gives a one-process context with the
defaults it is given, so the same script can be tried before it is submitted.
See ``runtime/sdk/README.md`` for the whole contract.
"""

from __future__ import annotations

from runtime.sdk.launch import current_context, init

__all__ = ["SdkError", "Stopped", "TrainingContext", "current_context", "init"]


def __getattr__(name: str) -> object:
    # The context pulls in torch; ``from runtime.sdk import init`` alone should not pay for it twice.
    if name in ("TrainingContext", "SdkError"):
        from runtime.sdk import context

        return getattr(context, name)
    if name == "Stopped":
        from runtime.worker.checkpointing import Stopped

        return Stopped
    raise AttributeError(name)
