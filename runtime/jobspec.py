"""The job spec: what a tenant asks for, as JSON over REST or YAML from the CLI.

Parsing is pure: ``parse_job_spec`` turns a mapping into a frozen ``JobSpec`` or raises
``SpecError`` naming the field (dotted path) and how to fix it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
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
        return asdict(self)


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
        return asdict(self)


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

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["flavors"] = list(self.flavors)
        data["workload"] = self.workload.to_json()
        return data


def _int(raw: dict[str, Any], key: str, path: str, default: int, lo: int, hi: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(path, f"must be a whole number between {lo} and {hi}, got {value!r}")
    if not lo <= value <= hi:
        raise SpecError(path, f"must be between {lo} and {hi}, got {value}")
    return value


def _float(raw: dict[str, Any], key: str, path: str, default: float, lo: float, hi: float) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(path, f"must be a number between {lo} and {hi}, got {value!r}")
    if not lo < value <= hi:
        raise SpecError(path, f"must be greater than {lo} and at most {hi}, got {value}")
    return float(value)


def _reject_unknown(raw: dict[str, Any], allowed: set[str], prefix: str) -> None:
    for key in raw:
        if key not in allowed:
            where = f"{prefix}{key}"
            raise SpecError(where, f"unknown field; allowed here: {', '.join(sorted(allowed))}")


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
    allowed = _WORKLOAD_FIELDS[kind]
    for key in raw:
        if key not in allowed:
            raise SpecError(f"workload.{key}", f"not used by kind {kind}; allowed here: {', '.join(sorted(allowed))}")
    defaults = dict(BUILTIN_MODELS["synthetic-mlp"])
    if kind == "builtin":
        model = "synthetic-mlp" if model is None else model
        if model not in BUILTIN_MODELS:
            raise SpecError(
                "workload.model", f"{model!r} is not a built-in model; use one of {', '.join(BUILTIN_MODELS)}"
            )
        defaults = BUILTIN_MODELS[model]
    common = WorkloadSpec(
        kind=kind,
        model=str(model) if kind == "builtin" else "",
        steps=_int(raw, "steps", "workload.steps", defaults["steps"], 1, 1_000_000),
        global_batch=_int(raw, "global_batch", "workload.global_batch", defaults["global_batch"], 1, 1_048_576),
        lr=_float(raw, "lr", "workload.lr", defaults["lr"], 0.0, 10.0),
        seed=_int(raw, "seed", "workload.seed", 0, 0, 2**31 - 1),
    )
    if kind == "builtin":
        hidden = _int(raw, "hidden", "workload.hidden", defaults["hidden"], 1, 8192)
        return replace(common, hidden=hidden)
    args = _strings(raw, "args", "workload.args")
    env = _env(raw.get("env"))
    if kind == "container":
        image = raw.get("image")
        if not isinstance(image, str) or not _IMAGE.match(image) or len(image) > 255:
            raise SpecError(
                "workload.image", 'required for kind container: an image reference such as "ghcr.io/acme/train:1.2"'
            )
        command = _strings(raw, "command", "workload.command")
        return replace(common, image=image, command=command, args=args, env=env)
    bundle = raw.get("bundle")
    if not isinstance(bundle, str) or not _BUNDLE_REF.match(bundle):
        raise SpecError(
            "workload.bundle",
            f'required for kind {kind}: "sha256:<64 hex digits>" as POST /api/v1/bundles answered, got {bundle!r}',
        )
    entrypoint = raw.get("entrypoint")
    script_only = kind == "torchrun"
    if (
        not isinstance(entrypoint, str)
        or not (_SCRIPT_ENTRY.match(entrypoint) or (not script_only and _MODULE_ENTRY.match(entrypoint)))
        or any(part in (".", "..") for part in entrypoint.split("/"))
    ):
        example = '"train.py"' if script_only else '"train.py" or "mypackage.train:main"'
        raise SpecError("workload.entrypoint", f"required for kind {kind}: a path inside the bundle such as {example}")
    return replace(common, bundle=bundle, entrypoint=entrypoint, args=args, env=env)


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
    _reject_unknown(raw, {"mode"}, "balancing.")
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
    _reject_unknown(raw, set(CommSpec.__dataclass_fields__), "comm.")
    compression = raw.get("compression", "none")
    if compression not in COMPRESSIONS:
        raise SpecError(
            "comm.compression",
            f"{compression!r} is not a compression; use one of {', '.join(COMPRESSIONS)} "
            "(auto picks from the measured link bandwidth and the model size)",
        )
    return CommSpec(
        compression=compression,
        density=_float(raw, "density", "comm.density", 0.1, 0.0, 1.0),
        rank=_int(raw, "rank", "comm.rank", 4, 1, 256),
        bucket_mb=_float(raw, "bucket_mb", "comm.bucket_mb", 25.0, 0.0, 1024.0),
        hierarchical=_bool(raw, "hierarchical", "comm.hierarchical", True),
        warmup_steps=_int(raw, "warmup_steps", "comm.warmup_steps", 20, 0, 100_000),
        overlap=_bool(raw, "overlap", "comm.overlap", True),
    )


def parse_checkpoint(raw: Any) -> CheckpointSpec:
    if raw is None:
        return CheckpointSpec()
    if not isinstance(raw, dict):
        raise SpecError("checkpoint", 'must be an object such as {"weights_every": 50, "optimizer_every": 50}')
    _reject_unknown(raw, set(CheckpointSpec.__dataclass_fields__), "checkpoint.")
    weights_every = _int(raw, "weights_every", "checkpoint.weights_every", 50, 1, 10_000_000)
    # Unless told otherwise, every save holds the optimizer state too (see CheckpointSpec).
    optimizer_every = _int(raw, "optimizer_every", "checkpoint.optimizer_every", weights_every, 1, 10_000_000)
    if optimizer_every % weights_every:
        raise SpecError(
            "checkpoint.optimizer_every",
            f"must be a multiple of weights_every ({weights_every}), got {optimizer_every}: "
            "every optimizer save is also a weights save",
        )
    restore = raw.get("restore", "last_full")
    if restore not in RESTORE_MODES:
        raise SpecError(
            "checkpoint.restore",
            f"{restore!r} is not a restore mode; use last_full (the newest checkpoint that has both weights "
            "and optimizer state, the default) or newest_weights (the newest weights with the newest optimizer "
            "state at or before them)",
        )
    return CheckpointSpec(
        weights_every=weights_every,
        optimizer_every=optimizer_every,
        keep=_int(raw, "keep", "checkpoint.keep", 3, 1, 1000),
        restore=restore,
    )


def parse_job_spec(raw: Any, known_flavors: set[str] | None = None) -> JobSpec:
    """Validate a job spec. ``known_flavors`` (when given) rejects flavors the pool lacks."""
    if not isinstance(raw, dict):
        raise SpecError("spec", "must be a JSON object with name, devices and flavors")
    _reject_unknown(
        raw,
        {
            "name",
            "devices",
            "flavors",
            "workload",
            "priority",
            "balancing",
            "comm",
            "checkpoint",
            "min_devices",
            "max_restarts",
        },
        "",
    )
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise SpecError("name", 'required; give the job a short name such as "resnet-sweep-1"')
    if len(name) > 120:
        raise SpecError("name", "at most 120 characters")
    devices = _int(raw, "devices", "devices", 1, 1, MAX_DEVICES)
    flavors_raw = raw.get("flavors")
    if not isinstance(flavors_raw, list) or not flavors_raw or not all(isinstance(f, str) for f in flavors_raw):
        raise SpecError("flavors", 'required; a non-empty list of flavor names this job may run on, e.g. ["h100-sxm"]')
    if known_flavors is not None:
        for i, flavor in enumerate(flavors_raw):
            if flavor not in known_flavors:
                choices = ", ".join(sorted(known_flavors))
                raise SpecError(f"flavors[{i}]", f"{flavor!r} is not in the pool; choose from {choices}")
    workload = parse_workload(raw.get("workload"))
    if workload.global_batch < devices:
        raise SpecError("workload.global_batch", f"must be at least devices ({devices}) so every device gets a sample")
    priority = _int(raw, "priority", "priority", 0, -MAX_PRIORITY, MAX_PRIORITY)
    min_devices = raw.get("min_devices")
    if min_devices is not None:
        min_devices = _int(raw, "min_devices", "min_devices", devices, 1, devices)
    return JobSpec(
        name=name.strip(),
        devices=devices,
        flavors=tuple(dict.fromkeys(flavors_raw)),
        workload=workload,
        priority=priority,
        balancing=parse_balancing(raw.get("balancing")),
        comm=parse_comm(raw.get("comm")),
        checkpoint=parse_checkpoint(raw.get("checkpoint")),
        min_devices=min_devices,
        max_restarts=_int(raw, "max_restarts", "max_restarts", 3, 0, 100),
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
    )
