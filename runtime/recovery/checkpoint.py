"""Layered checkpoints: the weights often, the optimizer state (as large again, or twice that) less often.

A checkpoint is named ``step-0000000250`` and is either ``weights`` (``weights.pt``) or ``full``
(``weights.pt`` and ``optimizer.pt`` of the same step). Its manifest records, for every file, the
sha256 and the size, so a restart can tell a complete checkpoint from a torn or corrupted one before
trusting it, and the caller's ``meta`` (the data position, the split...).

Saving holds the training thread only for an in-memory snapshot (tensors cloned on their device);
a single saver thread moves the snapshot to the host, serializes it, writes it through the store's
atomic commit and applies retention. Files are written from host tensors, so a checkpoint taken on
one vendor's device restores on another's.

Restoring: ``find_restore`` picks what to load under the job's restore mode (rank 0), ``load``
reads it (every rank), verifying the checksums again.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import math
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch
from torch import nn

from runtime.jobspec import RESTORE_MODES, CheckpointSpec
from runtime.recovery.store import CheckpointStore, StoreError

CHECKPOINT_FORMAT = 1


class OptimizerState(Protocol):
    """What a full checkpoint keeps beside the weights: an optimizer, or the training API's
    ``TrainingState`` (the optimizer and the objects the training code registered)."""

    def state_dict(self) -> dict[str, Any]: ...


KINDS = ("weights", "full")
WEIGHTS_FILE = "weights.pt"
OPTIMIZER_FILE = "optimizer.pt"
FILES_OF_KIND = {"weights": (WEIGHTS_FILE,), "full": (WEIGHTS_FILE, OPTIMIZER_FILE)}
MAX_STEP = 10**10 - 1  # the largest step a ten-digit name holds

_NAME_RE = re.compile(r"step-(\d{10})")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")

StateDict = dict[str, torch.Tensor]


class CorruptCheckpoint(StoreError):
    """A checkpoint that cannot be trusted: a manifest that does not parse, a missing file, a bad checksum."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"{name}: {reason}")
        self.name = name
        self.reason = reason


def checkpoint_name(step: int) -> str:
    """Zero-padded, so the store's sorted names are in step order."""
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
        raise ValueError(f"step must be a whole number between 0 and {MAX_STEP}, got {step!r}")
    return f"step-{step:010d}"


def step_of(name: str) -> int | None:
    """The step a checkpoint name holds; None for a name that is not a checkpoint's."""
    match = _NAME_RE.fullmatch(name)
    return int(match.group(1)) if match else None


def kind_at(spec: CheckpointSpec, step: int) -> str | None:
    """What the schedule saves after ``step`` (counted from 1): ``full`` on multiples of
    ``optimizer_every``, else ``weights`` on multiples of ``weights_every``, else nothing. Step 0 and
    below are the untrained start, never saved."""
    if step < 1:
        return None
    if step % spec.optimizer_every == 0:
        return "full"
    if step % spec.weights_every == 0:
        return "weights"
    return None


# --- manifests -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileEntry:
    sha256: str
    bytes: int


@dataclass(frozen=True)
class Manifest:
    step: int
    kind: str
    created_at: float
    files: dict[str, FileEntry]
    meta: dict[str, Any]

    def to_bytes(self) -> bytes:
        document = {
            "format": CHECKPOINT_FORMAT,
            "step": self.step,
            "kind": self.kind,
            "created_at": self.created_at,
            "files": {file: asdict(entry) for file, entry in sorted(self.files.items())},
            "meta": self.meta,
        }
        return json.dumps(document, indent=1, sort_keys=True).encode()

    @classmethod
    def parse(cls, name: str, data: bytes) -> Manifest:
        """The manifest of checkpoint ``name``; CorruptCheckpoint saying what is wrong otherwise."""

        def bad(reason: str) -> CorruptCheckpoint:
            return CorruptCheckpoint(name, f"bad manifest: {reason}")

        try:
            raw = json.loads(data)
        except (UnicodeDecodeError, ValueError) as exc:
            raise bad(f"not JSON ({exc})") from exc
        if not isinstance(raw, dict):
            raise bad("not a JSON object")
        if raw.get("format") != CHECKPOINT_FORMAT:
            raise bad(f"format {raw.get('format')!r}, this version reads format {CHECKPOINT_FORMAT}")
        step = raw.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step_of(name) not in (None, step):
            raise bad(f"step {step!r} does not match the name")
        kind = raw.get("kind")
        if kind not in KINDS:
            raise bad(f"kind {kind!r} is neither weights nor full")
        created_at = raw.get("created_at")
        if isinstance(created_at, bool) or not isinstance(created_at, int | float) or not math.isfinite(created_at):
            raise bad(f"created_at {created_at!r} is not a time")
        meta = raw.get("meta", {})
        if not isinstance(meta, dict):
            raise bad("meta is not an object")
        files_raw = raw.get("files")
        if not isinstance(files_raw, dict):
            raise bad("files is not an object")
        files: dict[str, FileEntry] = {}
        for file, entry in files_raw.items():
            if not isinstance(entry, dict):
                raise bad(f"the entry of {file} is not an object")
            sha, size = entry.get("sha256"), entry.get("bytes")
            if not isinstance(sha, str) or not _SHA256_RE.fullmatch(sha):
                raise bad(f"the sha256 of {file} is not 64 lowercase hex digits")
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise bad(f"the size of {file} is not a byte count")
            files[file] = FileEntry(sha, size)
        for required in FILES_OF_KIND[kind]:
            if required not in files:
                raise bad(f"a {kind} checkpoint must list {required}")
        return cls(step=step, kind=kind, created_at=float(created_at), files=files, meta=meta)


def read_manifest(store: CheckpointStore, name: str) -> Manifest:
    """Read and parse a manifest (files unchecked); CorruptCheckpoint when missing or unusable."""
    try:
        data = store.read(name, "manifest.json")
    except StoreError as exc:
        raise CorruptCheckpoint(name, f"manifest unreadable ({exc})") from exc
    return Manifest.parse(name, data)


def _read_verified(store: CheckpointStore, name: str, manifest: Manifest, file: str) -> bytes:
    entry = manifest.files[file]
    try:
        data = store.read(name, file)
    except StoreError as exc:
        raise CorruptCheckpoint(name, f"{file} is missing or unreadable ({exc})") from exc
    if len(data) != entry.bytes:
        raise CorruptCheckpoint(name, f"{file} has {len(data)} bytes, the manifest says {entry.bytes} (torn write?)")
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        raise CorruptCheckpoint(name, f"{file} fails its sha256 check (corrupted)")
    return data


def _verify(store: CheckpointStore, name: str, manifest: Manifest) -> None:
    for file in sorted(manifest.files):
        _read_verified(store, name, manifest, file)


# --- saving ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SaveRecord:
    """One save, for telemetry and the interval advisor.

    ``stall_s``: how long the training thread was held (waiting for the previous save still in
    flight, plus the snapshot; for a synchronous save also the serialization and the write).
    ``write_s``: serialization, hashing, the store's commit and retention. ``bytes``: the sizes of
    the files. ``deleted``: what retention removed. A background save's record as ``save`` returns
    it is *pending*: ``write_s`` and ``bytes`` are 0 and ``deleted`` empty; the completed record
    reaches ``Checkpointer.records`` and ``on_saved`` once the saver thread is done.
    """

    step: int
    kind: str
    stall_s: float
    write_s: float
    bytes: int
    background: bool
    deleted: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["deleted"] = list(self.deleted)
        return data


def _clone_tree(value: Any) -> Any:
    """A deep copy in which every tensor is a detached clone on its own device: cheap (a device
    copy), and immune to the optimizer's in-place updates that follow."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {key: _clone_tree(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_clone_tree(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_clone_tree(item) for item in value)
    return copy.deepcopy(value)


def _to_host(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {key: _to_host(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_to_host(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_to_host(item) for item in value)
    return value


def _serialize(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(_to_host(value), buffer)
    return buffer.getvalue()


@dataclass
class _Snapshot:
    step: int
    kind: str
    model_state: StateDict
    optimizer_state: dict[str, Any] | None
    meta: dict[str, Any]
    started: float
    stall_s: float = 0.0
    # Recorded on the training thread's current CUDA stream after the clones: the saver thread waits
    # on it before copying to the host, whatever stream the training loop runs on.
    cloned: torch.cuda.Event | None = None

    def wait_until_cloned(self) -> None:
        if self.cloned is not None:
            self.cloned.synchronize()


def _on_cuda(tree: Any) -> bool:
    if isinstance(tree, torch.Tensor):
        return tree.is_cuda
    if isinstance(tree, dict):
        return any(_on_cuda(item) for item in tree.values())
    if isinstance(tree, list | tuple):
        return any(_on_cuda(item) for item in tree)
    return False


def _log(message: str) -> None:
    print(f"polychip checkpoint: {message}", file=sys.stderr, flush=True)  # noqa: T201 (stderr is this process's log, which the supervisor shows)


class Checkpointer:
    """Saves on the spec's schedule, by default off the training thread.

    At most one save is in flight: a save that comes while the previous one is still being written
    waits for it (that wait counts in its ``stall_s``), so memory holds at most one snapshot and
    checkpoints reach the store in step order. A background save that fails is logged to stderr and
    kept in ``last_error``; training goes on, and the next save tries again. A synchronous save
    (``background=False``) raises its error instead. Retention that fails after a successful commit
    never fails the save: it is logged and kept in ``last_error``.
    """

    def __init__(
        self,
        store: CheckpointStore,
        spec: CheckpointSpec,
        *,
        background: bool = True,
        on_saved: Callable[[SaveRecord], None] | None = None,
    ) -> None:
        self.store = store
        self.spec = spec
        self.background = background
        self.on_saved = on_saved
        self.records: list[SaveRecord] = []  # completed saves, in order
        self.last_error: BaseException | None = None
        self._cond = threading.Condition()
        self._pending: _Snapshot | None = None
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def maybe_save(
        self,
        step: int,
        model: nn.Module,
        optimizer: OptimizerState | None,
        meta: dict[str, Any] | None = None,
    ) -> SaveRecord | None:
        """Save when the schedule says so (``kind_at``); None otherwise. Without an optimizer a
        ``full`` step saves the weights only: there is no optimizer state to keep."""
        kind = kind_at(self.spec, step)
        if kind is None:
            return None
        if kind == "full" and optimizer is None:
            kind = "weights"
        return self.save(step, kind, model, optimizer, meta)

    def save(
        self,
        step: int,
        kind: str,
        model: nn.Module,
        optimizer: OptimizerState | None,
        meta: dict[str, Any] | None = None,
    ) -> SaveRecord:
        """Snapshot now and write (in the background, or before returning); see SaveRecord for what
        a background save's returned record holds."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        if kind == "full" and optimizer is None:
            raise ValueError("a full checkpoint needs the optimizer")
        checkpoint_name(step)  # validates the step here, not later in the saver thread
        meta = dict(meta or {})
        try:
            json.dumps(meta)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"meta must be JSON-serializable: {exc}") from exc
        with self._cond:
            if self._closed:
                raise RuntimeError("this Checkpointer is closed")
        started = time.perf_counter()
        self.wait()
        snapshot = _Snapshot(
            step=step,
            kind=kind,
            model_state={key: value.detach().clone() for key, value in model.state_dict().items()},
            optimizer_state=_clone_tree(optimizer.state_dict()) if kind == "full" and optimizer is not None else None,
            meta=meta,
            started=started,
        )
        if _on_cuda(snapshot.model_state) or _on_cuda(snapshot.optimizer_state):
            snapshot.cloned = torch.cuda.Event()  # type: ignore[no-untyped-call]  # torch: no annotations
            snapshot.cloned.record()
        if not self.background:
            record = self._write(snapshot)
            self._completed(record)
            return record
        snapshot.stall_s = time.perf_counter() - started
        with self._cond:
            self._pending = snapshot
            if self._thread is None:
                self._thread = threading.Thread(target=self._saver, name="polychip-checkpoint", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return SaveRecord(step=step, kind=kind, stall_s=snapshot.stall_s, write_s=0.0, bytes=0, background=True)

    def wait(self) -> None:
        """Until no save is in flight."""
        with self._cond:
            while self._pending is not None or self._busy:
                self._cond.wait()

    def close(self) -> None:
        """Let the save in flight finish, then stop the saver thread. Idempotent."""
        with self._cond:
            while self._pending is not None or self._busy:
                self._cond.wait()
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _saver(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._pending is None:
                    return
                snapshot, self._pending = self._pending, None
                self._busy = True
            try:
                record = self._write(snapshot)
            except BaseException as exc:  # the thread must survive anything a store raises
                self.last_error = exc
                _log(f"save of step {snapshot.step} to {self.store.location} failed: {type(exc).__name__}: {exc}")
            else:
                try:
                    self._completed(record)
                except BaseException as exc:
                    self.last_error = exc
                    _log(f"on_saved for step {snapshot.step} raised {type(exc).__name__}: {exc}")
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _write(self, snapshot: _Snapshot) -> SaveRecord:
        write_started = time.perf_counter()
        snapshot.wait_until_cloned()
        files = {WEIGHTS_FILE: _serialize(snapshot.model_state)}
        if snapshot.optimizer_state is not None:
            files[OPTIMIZER_FILE] = _serialize(snapshot.optimizer_state)
        manifest = Manifest(
            step=snapshot.step,
            kind=snapshot.kind,
            created_at=time.time(),
            files={file: FileEntry(hashlib.sha256(data).hexdigest(), len(data)) for file, data in files.items()},
            meta=snapshot.meta,
        )
        self.store.commit(checkpoint_name(snapshot.step), files, manifest.to_bytes())
        deleted: list[str] = []
        try:
            deleted = retain(self.store, self.spec.keep)
        except Exception as exc:
            self.last_error = exc
            _log(f"retention after step {snapshot.step} in {self.store.location} failed: {type(exc).__name__}: {exc}")
        finished = time.perf_counter()
        return SaveRecord(
            step=snapshot.step,
            kind=snapshot.kind,
            stall_s=snapshot.stall_s if self.background else finished - snapshot.started,
            write_s=finished - write_started,
            bytes=sum(len(data) for data in files.values()),
            background=self.background,
            deleted=tuple(deleted),
        )

    def _completed(self, record: SaveRecord) -> None:
        self.records.append(record)
        if self.on_saved is not None:
            self.on_saved(record)


def retain(store: CheckpointStore, keep: int) -> list[str]:
    """Delete all but the ``keep`` newest checkpoints and the ``keep`` newest full ones (so a restore
    always finds optimizer state); the names deleted, oldest first.

    Only manifests are read (not the files), so this stays cheap after every save. A checkpoint
    whose manifest does not parse does not count toward either ``keep``; it is deleted only when it
    is older than everything kept (a restore would skip it anyway), and never when nothing is kept.
    One whose manifest cannot be read at all (the store failed) is left alone: that may be passing.
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be a whole number of at least 1, got {keep!r}")
    usable: list[tuple[int, str, str]] = []  # newest first
    corrupt: list[tuple[int, str]] = []
    for name in sorted(store.names(), reverse=True):
        step = step_of(name)
        if step is None:
            continue  # not a checkpoint: not ours to delete
        try:
            data = store.read(name, "manifest.json")
        except StoreError:
            continue
        try:
            usable.append((step, name, Manifest.parse(name, data).kind))
        except CorruptCheckpoint:
            corrupt.append((step, name))
    newest = [name for _, name, _ in usable[:keep]]
    newest_full = [name for _, name, kind in usable if kind == "full"][:keep]
    kept = set(newest) | set(newest_full)
    doomed = [(step, name) for step, name, _ in usable if name not in kept]
    if kept:
        oldest_kept = min(step_of(name) or 0 for name in kept)
        doomed += [(step, name) for step, name in corrupt if step < oldest_kept]
    deleted: list[str] = []
    for _, name in sorted(doomed):
        store.delete(name)
        deleted.append(name)
    return deleted


# --- restoring -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RestorePlan:
    """What a restart loads. ``optimizer_step`` None: no usable optimizer state, the optimizer
    starts fresh. ``skipped``: newer checkpoints rejected on the way (torn, corrupted, bad
    manifest), with the reason. ``note``: one sentence on the choice, for logs and telemetry.

    Ranks other than the one that planned may build their own plan from the two broadcast steps
    (``RestorePlan(mode, weights_step, optimizer_step, {})``): ``load`` needs nothing else.
    """

    mode: str
    weights_step: int
    optimizer_step: int | None
    meta: dict[str, Any]
    skipped: tuple[tuple[str, str], ...] = ()
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["skipped"] = [list(entry) for entry in self.skipped]
        return data


class _Scan:
    """Checkpoints newest first, each verified at most once, the rejects remembered with a reason."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        named = ((step_of(name), name) for name in store.names())
        self.candidates = sorted(((step, name) for step, name in named if step is not None), reverse=True)
        self.skipped: dict[str, str] = {}
        self._manifests: dict[str, Manifest] = {}
        self._verified: set[str] = set()

    def manifest(self, name: str) -> Manifest | None:
        if name in self.skipped:
            return None
        if name not in self._manifests:
            try:
                self._manifests[name] = read_manifest(self.store, name)
            except CorruptCheckpoint as exc:
                self.skipped[name] = exc.reason
                return None
        return self._manifests[name]

    def verified(self, name: str) -> Manifest | None:
        manifest = self.manifest(name)
        if manifest is None or name in self._verified:
            return manifest
        try:
            _verify(self.store, name, manifest)
        except CorruptCheckpoint as exc:
            self.skipped[name] = exc.reason
            return None
        self._verified.add(name)
        return manifest

    def newest(self, kind: str | None, at_most: int | None = None) -> Manifest | None:
        """The newest valid checkpoint of ``kind`` (None: any) with step <= ``at_most``."""
        for step, name in self.candidates:
            if at_most is not None and step > at_most:
                continue
            header = self.manifest(name)
            if header is None or (kind is not None and header.kind != kind):
                continue
            manifest = self.verified(name)
            if manifest is not None:
                return manifest
        return None

    def skipped_newer_than(self, step: int) -> tuple[tuple[str, str], ...]:
        return tuple(
            (name, reason) for name, reason in sorted(self.skipped.items(), reverse=True) if (step_of(name) or 0) > step
        )


def find_restore(store: CheckpointStore, mode: str = "newest_weights") -> RestorePlan | None:
    """Pick what to restore, verifying every file of each candidate (manifest, presence, size,
    sha256), newest first; None when no valid checkpoint exists.

    ``newest_weights``: the newest valid checkpoint of either kind for the weights, and the newest
    valid full one at or before it for the optimizer state (None if there is none). ``last_full``:
    the newest valid full checkpoint for both; when no full one is valid it falls back to the newest
    valid weights with ``optimizer_step`` None, and ``note`` says so.
    """
    if mode not in RESTORE_MODES:
        raise ValueError(f"mode must be one of {', '.join(RESTORE_MODES)}, got {mode!r}")
    scan = _Scan(store)
    weights: Manifest | None
    optimizer: Manifest | None
    if mode == "newest_weights":
        weights = scan.newest(None)
        if weights is None:
            return None
        optimizer = weights if weights.kind == "full" else scan.newest("full", at_most=weights.step)
        if optimizer is weights:
            note = f"step {weights.step}: weights and optimizer state from the same checkpoint"
        elif optimizer is not None:
            note = (
                f"weights of step {weights.step} with the optimizer state of step {optimizer.step} "
                f"({weights.step - optimizer.step} steps older)"
            )
        else:
            note = (
                f"weights of step {weights.step}; no valid optimizer state at or before it, the optimizer starts fresh"
            )
    else:
        optimizer = scan.newest("full")
        if optimizer is not None:
            weights = optimizer
            note = f"step {optimizer.step}, the newest checkpoint with optimizer state"
        else:
            weights = scan.newest(None)
            if weights is None:
                return None
            note = (
                f"no valid checkpoint has optimizer state: weights of step {weights.step}, the optimizer starts fresh"
            )
    chosen = min(weights.step, optimizer.step) if optimizer is not None else weights.step
    skipped = scan.skipped_newer_than(chosen)
    if skipped:
        note += f"; skipped {len(skipped)} newer invalid checkpoint{'s' if len(skipped) != 1 else ''}"
    return RestorePlan(
        mode=mode,
        weights_step=weights.step,
        optimizer_step=optimizer.step if optimizer is not None else None,
        meta=dict(weights.meta),
        skipped=skipped,
        note=note,
    )


@dataclass(frozen=True)
class Restored:
    """What ``load`` read, as host (CPU) tensors: ``model.load_state_dict`` copies them onto the
    model's device and ``optimizer.load_state_dict`` moves the state to its parameters' devices."""

    plan: RestorePlan
    model_state: StateDict
    optimizer_state: dict[str, Any] | None


def _load_file(store: CheckpointStore, step: int, file: str, kind: str | None = None) -> Any:
    name = checkpoint_name(step)
    manifest = read_manifest(store, name)
    if kind is not None and manifest.kind != kind:
        raise CorruptCheckpoint(name, f"is a {manifest.kind} checkpoint, not {kind}")
    data = _read_verified(store, name, manifest, file)
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CorruptCheckpoint(name, f"{file} does not load: {type(exc).__name__}: {exc}") from exc


def load(store: CheckpointStore, plan: RestorePlan) -> Restored:
    """Read the plan's weights (and optimizer state), verifying their checksums again: another rank
    may read a store that changed since the plan was made. CorruptCheckpoint if anything is off."""
    model_state = _load_file(store, plan.weights_step, WEIGHTS_FILE)
    if not isinstance(model_state, dict) or not all(
        isinstance(key, str) and isinstance(value, torch.Tensor) for key, value in model_state.items()
    ):
        raise CorruptCheckpoint(checkpoint_name(plan.weights_step), f"{WEIGHTS_FILE} is not a state_dict of tensors")
    optimizer_state: dict[str, Any] | None = None
    if plan.optimizer_step is not None:
        optimizer_state = _load_file(store, plan.optimizer_step, OPTIMIZER_FILE, kind="full")
        if not isinstance(optimizer_state, dict) or not {"state", "param_groups"} <= optimizer_state.keys():
            raise CorruptCheckpoint(
                checkpoint_name(plan.optimizer_step), f"{OPTIMIZER_FILE} is not an optimizer state_dict"
            )
    return Restored(plan=plan, model_state=model_state, optimizer_state=optimizer_state)
