"""Polychip's built-in models, each a ``BuiltinTask`` (``runtime.worker.builtin.base``).

- ``synthetic-mlp``: a teacher-student MLP on data made up from the seed (``synthetic``).
- ``charlm``: a byte-level transformer language model on the Python standard library's source
  (``charlm``).
- ``digits-cnn``: a small CNN on scikit-learn's bundled 8x8 digits (``digits``).

Everything a task reads ships with the installed packages; nothing is downloaded. Importing this
package does not import torch; ``make_task`` does. The defaults that make each model learn (steps,
global batch, learning rate, width) are ``runtime.jobspec.BUILTIN_MODELS``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.jobspec import WorkloadSpec

if TYPE_CHECKING:
    from runtime.worker.builtin.base import BuiltinTask

MODELS = ("synthetic-mlp", "charlm", "digits-cnn")


def make_task(workload: WorkloadSpec) -> BuiltinTask:
    """The task of ``workload.model``; ValueError (naming the choices) for anything else."""
    if workload.kind != "builtin":
        raise ValueError(f"workload kind {workload.kind!r} is not a built-in model")
    if workload.model == "synthetic-mlp":
        from runtime.worker.builtin.synthetic import SyntheticMlpTask

        return SyntheticMlpTask(workload)
    if workload.model == "charlm":
        from runtime.worker.builtin.charlm import CharLmTask

        return CharLmTask(workload)
    if workload.model == "digits-cnn":
        from runtime.worker.builtin.digits import DigitsCnnTask

        return DigitsCnnTask(workload)
    raise ValueError(f"{workload.model!r} is not a built-in model; use one of {', '.join(MODELS)}")


__all__ = ["MODELS", "make_task"]  # the protocol: runtime.worker.builtin.base.BuiltinTask
