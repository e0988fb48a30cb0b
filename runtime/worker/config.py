"""The worker's configuration file and the small value types its callers see.

This module imports no torch so that backends (and their supervisors) can build and validate
worker configs cheaply; the training itself lives in ``runtime.worker.train``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from runtime.balancing import Balancer, BalancerConfig, BalancingError, Split, max_micro_batch
from runtime.comm.link import LinkEmulation
from runtime.errors import FieldError
from runtime.jobspec import (
    CheckpointSpec,
    CommSpec,
    SpecError,
    WorkloadSpec,
    parse_checkpoint,
    parse_comm,
    parse_workload,
)

# The shape of the built-in synthetic-mlp task (``runtime.worker.workload`` imports these; kept here,
# free of torch, for the memory model below).
INPUT_DIM = 32
NUM_CLASSES = 10


RENDEZVOUS_MODES = ("rank0", "store_host")
# The job's ingest token, when the config file leaves it out (``load_config``).
TELEMETRY_TOKEN_ENV = "POLYCHIP_TELEMETRY_TOKEN"  # noqa: S105 (a variable name, not a secret)


class ConfigError(FieldError):
    """A worker config that cannot be used; ``field`` is the config key."""


@dataclass(frozen=True)
class StepInfo:
    """What a step hook learns after each step's forward and backward passes of this rank.

    Hooks run before any cross-rank synchronisation of the step (the gradient all-reduce), so a
    hook that stretches the step (the local backend's device emulation) stretches this rank's own
    compute, and the rank's measured speed is its own.

    ``started_at`` is a ``time.monotonic()`` reading taken when the step began, so a hook can
    tell how long the step has taken so far, including earlier hooks.
    """

    step: int  # 1-based
    total_steps: int
    samples: int  # this rank's samples in this optimizer step (all its accumulation chunks)
    compute_time_s: float  # from started_at to the end of this rank's last backward, before any sync
    started_at: float


StepHook = Callable[[StepInfo], None]
# Reads the device's health since the last call: rows of ``runtime.recovery.health.FEATURES``, one a
# minute (NVML and the like on real hardware; an emulated device on the local backend).
DeviceProbe = Callable[[], list[list[float]]]


@dataclass(frozen=True)
class TrainResult:
    steps: int
    first_step: int  # 1, or the step after the checkpoint this run resumed from
    final_loss: float  # global mean loss of the last step
    losses: list[float]  # global mean loss of every step this run took (from first_step), in order
    artifact: str | None  # path of the saved model (rank 0 only)
    wall_time_s: float
    comm: dict[str, Any] = field(default_factory=dict)  # this rank's exchange: bytes, times (runtime.comm)


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
    # Balancing (see ``initial_split``). None: the fixed split ``split`` or ``micro_batches``, never re-split.
    balancing: BalancerConfig | None = None
    scores: tuple[float, ...] | None = None  # per rank: the flavor's benchmark score (any unit, > 0)
    caps: tuple[int | None, ...] | None = None  # per rank: the most samples per micro-step (memory)
    # An explicit split with accumulation chunks (``Split.to_json``); when set, ``micro_batches`` is its per_rank.
    split: tuple[tuple[int, ...], ...] | None = None
    # How gradients travel (``runtime.comm``): the job's policy, each rank's vendor group (ranks of one
    # group share a fast link; None: all one group), and the emulated cross-group link.
    comm: CommSpec = field(default_factory=CommSpec)
    vendor_groups: tuple[int, ...] | None = None
    link: LinkEmulation = field(default_factory=LinkEmulation)
    # Recovery (``runtime.recovery``). With a checkpoint store, rank 0 saves layered checkpoints there
    # and every start first restores the newest usable one (whatever world size wrote it).
    checkpoint: CheckpointSpec | None = None
    checkpoint_url: str | None = None
    checkpoint_background: bool = True  # False: save in the training thread (for measuring the stall)
    # "rank0": rank 0 hosts the c10d store (its death takes the rendezvous down with it); "store_host":
    # a process of its own hosts it at master_addr:master_port and every rank is a client.
    rendezvous: str = "rank0"
    # Touched by the telemetry thread with every heartbeat, for a supervisor on this host to watch.
    heartbeat_file: str | None = None
    # A JSON file whose appearance asks the job to checkpoint and stop ({"action": "stop", "reason": ...}).
    control_file: str | None = None
    # python and torchrun workloads: the folder the job's bundle was unpacked into.
    code_dir: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def micro_batch(self) -> int:
        return self.micro_batches[self.rank]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        extra = data.pop("extra")
        data["micro_batches"] = list(self.micro_batches)
        data["workload"] = self.workload.to_json()
        data["balancing"] = self.balancing.to_json() if self.balancing is not None else None
        data["scores"] = list(self.scores) if self.scores is not None else None
        data["caps"] = list(self.caps) if self.caps is not None else None
        data["split"] = [list(chunk) for chunk in self.split] if self.split is not None else None
        data["comm"] = self.comm.to_json()
        data["vendor_groups"] = list(self.vendor_groups) if self.vendor_groups is not None else None
        data["link"] = self.link.to_json()
        data["checkpoint"] = self.checkpoint.to_json() if self.checkpoint is not None else None
        return {**extra, **data}


def make_balancer(config: WorkerConfig) -> Balancer | None:
    """The job's balancer (the same on every rank), or None for a fixed split."""
    if config.balancing is None:
        return None
    scores = config.scores if config.scores is not None else (1.0,) * config.world_size
    return Balancer(config.balancing, config.workload.global_batch, scores, config.caps)


def initial_split(config: WorkerConfig) -> Split:
    """The split of the first step: the balancer's (equal, or by scores), else the fixed one given."""
    balancer = make_balancer(config)
    if balancer is not None:
        return balancer.split
    chunks = config.split if config.split is not None else (config.micro_batches,)
    return Split(config.workload.global_batch, chunks)


# The memory model of the built-in synthetic MLP (32 -> hidden -> hidden -> 10, fp32, SGD with
# momentum; ``runtime.worker.workload``), for ``max_micro_batch``:
# - resident state per parameter: weights, gradients, momentum and the all-reduce's flat copy of the
#   gradient, 4 bytes each = 16 bytes (the figure ``max_micro_batch`` assumes for fp32 Adam, too);
# - activations kept per sample for the backward pass: the input, each hidden layer before and after
#   its ReLU, the logits and their softmax, in fp32, doubled for the autograd temporaries:
#   2 * 4 * (32 + 4 * hidden + 2 * 10) bytes.
ACTIVATION_OVERHEAD = 2.0


def synthetic_mlp_param_count(hidden: int) -> int:
    return INPUT_DIM * hidden + hidden + hidden * hidden + hidden + hidden * NUM_CLASSES + NUM_CLASSES


def synthetic_mlp_activation_bytes(hidden: int) -> float:
    return ACTIVATION_OVERHEAD * 4.0 * (INPUT_DIM + 4 * hidden + 2 * NUM_CLASSES)


def memory_cap(workload: WorkloadSpec, memory_gib: float | None, budget: float = 0.7) -> int | None:
    """The most samples per micro-step that fit in ``budget`` of a device's memory (None: unknown memory).

    Built-in models have a memory model (``runtime.worker.builtin.shapes``); the tenant's own code
    has none that Polychip could know, so its ranks are not capped.

    Raises ``BalancingError`` (field ``memory``) when not even one sample fits."""
    if memory_gib is None or workload.kind != "builtin":
        return None
    from runtime.worker.builtin.shapes import memory_figures

    param_count, activation_bytes = memory_figures(workload.model, workload.hidden)
    return max_micro_batch(
        memory_gib * 2**30, param_count=param_count, activation_bytes_per_sample=activation_bytes, budget=budget
    )


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
    """Factor for a rank's summed loss under DDP-style averaging over ranks (``sum_i * world_size / B``).

    The worker no longer averages: it SUM-reduces gradients of ``sum_i / B`` (``runtime.worker.train``),
    which is exact for any split and any accumulation. Kept for callers that average over ranks.
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

    balancing, scores, caps = _parse_balancing(raw, world_size)
    split = _parse_split(raw, workload.global_batch, world_size)
    micro_raw = raw.get("micro_batches")
    if balancing is not None:
        if split is not None:
            raise ConfigError("split", "give either balancing (the balancer splits) or a fixed split, not both")
        try:
            derived = Balancer(balancing, workload.global_batch, scores or (1.0,) * world_size, caps).split
        except BalancingError as exc:
            raise ConfigError(exc.field, str(exc)) from None
        micro = derived.per_rank()
        if micro_raw is not None and micro_raw != list(micro):
            raise ConfigError(
                "micro_batches", f"is {micro_raw} but balancing starts from {list(micro)}; leave micro_batches out"
            )
    elif split is not None:
        micro = tuple(sum(chunk[r] for chunk in split) for r in range(world_size))
        if micro_raw is not None and micro_raw != list(micro):
            raise ConfigError("micro_batches", f"is {micro_raw} but split gives {list(micro)}; leave one out")
    elif micro_raw is None:
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
    comm, vendor_groups, link = _parse_comm(raw, world_size)
    checkpoint = None
    if raw.get("checkpoint") is not None:
        try:
            checkpoint = parse_checkpoint(raw["checkpoint"])
        except SpecError as exc:
            raise ConfigError(exc.field, exc.message) from None
    checkpoint_url = _check_type(raw, "checkpoint_url", str, optional=True)
    checkpoint_background = _check_type(raw, "checkpoint_background", bool, optional=True)
    rendezvous = _check_type(raw, "rendezvous", str, optional=True) or "rank0"
    if rendezvous not in RENDEZVOUS_MODES:
        raise ConfigError("rendezvous", f"{rendezvous!r}; use one of {', '.join(RENDEZVOUS_MODES)}")
    heartbeat_file = _check_type(raw, "heartbeat_file", str, optional=True)
    control_file = _check_type(raw, "control_file", str, optional=True)
    code_dir = _check_type(raw, "code_dir", str, optional=True)
    if workload.kind in ("python", "torchrun") and not code_dir:
        raise ConfigError("code_dir", f"a {workload.kind} workload needs the folder its bundle was unpacked into")
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
        "balancing",
        "scores",
        "caps",
        "split",
        "comm",
        "vendor_groups",
        "link",
        "checkpoint",
        "checkpoint_url",
        "checkpoint_background",
        "rendezvous",
        "heartbeat_file",
        "control_file",
        "code_dir",
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
        balancing=balancing,
        scores=scores,
        caps=caps,
        split=split,
        comm=comm,
        vendor_groups=vendor_groups,
        link=link,
        checkpoint=checkpoint,
        checkpoint_url=checkpoint_url or None,
        checkpoint_background=checkpoint_background if checkpoint_background is not None else True,
        rendezvous=rendezvous,
        heartbeat_file=heartbeat_file or None,
        control_file=control_file or None,
        code_dir=code_dir or None,
        # Unknown keys are kept, not rejected, so a newer control plane can talk to an older worker.
        extra={k: v for k, v in raw.items() if k not in known},
    )


def _parse_balancing(
    raw: dict[str, Any], world_size: int
) -> tuple[BalancerConfig | None, tuple[float, ...] | None, tuple[int | None, ...] | None]:
    balancing: BalancerConfig | None = None
    if raw.get("balancing") is not None:
        try:
            balancing = BalancerConfig.from_json(raw["balancing"])
        except BalancingError as exc:
            raise ConfigError(exc.field, str(exc).split(": ", 1)[-1]) from None
        except TypeError as exc:  # a value of the wrong type reaching the dataclass
            raise ConfigError("balancing", f"bad value ({exc})") from None
    scores: tuple[float, ...] | None = None
    scores_raw = raw.get("scores")
    if scores_raw is not None:
        if (
            not isinstance(scores_raw, list)
            or len(scores_raw) != world_size
            or not all(
                isinstance(s, int | float) and not isinstance(s, bool) and math.isfinite(s) and s > 0
                for s in scores_raw
            )
        ):
            raise ConfigError("scores", f"expected {world_size} positive numbers, one per rank, got {scores_raw!r}")
        scores = tuple(float(s) for s in scores_raw)
    caps: tuple[int | None, ...] | None = None
    caps_raw = raw.get("caps")
    if caps_raw is not None:
        if (
            not isinstance(caps_raw, list)
            or len(caps_raw) != world_size
            or not all(c is None or (isinstance(c, int) and not isinstance(c, bool) and c >= 1) for c in caps_raw)
        ):
            raise ConfigError(
                "caps", f"expected {world_size} entries, each a whole number >= 1 or null, got {caps_raw!r}"
            )
        caps = tuple(caps_raw)
    return balancing, scores, caps


def _parse_comm(raw: dict[str, Any], world_size: int) -> tuple[CommSpec, tuple[int, ...] | None, LinkEmulation]:
    try:
        comm = parse_comm(raw.get("comm"))
    except SpecError as exc:
        raise ConfigError(exc.field, exc.message) from None
    groups_raw = raw.get("vendor_groups")
    vendor_groups: tuple[int, ...] | None = None
    if groups_raw is not None:
        if (
            not isinstance(groups_raw, list)
            or len(groups_raw) != world_size
            or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in groups_raw)
        ):
            raise ConfigError(
                "vendor_groups", f"expected {world_size} whole numbers >= 0, one group per rank, got {groups_raw!r}"
            )
        vendor_groups = tuple(groups_raw)
    try:
        link = LinkEmulation.from_json(raw.get("link"))
    except ValueError as exc:
        raise ConfigError("link", str(exc)) from None
    return comm, vendor_groups, link


def _parse_split(raw: dict[str, Any], global_batch: int, world_size: int) -> tuple[tuple[int, ...], ...] | None:
    if raw.get("split") is None:
        return None
    try:
        split = Split.from_json(global_batch, raw["split"])
    except BalancingError as exc:
        raise ConfigError("split", str(exc).split(": ", 1)[-1]) from None
    if split.world_size != world_size:
        raise ConfigError("split", f"has {split.world_size} entries per chunk; give world_size ({world_size})")
    return split.chunks


def load_config(path: str | Path) -> WorkerConfig:
    """A rank's config from its file. A file with ``"shared": NAME`` holds only what is its own rank's: the
    rest is in NAME, beside it (one file for what every rank shares: a Kubernetes ConfigMap stays small)."""
    try:
        raw = json.loads(Path(path).read_text())
        if isinstance(raw, dict) and "shared" in raw:
            shared_name = raw.pop("shared")
            if not isinstance(shared_name, str) or Path(shared_name).name != shared_name:
                raise ConfigError("shared", f"{shared_name!r}; give the name of a file beside {path}")
            shared = json.loads((Path(path).parent / shared_name).read_text())
            if not isinstance(shared, dict):
                raise ConfigError("shared", f"{shared_name} holds no mapping of settings")
            raw = {**shared, **raw}
    except json.JSONDecodeError as exc:
        raise ConfigError("config", f"{path} is not valid JSON ({exc})") from None
    if isinstance(raw, dict) and not raw.get("telemetry_token") and os.environ.get(TELEMETRY_TOKEN_ENV):
        # Where the config file is shared (a Kubernetes ConfigMap), the token comes apart, from a Secret.
        raw["telemetry_token"] = os.environ[TELEMETRY_TOKEN_ENV]
    return parse_config(raw)
