"""The training entrypoint that each device runs: ``python -m runtime.worker --config PATH``.

Importing this package does not import torch; ``run`` does, on first call.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.worker.config import (
    ConfigError,
    StepHook,
    StepInfo,
    TrainResult,
    WorkerConfig,
    equal_split,
    load_config,
    loss_scale,
    parse_config,
    slice_bounds,
)


def run(config: WorkerConfig, step_hooks: Sequence[StepHook] = ()) -> TrainResult:
    """Train one rank (see ``runtime.worker.train.run``); hooks run after each optimizer step."""
    from runtime.worker.train import run as _run

    return _run(config, step_hooks)


__all__ = [
    "ConfigError",
    "StepHook",
    "StepInfo",
    "TrainResult",
    "WorkerConfig",
    "equal_split",
    "load_config",
    "loss_scale",
    "parse_config",
    "run",
    "slice_bounds",
]
