"""The worker's configuration file and the small value types its callers see.

This module imports no torch so that backends (and their supervisors) can build and validate
worker configs cheaply; the training itself lives in ``runtime.worker.train``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from runtime.errors import FieldError
from runtime.jobspec import SpecError, WorkloadSpec, parse_workload


class ConfigError(FieldError):
    """A worker config that cannot be used; ``field`` is the config key."""


@dataclass(frozen=True)
class StepInfo:
    """What a step hook learns after each optimizer step.

    ``started_at`` is a ``time.monotonic()`` reading taken when the step began, so a hook can
    tell how long the step has taken so far, including earlier hooks.
    """

    step: int  # 1-based
    total_steps: int
    samples: int  # this rank's micro-batch
    compute_time_s: float  # from started_at to the end of the optimizer step
    started_at: float


StepHook = Callable[[StepInfo], None]


@dataclass(frozen=True)
class TrainResult:
    steps: int
    final_loss: float  # global mean loss of the last step
    losses: list[float]  # global mean loss of every step, in order
    artifact: str | None  # path of the saved model (rank 0 only)
    wall_time_s: float


@dataclass(frozen=True)
class WorkerConfig:
    job_id: str
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    flavor: str
    device_id: str
    workload: WorkloadSpec
    micro_batches: tuple[int, ...]
    artifacts_dir: str
    telemetry_url: str | None = None
    telemetry_token: str = ""
    telemetry_file: str | None = None
    # Fault injection for tests: raise at the start of this 1-based step.
    fail_at_step: int | None = None
    # Bounds how long a rank waits for its peers (rendezvous and each collective).
    collective_timeout_s: float = 300.0
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def micro_batch(self) -> int:
        return self.micro_batches[self.rank]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        extra = data.pop("extra")
        data["micro_batches"] = list(self.micro_batches)
        return {**extra, **data}


def equal_split(global_batch: int, world_size: int) -> tuple[int, ...]:
    """Split a global batch as evenly as possible; the first ``global_batch % world_size`` ranks get one more."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if global_batch < 0:
        raise ValueError(f"global_batch must be >= 0, got {global_batch}")
    base, extra = divmod(global_batch, world_size)
    return tuple(base + (1 if i < extra else 0) for i in range(world_size))


def slice_bounds(micro_batches: Sequence[int], rank: int) -> tuple[int, int]:
    """The half-open range [lo, hi) of the global batch that ``rank`` trains on.

    Ranks take consecutive slices, so the slices are disjoint and together cover the global batch.
    """
    if not 0 <= rank < len(micro_batches):
        raise ValueError(f"rank {rank} is outside 0..{len(micro_batches) - 1}")
    lo = sum(micro_batches[:rank])
    return lo, lo + micro_batches[rank]


def loss_scale(world_size: int, global_batch: int) -> float:
    """Factor for a rank's summed loss so that DDP's average over ranks is the global-batch mean.

    Rank i back-propagates ``sum_i * world_size / B``; DDP divides the summed gradients by world_size,
    leaving ``(sum over all B samples) / B`` whatever the split.
    """
    return world_size / global_batch


_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "job_id": str,
    "rank": int,
    "world_size": int,
    "master_addr": str,
    "master_port": int,
    "flavor": str,
    "device_id": str,
    "workload": dict,
    "artifacts_dir": str,
}


def _check_type(raw: dict[str, Any], key: str, kind: type | tuple[type, ...], optional: bool = False) -> Any:
    value = raw.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) and kind is int:
        raise ConfigError(key, f"expected a whole number, got {value!r}")
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ConfigError(key, f"expected {names}, got {value!r}")
    return value


def parse_config(raw: Any) -> WorkerConfig:
    """Validate a worker config mapping (the JSON file's content)."""
    if not isinstance(raw, dict):
        raise ConfigError("config", "expected a JSON object")
    for key, kind in _REQUIRED.items():
        if key not in raw:
            raise ConfigError(key, "missing; every worker config needs it")
        _check_type(raw, key, kind)
    if not raw["job_id"]:
        raise ConfigError("job_id", "must not be empty")
    world_size: int = raw["world_size"]
    rank: int = raw["rank"]
    if world_size < 1:
        raise ConfigError("world_size", f"must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ConfigError("rank", f"must be between 0 and world_size - 1 ({world_size - 1}), got {rank}")
    if not 1 <= raw["master_port"] <= 65535:
        raise ConfigError("master_port", f"must be a TCP port (1..65535), got {raw['master_port']}")
    try:
        workload = parse_workload(raw["workload"])
    except SpecError as exc:
        raise ConfigError(exc.field, exc.message) from None

    micro_raw = raw.get("micro_batches")
    if micro_raw is None:
        micro = equal_split(workload.global_batch, world_size)
    else:
        if not isinstance(micro_raw, list) or not all(
            isinstance(b, int) and not isinstance(b, bool) for b in micro_raw
        ):
            raise ConfigError("micro_batches", "expected a list of whole numbers, one per rank")
        micro = tuple(micro_raw)
        if len(micro) != world_size:
            raise ConfigError("micro_batches", f"has {len(micro)} entries; give exactly world_size ({world_size})")
        if any(b < 0 for b in micro):
            raise ConfigError("micro_batches", f"entries must be >= 0, got {list(micro)}")
        if sum(micro) != workload.global_batch:
            raise ConfigError(
                "micro_batches",
                f"sum to {sum(micro)}; they must sum to workload.global_batch ({workload.global_batch})",
            )

    telemetry_url = _check_type(raw, "telemetry_url", str, optional=True)
    telemetry_token = _check_type(raw, "telemetry_token", str, optional=True) or ""
    telemetry_file = _check_type(raw, "telemetry_file", str, optional=True)
    fail_at_step = _check_type(raw, "fail_at_step", int, optional=True)
    timeout = _check_type(raw, "collective_timeout_s", (int, float), optional=True)
    if timeout is not None and (isinstance(timeout, bool) or timeout <= 0):
        raise ConfigError("collective_timeout_s", f"must be a positive number of seconds, got {timeout!r}")
    known = set(_REQUIRED) | {
        "micro_batches",
        "telemetry_url",
        "telemetry_token",
        "telemetry_file",
        "fail_at_step",
        "collective_timeout_s",
    }
    return WorkerConfig(
        job_id=raw["job_id"],
        rank=rank,
        world_size=world_size,
        master_addr=raw["master_addr"],
        master_port=raw["master_port"],
        flavor=raw["flavor"],
        device_id=raw["device_id"],
        workload=workload,
        micro_batches=micro,
        artifacts_dir=raw["artifacts_dir"],
        telemetry_url=telemetry_url or None,
        telemetry_token=telemetry_token,
        telemetry_file=telemetry_file or None,
        fail_at_step=fail_at_step,
        collective_timeout_s=float(timeout) if timeout is not None else 300.0,
        # Unknown keys are kept, not rejected, so a newer control plane can talk to an older worker.
        extra={k: v for k, v in raw.items() if k not in known},
    )


def load_config(path: str | Path) -> WorkerConfig:
    try:
        raw = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError("config", f"{path} is not valid JSON ({exc})") from None
    return parse_config(raw)
