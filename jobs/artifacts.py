"""What a job leaves behind for its tenant to keep: its checkpoints and its final model, listed and streamed.

Checkpoints are read from the job's own store (``runs.checkpoint_url``: a directory or a bucket, one
per job, shared by its attempts) in the format of ``runtime.recovery.checkpoint``: a checkpoint
``step-0000000250`` is ``weights.pt`` (and, when ``full``, ``optimizer.pt``) plus a ``manifest.json``
that records each file's size and sha256. Only checkpoints whose manifest is there and parses are
listed or served (a restore would skip any other).

A checkpoint downloads as one uncompressed tar, ``step-0000000250/{manifest.json, weights.pt,
optimizer.pt}``, built while it is sent: each member's header is ``tarfile.TarInfo.tobuf`` and its
data is copied from the store in chunks, so nothing is held whole in memory (``tarfile.addfile``
copies a whole member before a generator could pass any of it on) and the length is known up front.
The manifest travels with it, so the files can be checked after the download. ``?file=`` sends one
file of the checkpoint alone, as stored.

The final model is the ``model.pt`` that rank 0 writes into its run's artifact folder
(``runtime.worker.artifacts.save_model``) and names in its "finished" event (``job.artifact_path``);
before such an event, the current attempt's folder is looked in. Its sha256 is computed on the first
listing and cached for as long as the file's size and modification time stay the same.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from django.conf import settings
from django.core.cache import cache

from controlplane import domain
from jobs.contracts import CheckpointFileView, CheckpointView, Download, FinalModelView, JobCheckpointsView
from jobs.errors import JobNotFound
from jobs.models import TrainingJob
from jobs.runs import checkpoint_url, job_key, run_key
from runtime.recovery.store import MANIFEST, CheckpointStore, LocalStore, S3Store, StoreError, open_store

MODEL_FILE = "model.pt"  # runtime.worker.artifacts.ARTIFACT_NAME (not imported: that module loads torch)
CHUNK = 1 << 20
LAYER_OF_FILE = {"weights.pt": "weights", "optimizer.pt": "optimizer"}
TAR = "application/x-tar"
BINARY = "application/octet-stream"


class CheckpointNotFound(domain.NotFound, LookupError):
    """No such checkpoint in the job's store (never saved, removed by retention, or unreadable)."""

    def __init__(self, job_id: int, step: int) -> None:
        super().__init__(f"job {job_id} has no checkpoint of step {step}", field="step")


class ModelNotFound(domain.NotFound, LookupError):
    """The job has written no final model (yet)."""

    def __init__(self, job_id: int) -> None:
        super().__init__(f"job {job_id} has no final model yet: rank 0 writes it when training ends")


def _checkpoint_format() -> ModuleType:
    # Imported when a checkpoint is read, not when the control plane starts: the module loads torch.
    from runtime.recovery import checkpoint

    return checkpoint


def _job(tenant_id: int, job_id: int) -> TrainingJob:
    job = TrainingJob.scoped.for_tenant(tenant_id).filter(pk=job_id).first()
    if job is None:
        raise JobNotFound(job_id)
    return job


def _store(job: TrainingJob) -> CheckpointStore:
    return open_store(checkpoint_url(job))


def _view(manifest: Any) -> CheckpointView:
    files = tuple(
        CheckpointFileView(name=name, size_bytes=entry.bytes, sha256=entry.sha256)
        for name, entry in sorted(manifest.files.items())
    )
    return CheckpointView(
        step=manifest.step,
        kind=manifest.kind,
        layers=tuple(LAYER_OF_FILE.get(f.name, f.name) for f in files),
        files=files,
        created_at=datetime.fromtimestamp(manifest.created_at, tz=UTC),
    )


def _checkpoints(job: TrainingJob) -> tuple[CheckpointView, ...]:
    checkpoint = _checkpoint_format()
    store = _store(job)
    views = []
    for name in sorted(store.names(), reverse=True):
        if checkpoint.step_of(name) is None:
            continue  # not a checkpoint's name: nothing the job saved
        try:
            views.append(_view(checkpoint.read_manifest(store, name)))
        except checkpoint.CorruptCheckpoint:
            continue  # torn, or removed by retention since the listing
    return tuple(views)


# --- the final model -----------------------------------------------------------------------------


def _inside(path: Path, root: Path) -> bool:
    return os.path.commonpath([root, path]) == str(root) and path != root


def _model_path(job: TrainingJob) -> Path | None:
    """The newest model.pt of the job: the one its finished event named, else the current attempt's.
    Only a file inside one of this job's own artifact folders is served (ingest checked the path
    against the run that sent it; it is checked again here, since it is about to leave the server)."""
    root = Path(os.path.normpath(settings.POLYCHIP_ARTIFACTS_DIR))
    own_run = root / run_key(job)
    candidates = []
    if job.artifact_path:
        candidates.append(Path(os.path.normpath(os.path.join(own_run, job.artifact_path))))
    candidates.append(own_run / MODEL_FILE)
    prefix = job_key(job)
    for path in candidates:
        if not _inside(path, root):
            continue
        folder = path.relative_to(root).parts[0]
        if (folder == prefix or folder.startswith(f"{prefix}-a")) and path.is_file():
            return path
    return None


def _sha256_of(path: Path, stat: os.stat_result) -> str:
    key = f"polychip:model-sha256:{hashlib.sha256(str(path).encode()).hexdigest()}:{stat.st_size}:{stat.st_mtime_ns}"
    cached = cache.get(key)
    if isinstance(cached, str):
        return cached
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    value = digest.hexdigest()
    cache.set(key, value, timeout=None)
    return value


def _final_model(job: TrainingJob) -> FinalModelView | None:
    path = _model_path(job)
    if path is None:
        return None
    try:
        stat = path.stat()
        return FinalModelView(size_bytes=stat.st_size, sha256=_sha256_of(path, stat))
    except FileNotFoundError:
        return None


def job_checkpoints(*, tenant_id: int, job_id: int) -> JobCheckpointsView:
    """The job's committed checkpoints, newest first, and its final model (None before there is one)."""
    job = _job(tenant_id, job_id)
    return JobCheckpointsView(checkpoints=_checkpoints(job), final_model=_final_model(job))


def model_download(*, tenant_id: int, job_id: int) -> Download:
    job = _job(tenant_id, job_id)
    path = _model_path(job)
    if path is None:
        raise ModelNotFound(job_id)
    try:
        fh = open(path, "rb")  # noqa: SIM115 (the response closes it once it is sent)
    except FileNotFoundError as exc:
        raise ModelNotFound(job_id) from exc
    size = os.fstat(fh.fileno()).st_size
    return Download(filename=f"job-{job.pk}-{MODEL_FILE}", content_type=BINARY, size_bytes=size, body=fh)


# --- a checkpoint's files ------------------------------------------------------------------------


@dataclass
class _Opened:
    file: str
    size: int
    stream: Any  # has read(n) and close(): a local file or an S3 object's body


def _open(store: CheckpointStore, name: str, file: str) -> _Opened:
    """One file of a checkpoint, opened for reading in chunks (``CheckpointStore.read`` returns it
    whole). Raises StoreError when it is not there."""
    if isinstance(store, LocalStore):
        try:
            fh = open(store.root / name / file, "rb")  # noqa: SIM115 (closed by whoever streams it)
        except OSError as exc:
            raise StoreError(f"cannot open {file} of {name}: {exc.strerror or exc}") from exc
        return _Opened(file, os.fstat(fh.fileno()).st_size, fh)
    if isinstance(store, S3Store):
        # The bucket's layout, as S3Store documents it: <prefix>/<name>/<file>.
        key = f"{store.prefix}/{name}/{file}" if store.prefix else f"{name}/{file}"
        try:
            response = store.client.get_object(Bucket=store.bucket, Key=key)
        except Exception as exc:  # botocore's errors, which this module does not import
            raise StoreError(f"cannot open {file} of {name} in {store.location}: {exc}") from exc
        return _Opened(file, int(response["ContentLength"]), response["Body"])
    data = store.read(name, file)  # another store kind: its protocol reads a file whole
    return _Opened(file, len(data), _Bytes(data))


class _Bytes:
    def __init__(self, data: bytes) -> None:
        self._data, self._at = data, 0

    def read(self, n: int) -> bytes:
        chunk = self._data[self._at : self._at + n]
        self._at += len(chunk)
        return chunk

    def close(self) -> None:
        self._data = b""


def _copy(opened: _Opened) -> Iterator[bytes]:
    left = opened.size
    while left:
        chunk = opened.stream.read(min(CHUNK, left))
        if not chunk:
            # Headers are gone already: the short body (less than Content-Length) tells the client.
            raise StoreError(f"{opened.file} ended {left} bytes early")
        left -= len(chunk)
        yield chunk


class _Closing:
    """Chunks that close the opened files when they end or when the response is closed: a generator's
    ``finally`` would not run if the client left before the first chunk."""

    def __init__(self, chunks: Iterator[bytes], opened: list[_Opened]) -> None:
        self._chunks, self._opened = chunks, opened

    def __iter__(self) -> _Closing:
        return self

    def __next__(self) -> bytes:
        try:
            return next(self._chunks)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for item in self._opened:
            item.stream.close()
        self._opened = []


def _tar(folder: str, opened: list[_Opened], mtime: int) -> tuple[list[bytes], int]:
    """Each member's tar header, and the archive's exact length."""
    headers = []
    length = 2 * tarfile.BLOCKSIZE  # the end-of-archive marker
    for item in opened:
        info = tarfile.TarInfo(f"{folder}/{item.file}")
        info.size, info.mtime, info.mode = item.size, mtime, 0o644
        header = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        headers.append(header)
        length += len(header) + item.size + _padding(item.size)
    return headers, length


def _padding(size: int) -> int:
    return -size % tarfile.BLOCKSIZE


def _tar_chunks(headers: list[bytes], opened: list[_Opened]) -> Iterator[bytes]:
    for header, item in zip(headers, opened, strict=True):
        yield header
        yield from _copy(item)
        yield bytes(_padding(item.size))
    yield bytes(2 * tarfile.BLOCKSIZE)


def checkpoint_download(*, tenant_id: int, job_id: int, step: int, file: str | None = None) -> Download:
    """Checkpoint ``step`` as one tar (its manifest and files), or its file ``file`` alone."""
    job = _job(tenant_id, job_id)
    checkpoint = _checkpoint_format()
    store = _store(job)
    try:
        name = checkpoint.checkpoint_name(step)
    except ValueError as exc:
        raise CheckpointNotFound(job_id, step) from exc
    try:
        manifest = checkpoint.read_manifest(store, name)
    except checkpoint.CorruptCheckpoint as exc:
        raise CheckpointNotFound(job_id, step) from exc
    files = [MANIFEST, *sorted(manifest.files)]
    if file is not None and file not in files:
        raise domain.Invalid(f"step {step} holds {', '.join(files)}; name one of them, or none for all", field="file")
    opened: list[_Opened] = []
    try:
        for each in [file] if file is not None else files:
            opened.append(_open(store, name, each))
            entry = manifest.files.get(each)
            if entry is not None and opened[-1].size != entry.bytes:
                raise domain.Conflict(
                    f"{each} of step {step} has {opened[-1].size} bytes where its manifest says {entry.bytes}: "
                    "the checkpoint is damaged, and a restore would skip it",
                    field="step",
                )
    except StoreError as exc:
        for item in opened:
            item.stream.close()
        raise CheckpointNotFound(job_id, step) from exc
    except BaseException:
        for item in opened:
            item.stream.close()
        raise
    if file is not None:
        return Download(
            filename=f"job-{job.pk}-{name}-{file}",
            content_type="application/json" if file == MANIFEST else BINARY,
            size_bytes=opened[0].size,
            body=_Closing(_copy(opened[0]), opened),
        )
    headers, length = _tar(name, opened, int(manifest.created_at))
    return Download(
        filename=f"job-{job.pk}-{name}.tar",
        content_type=TAR,
        size_bytes=length,
        body=_Closing(_tar_chunks(headers, opened), opened),
    )
