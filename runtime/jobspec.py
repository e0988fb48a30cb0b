"""The job spec: what a tenant asks for, as JSON over REST or YAML from the CLI.

Parsing is pure: ``parse_job_spec`` turns a mapping into a frozen ``JobSpec`` or raises
``SpecErrors``: every problem of the spec at once, each naming its field (dotted path) and how to fix
it, an unknown key with the known one it most looks like. What a field may hold is written once, in the
dataclasses below (types, defaults), ``BOUNDS`` and ``CHOICES``: the parser checks against them and
``job_spec_schema`` describes them as JSON Schema for the API's schema, the CLI and editors.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, asdict, dataclass, field, replace
from typing import Any, TypeVar

from runtime.errors import FieldError

# What a job runs: a built-in model, the tenant's own Python code using the training API
# (``runtime.sdk``), an unmodified torchrun script, or a container image (Kubernetes backend only).
WORKLOAD_KINDS = ("builtin", "python", "torchrun", "container")
# The kind every spec stored before there were kinds named: today's builtin synthetic MLP.
LEGACY_KINDS = {"synthetic-mlp": "synthetic-mlp"}
# The built-in models and the defaults that make each learn (``runtime.worker.builtin``): steps,
# global batch, learning rate, width. A spec's own values win.
BUILTIN_MODELS: dict[str, dict[str, Any]] = {
    "synthetic-mlp": {"steps": 200, "global_batch": 96, "lr": 0.05, "hidden": 64},
    "charlm": {"steps": 150, "global_batch": 32, "lr": 0.003, "hidden": 64},
    "digits-cnn": {"steps": 100, "global_batch": 64, "lr": 0.01, "hidden": 32},
}
# Names a job's ``env`` may not set: the launch contract (torchrun's variables, Polychip's own) and
# what changes how the interpreter or the loader starts.
RESERVED_ENV = frozenset(
    {
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "HOME",
        "PATH",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
    }
)
RESERVED_ENV_PREFIXES = ("POLYCHIP_", "TORCHELASTIC_", "GLOO_")
MAX_ARGS = 256
MAX_ENV = 64
MAX_VALUE_CHARS = 4096
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_BUNDLE_REF = re.compile(r"^sha256:[0-9a-f]{64}$")
_MODULE_ENTRY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
_SCRIPT_ENTRY = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*\.py$")
_IMAGE = re.compile(r"^[a-z0-9]+([._/:@-][A-Za-z0-9]+)*$")
# How a job's global batch is split across its devices (``runtime.balancing``): by measured speed as
# the job runs (dynamic), by the flavors' benchmark scores once (static), or evenly (equal).
BALANCING_MODES = ("dynamic", "static", "equal")
# How gradients travel between ranks (``runtime.comm``): dense fp32, a cast, a sparse or low-rank code
# with error feedback, or chosen from the measured link bandwidth and the model size.
COMPRESSIONS = ("none", "fp16", "bf16", "topk", "powersgd", "auto")
# What a restart restores when the newest weights are newer than the newest optimizer state
# (``runtime.recovery.checkpoint``): those weights with the older optimizer state, or the last
# checkpoint that has both.
RESTORE_MODES = ("newest_weights", "last_full")
MAX_DEVICES = 64
MAX_PRIORITY = 1000


class SpecError(FieldError):
    """A job spec that cannot be used."""


class SpecErrors(SpecError):
    """Every problem found in one spec; its own field and message are the first problem's."""

    def __init__(self, errors: Iterable[SpecError]) -> None:
        self.errors = tuple(errors)
        first = self.errors[0]
        super().__init__(first.field, first.message)
        if len(self.errors) > 1:
            self.args = (f"{first.field}: {first.message} (and {len(self.errors) - 1} more problems)",)


# The range of each number in a spec, by its dotted path: (lowest, highest). Whole numbers include
# both ends; decimal numbers must be above the lowest (a rate or a size of 0 means nothing).
BOUNDS: dict[str, tuple[float, float]] = {
    "devices": (1, MAX_DEVICES),
    "min_devices": (1, MAX_DEVICES),  # and at most devices
    "devices.min": (1, MAX_DEVICES),  # and at most devices.max
    "devices.max": (1, MAX_DEVICES),
    "priority": (-MAX_PRIORITY, MAX_PRIORITY),
    "max_restarts": (0, 100),
    "workload.steps": (1, 1_000_000),
    "workload.global_batch": (1, 1_048_576),  # and at least devices
    "workload.lr": (0.0, 10.0),
    "workload.seed": (0, 2**31 - 1),
    "workload.hidden": (1, 8192),
    "comm.density": (0.0, 1.0),
    "comm.rank": (1, 256),
    "comm.bucket_mb": (0.0, 1024.0),
    "comm.warmup_steps": (0, 100_000),
    "checkpoint.weights_every": (1, 10_000_000),
    "checkpoint.optimizer_every": (1, 10_000_000),  # and a multiple of weights_every
    "checkpoint.keep": (1, 1000),
}
# The values a field may take, by its dotted path.
# How an elastic job's global batch and learning rate follow its device count n (of ``devices`` asked):
# fixed: the same global batch and rate on any n (the balancer splits it); linear: both scale by
# n / devices (Goyal et al.'s rule); sqrt: the batch by n / devices, the rate by its square root.
BATCH_SCALINGS = ("fixed", "linear", "sqrt")

CHOICES: dict[str, tuple[str, ...]] = {
    "workload.kind": WORKLOAD_KINDS,
    "workload.model": tuple(BUILTIN_MODELS),
    "balancing.mode": BALANCING_MODES,
    "comm.compression": COMPRESSIONS,
    "checkpoint.restore": RESTORE_MODES,
    "batch_scaling": BATCH_SCALINGS,
}
_T = TypeVar("_T")


class _Problems:
    """The problems of one spec, collected as each field is read, so that all are told at once."""

    def __init__(self) -> None:
        self.found: list[SpecError] = []

    def take(self, read: Callable[[], _T], fallback: _T) -> _T:
        """What ``read`` returns; ``fallback`` (and the problem noted) when it refuses."""
        try:
            return read()
        except SpecErrors as exc:
            self.found.extend(exc.errors)
        except SpecError as exc:
            self.found.append(exc)
        return fallback

    def unknown(self, raw: dict[str, Any], allowed: Iterable[str], prefix: str, what: str = "unknown field") -> None:
        """One problem per key not in ``allowed``, naming the allowed key it most looks like."""
        allowed = sorted(allowed)
        for key in raw:
            if key in allowed:
                continue
            close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            self.found.append(SpecError(f"{prefix}{key}", f"{what}; {hint}allowed here: {', '.join(allowed)}"))

    def check(self) -> None:
        if self.found:
            raise SpecErrors(self.found)


@dataclass(frozen=True)
class WorkloadSpec:
    kind: str = "builtin"
    model: str = "synthetic-mlp"  # builtin: which built-in model (BUILTIN_MODELS)
    steps: int = 200
    global_batch: int = 96
    lr: float = 0.05
    seed: int = 0
    hidden: int = 64
    # python and torchrun: the tenant's uploaded code ("sha256:<hex>", ``POST /api/v1/bundles``) and
    # what to run in it: "package.module:function" (python) or a script path inside the bundle.
    bundle: str = ""
    entrypoint: str = ""
    # python, torchrun, container: the program's arguments and extra environment.
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    # container: the image and its command (the Kubernetes backend runs it).
    image: str = ""
    command: tuple[str, ...] = ()

    @property
    def job_class(self) -> str:
        """What the throughput table keys this workload by: a built-in model by name, user code by
        its bundle and entrypoint (the same code measured again is the same class)."""
        if self.kind == "builtin":
            return self.model
        if self.kind == "container":
            return f"container:{self.image}"[:63]
        return f"{self.kind}:{self.bundle.removeprefix('sha256:')[:12]}:{self.entrypoint}"[:63]

    def to_json(self) -> dict[str, Any]:
        """The fields its kind uses (``parse_workload`` reads it back)."""
        data = asdict(self)
        data["args"], data["command"], data["env"] = list(self.args), list(self.command), dict(self.env)
        return {key: value for key, value in data.items() if key in _WORKLOAD_FIELDS[self.kind]}


@dataclass(frozen=True)
class BalancingSpec:
    mode: str = "dynamic"


@dataclass(frozen=True)
class CommSpec:
    compression: str = "none"
    density: float = 0.1  # topk: the share of entries sent each step, after the warm-up
    rank: int = 4  # powersgd: the rank of the approximation
    bucket_mb: float = 25.0  # gradients travel in buckets of about this size, each as soon as it is ready
    hierarchical: bool = True  # reduce inside each vendor group first; compress only between groups
    warmup_steps: int = 20  # topk: the density falls from dense to ``density`` over these steps
    overlap: bool = True  # send each bucket while the backward pass still computes the others

    def to_json(self) -> dict[str, Any]:
        return _flat(self)


@dataclass(frozen=True)
class CheckpointSpec:
    """What a job saves, and what a restart restores.

    A restore must give the state of one step: weights of step 30 with momentum of step 20 trained on
    to a final loss 2-7% worse (37% once) than an uninterrupted run. So by default every save holds
    the weights and the optimizer state together (the background saver makes that cheap), and a
    restart restores the newest checkpoint that has both (``last_full``). Layering, the reference
    article's weights every 1,000 steps and optimizer state every 5,000, stays a choice: an
    ``optimizer_every`` that is a multiple of ``weights_every``; ``newest_weights`` then pairs the newer
    weights with older optimizer state, for a job that accepts that to lose fewer steps.
    """

    weights_every: int = 50  # steps between saves of the weights
    optimizer_every: int = 50  # steps between saves of weights and optimizer state together
    keep: int = 3  # the newest checkpoints kept; older ones are deleted
    restore: str = "last_full"  # see RESTORE_MODES

    def to_json(self) -> dict[str, Any]:
        return _flat(self)


@dataclass(frozen=True)
class JobSpec:
    name: str
    devices: int
    flavors: tuple[str, ...]
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    # Higher goes first within the tenant's queue, and may preempt work that runs on borrowed
    # capacity (never a tenant's nominal share).
    priority: int = 0
    balancing: BalancingSpec = field(default_factory=BalancingSpec)
    comm: CommSpec = field(default_factory=CommSpec)
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    # After a failure the job restarts on whatever the pool offers, down to ``min_devices`` devices
    # (None: all ``devices``), at most ``max_restarts`` times; one failure more ends it ``failed``.
    min_devices: int | None = None
    max_restarts: int = 3
    # Elastic: admission may start it on any count from ``min_devices`` up to ``devices`` (the most
    # that fits), and it grows toward ``devices`` as room frees. ``devices: {"min": m, "max": n}`` in a
    # spec says the same. ``batch_scaling`` says how the global batch and the learning rate follow the
    # count (BATCH_SCALINGS).
    elastic: bool = False
    batch_scaling: str = "fixed"
    # A job that could not start even on an idle pool (its gang is larger than the pool's devices of
    # its flavors, or than its tenant's quota and cohort could ever give it) is refused at submit,
    # unless it may wait for capacity to be added.
    wait_for_capacity: bool = False

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["flavors"] = list(self.flavors)
        data["workload"] = self.workload.to_json()
        return data

    def workload_on(self, count: int) -> WorkloadSpec:
        """The workload as an attempt on ``count`` devices runs it: the global batch and learning rate
        scaled by ``batch_scaling`` (at least one sample per device)."""
        if self.batch_scaling == "fixed" or count == self.devices or count <= 0:
            return self.workload
        ratio = count / self.devices
        batch = max(count, round(self.workload.global_batch * ratio))
        lr = self.workload.lr * (ratio if self.batch_scaling == "linear" else math.sqrt(ratio))
        return replace(self.workload, global_batch=batch, lr=lr)


_TOP_FIELDS = tuple(JobSpec.__dataclass_fields__)


def _flat(section: CommSpec | CheckpointSpec) -> dict[str, Any]:
    # Sections of scalars only: ``asdict``'s recursive deep copy cost a list of 50 jobs 2.6 ms.
    return {name: getattr(section, name) for name in section.__dataclass_fields__}


def _int(raw: dict[str, Any], key: str, path: str, default: int, hi: int | None = None) -> int:
    lo, top = BOUNDS[path]
    lo, hi = int(lo), int(top if hi is None else hi)
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(path, f"must be a whole number between {lo} and {hi}, got {value!r}")
    if not lo <= value <= hi:
        raise SpecError(path, f"must be between {lo} and {hi}, got {value}")
    return value


def _float(raw: dict[str, Any], key: str, path: str, default: float) -> float:
    lo, hi = BOUNDS[path]
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(path, f"must be a number between {lo} and {hi}, got {value!r}")
    if not lo < value <= hi:
        raise SpecError(path, f"must be greater than {lo} and at most {hi}, got {value}")
    return float(value)


_COMMON_WORKLOAD = {"kind", "steps", "global_batch", "lr", "seed"}
_WORKLOAD_FIELDS = {
    "builtin": _COMMON_WORKLOAD | {"model", "hidden"},
    "python": _COMMON_WORKLOAD | {"bundle", "entrypoint", "args", "env"},
    "torchrun": _COMMON_WORKLOAD | {"bundle", "entrypoint", "args", "env"},
    "container": _COMMON_WORKLOAD | {"image", "command", "args", "env"},
}


def parse_workload(raw: Any) -> WorkloadSpec:
    if raw is None:
        return WorkloadSpec()
    if not isinstance(raw, dict):
        raise SpecError("workload", 'must be an object such as {"kind": "builtin", "model": "charlm"}')
    kind = raw.get("kind", "builtin")
    model = raw.get("model")
    if isinstance(kind, str) and kind in LEGACY_KINDS:
        if model is not None and model != LEGACY_KINDS[kind]:
            raise SpecError("workload.model", f"kind {kind!r} is the {LEGACY_KINDS[kind]} model; leave model out")
        kind, model = "builtin", LEGACY_KINDS[kind]
    if kind not in WORKLOAD_KINDS:
        raise SpecError(
            "workload.kind",
            f"{kind!r} is not a workload kind; use builtin (with model: {', '.join(BUILTIN_MODELS)}), "
            "python (your code with the training API), torchrun (an unmodified DDP script) or container",
        )
    problems = _Problems()
    problems.unknown(raw, _WORKLOAD_FIELDS[kind], "workload.", f"not used by kind {kind}")
    defaults = dict(BUILTIN_MODELS["synthetic-mlp"])
    if kind == "builtin":
        model = "synthetic-mlp" if model is None else model
        if isinstance(model, str) and model in BUILTIN_MODELS:
            defaults = BUILTIN_MODELS[model]
        else:
            problems.found.append(
                SpecError(
                    "workload.model", f"{model!r} is not a built-in model; use one of {', '.join(BUILTIN_MODELS)}"
                )
            )
    common = WorkloadSpec(
        kind=kind,
        model=str(model) if kind == "builtin" else "",
        steps=problems.take(lambda: _int(raw, "steps", "workload.steps", defaults["steps"]), 1),
        global_batch=problems.take(
            lambda: _int(raw, "global_batch", "workload.global_batch", defaults["global_batch"]), 1
        ),
        lr=problems.take(lambda: _float(raw, "lr", "workload.lr", defaults["lr"]), 1.0),
        seed=problems.take(lambda: _int(raw, "seed", "workload.seed", 0), 0),
    )
    if kind == "builtin":
        hidden = problems.take(lambda: _int(raw, "hidden", "workload.hidden", defaults["hidden"]), 1)
        problems.check()
        return replace(common, hidden=hidden)
    no_strings: tuple[str, ...] = ()
    args = problems.take(lambda: _strings(raw, "args", "workload.args"), no_strings)
    env = problems.take(lambda: _env(raw.get("env")), dict[str, str]())
    if kind == "container":
        image = raw.get("image")
        if not isinstance(image, str) or not _IMAGE.match(image) or len(image) > 255:
            problems.found.append(
                SpecError(
                    "workload.image",
                    'required for kind container: an image reference such as "ghcr.io/acme/train:1.2"',
                )
            )
        command = problems.take(lambda: _strings(raw, "command", "workload.command"), no_strings)
        problems.check()
        return replace(common, image=str(image), command=command, args=args, env=env)
    bundle = raw.get("bundle")
    if not isinstance(bundle, str) or not _BUNDLE_REF.match(bundle):
        problems.found.append(
            SpecError(
                "workload.bundle",
                f'required for kind {kind}: "sha256:<64 hex digits>" as POST /api/v1/bundles answered, got {bundle!r}',
            )
        )
    entrypoint = raw.get("entrypoint")
    script_only = kind == "torchrun"
    if (
        not isinstance(entrypoint, str)
        or not (_SCRIPT_ENTRY.match(entrypoint) or (not script_only and _MODULE_ENTRY.match(entrypoint)))
        or any(part in (".", "..") for part in entrypoint.split("/"))
    ):
        example = '"train.py"' if script_only else '"train.py" or "mypackage.train:main"'
        problems.found.append(
            SpecError("workload.entrypoint", f"required for kind {kind}: a path inside the bundle such as {example}")
        )
    problems.check()
    return replace(common, bundle=str(bundle), entrypoint=str(entrypoint), args=args, env=env)


def _strings(raw: dict[str, Any], key: str, path: str) -> tuple[str, ...]:
    value = raw.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SpecError(path, f'must be a list of strings such as ["--epochs", "3"], got {value!r}')
    if len(value) > MAX_ARGS:
        raise SpecError(path, f"at most {MAX_ARGS} entries, got {len(value)}")
    for i, item in enumerate(value):
        if len(item) > MAX_VALUE_CHARS or "\x00" in item:
            raise SpecError(f"{path}[{i}]", f"at most {MAX_VALUE_CHARS} characters and no NUL")
    return tuple(value)


def _env(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SpecError("workload.env", 'must be an object of names to strings such as {"EPOCHS": "3"}')
    if len(raw) > MAX_ENV:
        raise SpecError("workload.env", f"at most {MAX_ENV} variables, got {len(raw)}")
    for name, value in raw.items():
        where = f"workload.env.{name}"
        if not _ENV_NAME.match(name):
            raise SpecError(where, "a variable name is letters, digits and _, not starting with a digit")
        if name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES):
            raise SpecError(where, "is set by Polychip for every rank; choose another name")
        if not isinstance(value, str) or len(value) > MAX_VALUE_CHARS or "\x00" in value:
            raise SpecError(where, f"must be a string of at most {MAX_VALUE_CHARS} characters, without NUL")
    return dict(raw)


def parse_balancing(raw: Any) -> BalancingSpec:
    if raw is None:
        return BalancingSpec()
    if not isinstance(raw, dict):
        raise SpecError("balancing", 'must be an object such as {"mode": "dynamic"}')
    problems = _Problems()
    problems.unknown(raw, BalancingSpec.__dataclass_fields__, "balancing.")
    problems.check()
    mode = raw.get("mode", "dynamic")
    if mode not in BALANCING_MODES:
        raise SpecError(
            "balancing.mode",
            f"{mode!r} is not a balancing mode; use dynamic (follow measured speeds), "
            "static (split by benchmark scores once) or equal",
        )
    return BalancingSpec(mode=mode)


def _bool(raw: dict[str, Any], key: str, path: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise SpecError(path, f"must be true or false, got {value!r}")
    return value


def parse_comm(raw: Any) -> CommSpec:
    if raw is None:
        return CommSpec()
    if not isinstance(raw, dict):
        raise SpecError("comm", 'must be an object such as {"compression": "topk", "density": 0.01}')
    problems = _Problems()
    problems.unknown(raw, CommSpec.__dataclass_fields__, "comm.")
    compression = raw.get("compression", "none")
    if compression not in COMPRESSIONS:
        problems.found.append(
            SpecError(
                "comm.compression",
                f"{compression!r} is not a compression; use one of {', '.join(COMPRESSIONS)} "
                "(auto picks from the measured link bandwidth and the model size)",
            )
        )
    defaults = CommSpec()
    spec = CommSpec(
        compression=compression,
        density=problems.take(lambda: _float(raw, "density", "comm.density", defaults.density), defaults.density),
        rank=problems.take(lambda: _int(raw, "rank", "comm.rank", defaults.rank), defaults.rank),
        bucket_mb=problems.take(
            lambda: _float(raw, "bucket_mb", "comm.bucket_mb", defaults.bucket_mb), defaults.bucket_mb
        ),
        hierarchical=problems.take(
            lambda: _bool(raw, "hierarchical", "comm.hierarchical", defaults.hierarchical), defaults.hierarchical
        ),
        warmup_steps=problems.take(
            lambda: _int(raw, "warmup_steps", "comm.warmup_steps", defaults.warmup_steps), defaults.warmup_steps
        ),
        overlap=problems.take(lambda: _bool(raw, "overlap", "comm.overlap", defaults.overlap), defaults.overlap),
    )
    problems.check()
    return spec


def parse_checkpoint(raw: Any) -> CheckpointSpec:
    if raw is None:
        return CheckpointSpec()
    if not isinstance(raw, dict):
        raise SpecError("checkpoint", 'must be an object such as {"weights_every": 50, "optimizer_every": 50}')
    problems = _Problems()
    problems.unknown(raw, CheckpointSpec.__dataclass_fields__, "checkpoint.")
    weights_every = problems.take(lambda: _int(raw, "weights_every", "checkpoint.weights_every", 50), 0)
    # Unless told otherwise, every save holds the optimizer state too (see CheckpointSpec).
    optimizer_every = problems.take(
        lambda: _int(raw, "optimizer_every", "checkpoint.optimizer_every", weights_every or 50), 0
    )
    if weights_every and optimizer_every and optimizer_every % weights_every:  # 0: refused above
        problems.found.append(
            SpecError(
                "checkpoint.optimizer_every",
                f"must be a multiple of weights_every ({weights_every}), got {optimizer_every}: "
                "every optimizer save is also a weights save",
            )
        )
    restore = raw.get("restore", "last_full")
    if restore not in RESTORE_MODES:
        problems.found.append(
            SpecError(
                "checkpoint.restore",
                f"{restore!r} is not a restore mode; use last_full (the newest checkpoint that has both weights "
                "and optimizer state, the default) or newest_weights (the newest weights with the newest "
                "optimizer state at or before them)",
            )
        )
    keep = problems.take(lambda: _int(raw, "keep", "checkpoint.keep", 3), 3)
    problems.check()
    return CheckpointSpec(weights_every=weights_every, optimizer_every=optimizer_every, keep=keep, restore=restore)


def parse_job_spec(raw: Any, known_flavors: set[str] | None = None) -> JobSpec:
    """Validate a job spec: ``SpecErrors`` with every problem at once. ``known_flavors`` (when given)
    rejects flavors the pool lacks."""
    if not isinstance(raw, dict):
        raise SpecError("spec", "must be a JSON object with name, devices and flavors")
    problems = _Problems()
    problems.unknown(raw, _TOP_FIELDS, "")
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        problems.found.append(SpecError("name", 'required; give the job a short name such as "resnet-sweep-1"'))
    elif len(name) > 120:
        problems.found.append(SpecError("name", "at most 120 characters"))
    raw_devices = raw.get("devices")
    elastic_range = False
    if isinstance(raw_devices, dict):
        elastic_range = True
        # ``devices: {"min": 2, "max": 16}``: an elastic job, the same as devices 16, min_devices 2, elastic.
        problems.unknown(raw_devices, ("min", "max"), "devices.")
        for bound in ("min", "max"):
            if bound not in raw_devices:
                problems.found.append(SpecError(f"devices.{bound}", 'required; e.g. devices {"min": 2, "max": 8}'))
        devices = problems.take(lambda: _int(raw_devices, "max", "devices.max", 1), 0)
        low = problems.take(lambda: _int(raw_devices, "min", "devices.min", 1, hi=devices or None), None)
        if "min_devices" in raw or "elastic" in raw:
            problems.found.append(
                SpecError("devices", "give the range once: devices {min, max}, or min_devices and elastic")
            )
    else:
        devices = problems.take(lambda: _int(raw, "devices", "devices", 1), 0)  # 0: refused
    flavors_raw = raw.get("flavors")
    if not isinstance(flavors_raw, list) or not flavors_raw or not all(isinstance(f, str) for f in flavors_raw):
        problems.found.append(
            SpecError("flavors", 'required; a non-empty list of flavor names this job may run on, e.g. ["h100-sxm"]')
        )
        flavors_raw = []
    if known_flavors is not None:
        for i, flavor in enumerate(flavors_raw):
            if flavor not in known_flavors:
                close = difflib.get_close_matches(flavor, sorted(known_flavors), n=1, cutoff=0.6)
                hint = f"did you mean {close[0]!r}? " if close else ""
                choices = ", ".join(sorted(known_flavors))
                problems.found.append(
                    SpecError(f"flavors[{i}]", f"{flavor!r} is not in the pool; {hint}choose from {choices}")
                )
    workload = problems.take(lambda: parse_workload(raw.get("workload")), None)
    if workload is not None and workload.global_batch < devices:
        problems.found.append(
            SpecError("workload.global_batch", f"must be at least devices ({devices}) so every device gets a sample")
        )
    priority = problems.take(lambda: _int(raw, "priority", "priority", 0), 0)
    min_devices = raw.get("min_devices")
    if elastic_range:
        min_devices = low
    elif min_devices is not None and devices:
        min_devices = problems.take(lambda: _int(raw, "min_devices", "min_devices", devices, hi=devices), None)
    elastic = elastic_range or problems.take(lambda: _bool(raw, "elastic", "elastic", False), False)
    batch_scaling = raw.get("batch_scaling", "fixed")
    if batch_scaling not in BATCH_SCALINGS:
        problems.found.append(
            SpecError(
                "batch_scaling",
                f"{batch_scaling!r} is not a batch scaling; use fixed (the same global batch on any count), "
                "linear (batch and learning rate in proportion to the count) or sqrt (the rate by its square root)",
            )
        )
        batch_scaling = "fixed"
    elif batch_scaling != "fixed" and not elastic and min_devices in (None, devices):
        problems.found.append(
            SpecError("batch_scaling", "applies to a job whose count can change: give devices {min, max}")
        )
    balancing = problems.take(lambda: parse_balancing(raw.get("balancing")), BalancingSpec())
    comm = problems.take(lambda: parse_comm(raw.get("comm")), CommSpec())
    checkpoint = problems.take(lambda: parse_checkpoint(raw.get("checkpoint")), CheckpointSpec())
    max_restarts = problems.take(lambda: _int(raw, "max_restarts", "max_restarts", 3), 3)
    wait = problems.take(lambda: _bool(raw, "wait_for_capacity", "wait_for_capacity", False), False)
    problems.check()
    return JobSpec(
        name=str(name).strip(),
        devices=devices,
        flavors=tuple(dict.fromkeys(flavors_raw)),
        workload=workload or WorkloadSpec(),
        priority=priority,
        balancing=balancing,
        comm=comm,
        checkpoint=checkpoint,
        min_devices=min_devices,
        max_restarts=max_restarts,
        wait_for_capacity=wait,
        elastic=elastic,
        batch_scaling=batch_scaling,
    )


_Part = TypeVar("_Part")
_SECTIONS: dict[str, type[Any]] = {
    "workload": WorkloadSpec,
    "balancing": BalancingSpec,
    "comm": CommSpec,
    "checkpoint": CheckpointSpec,
}
_FIELDS = frozenset(JobSpec.__dataclass_fields__)


def _as_written(raw: Any) -> JobSpec | None:
    """``JobSpec.to_dict()``'s output read back without checking it again (it was checked before it
    was written): an admission cycle reads thousands of specs. None for any other shape."""
    if not isinstance(raw, dict) or raw.keys() != _FIELDS or not isinstance(raw["flavors"], list):
        return None
    sections: dict[str, Any] = {}
    for key, kind in _SECTIONS.items():
        section = raw[key]
        if kind is WorkloadSpec:
            # Written by ``WorkloadSpec.to_json``: its kind's fields only (a stored legacy kind is parsed).
            if not isinstance(section, dict) or section.get("kind") not in WORKLOAD_KINDS:
                return None
            if section.keys() != _WORKLOAD_FIELDS[section["kind"]]:
                return None
            section = {
                **({"model": ""} if section["kind"] != "builtin" else {}),
                **section,
                "args": tuple(section.get("args", ())),
                "command": tuple(section.get("command", ())),
            }
        elif not isinstance(section, dict) or section.keys() != kind.__dataclass_fields__.keys():
            return None
        sections[key] = kind(**section)
    return JobSpec(**{**raw, **sections, "flavors": tuple(raw["flavors"])})


def stored_job_spec(raw: Any) -> JobSpec:
    """A spec read back from storage, typed.

    It was valid when it was submitted; a part that today's rules refuse (a spec stored before a
    section was checked the way it is now) falls back to that part's defaults rather than break a
    job that runs, so the running system never reads a raw dict with defaults of its own.
    """
    written = _as_written(raw)
    if written is not None:
        return written
    try:
        return parse_job_spec(raw)
    except SpecError:
        pass
    data: dict[str, Any] = raw if isinstance(raw, dict) else {}

    def part(parse: Callable[[Any], _Part], key: str, default: _Part) -> _Part:
        try:
            return parse(data.get(key))
        except SpecError:
            return default

    def whole(key: str, default: int) -> int:
        value = data.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    devices = max(1, whole("devices", 1))
    flavors = data.get("flavors")
    min_devices = data.get("min_devices")
    return JobSpec(
        name=str(data.get("name") or ""),
        devices=devices,
        flavors=tuple(f for f in flavors if isinstance(f, str)) if isinstance(flavors, list) else (),
        workload=part(parse_workload, "workload", WorkloadSpec()),
        priority=whole("priority", 0),
        balancing=part(parse_balancing, "balancing", BalancingSpec()),
        comm=part(parse_comm, "comm", CommSpec()),
        checkpoint=part(parse_checkpoint, "checkpoint", CheckpointSpec()),
        min_devices=min_devices if isinstance(min_devices, int) and not isinstance(min_devices, bool) else None,
        max_restarts=whole("max_restarts", 3),
        elastic=data.get("elastic") is True,
        batch_scaling=scaling if (scaling := data.get("batch_scaling")) in BATCH_SCALINGS else "fixed",
    )


# --- the spec as JSON Schema -------------------------------------------------------------------------

_REQUIRED = ("name", "flavors")


def _field_schema(path: str, annotation: str, default: Any) -> dict[str, Any]:
    """One field's JSON Schema, from its annotation, ``BOUNDS`` and ``CHOICES``."""
    schema: dict[str, Any]
    if path in CHOICES:
        schema = {"type": "string", "enum": list(CHOICES[path])}
    elif annotation.startswith("int"):
        lo, hi = BOUNDS[path]
        schema = {"type": "integer", "minimum": int(lo), "maximum": int(hi)}
    elif annotation == "float":
        lo, hi = BOUNDS[path]
        schema = {"type": "number", "exclusiveMinimum": lo, "maximum": hi}
    elif annotation == "bool":
        schema = {"type": "boolean"}
    elif annotation.startswith("tuple"):
        schema = {"type": "array", "items": {"type": "string"}}
    elif annotation.startswith("Mapping"):
        schema = {"type": "object", "additionalProperties": {"type": "string"}, "maxProperties": MAX_ENV}
    else:
        schema = {"type": "string"}
    if default not in (None, "") and not isinstance(default, tuple | Mapping):
        schema["default"] = default
    return schema


def _section_schema(kind: type[Any], prefix: str, only: Iterable[str] | None = None) -> dict[str, Any]:
    fields = kind.__dataclass_fields__
    names = [name for name in fields if only is None or name in only]
    defaults = kind()
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            name: _field_schema(f"{prefix}{name}", str(fields[name].type), getattr(defaults, name)) for name in names
        },
    }


def job_spec_schema() -> dict[str, Any]:
    """The job spec as JSON Schema (2020-12): what ``parse_job_spec`` accepts, from the same tables.

    A schema cannot say everything the parser checks (a global batch of at least ``devices``, an
    ``optimizer_every`` that is a multiple of ``weights_every``, a bundle that exists): the API answers
    those, each naming its field."""
    workloads = []
    for kind in WORKLOAD_KINDS:
        section = _section_schema(WorkloadSpec, "workload.", _WORKLOAD_FIELDS[kind])
        section["properties"]["kind"] = {"const": kind}
        if kind == "builtin":
            for name in ("steps", "global_batch", "lr", "hidden"):  # each model has its own defaults
                section["properties"][name].pop("default", None)
        else:
            section["required"] = ["kind", "image"] if kind == "container" else ["kind", "bundle", "entrypoint"]
            for name in ("steps", "global_batch", "lr"):
                section["properties"][name]["default"] = BUILTIN_MODELS["synthetic-mlp"][name]
        if kind in ("python", "torchrun"):
            section["properties"]["bundle"]["pattern"] = _BUNDLE_REF.pattern
        workloads.append(section)
    fields = JobSpec.__dataclass_fields__
    properties: dict[str, Any] = {}
    for name, spec_field in fields.items():
        annotation = str(spec_field.type)
        if name == "workload":
            properties[name] = {"oneOf": workloads}
        elif name in _SECTIONS:
            properties[name] = _section_schema(_SECTIONS[name], f"{name}.")
        elif name == "name":
            properties[name] = {"type": "string", "minLength": 1, "maxLength": 120}
        elif name == "flavors":
            properties[name] = {"type": "array", "items": {"type": "string"}, "minItems": 1}
        else:
            default = spec_field.default if spec_field.default is not MISSING else None
            properties[name] = _field_schema(name, annotation, default)
    properties["devices"] = {
        "default": 1,
        "oneOf": [
            properties["devices"],
            {
                "type": "object",
                "description": "an elastic job: any count from min to max (the same as devices max, min_devices "
                "min, elastic true)",
                "additionalProperties": False,
                "required": ["min", "max"],
                "properties": {"min": dict(properties["devices"]), "max": dict(properties["devices"])},
            },
        ],
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Polychip job spec",
        "type": "object",
        "additionalProperties": False,
        "required": list(_REQUIRED),
        "properties": properties,
    }
