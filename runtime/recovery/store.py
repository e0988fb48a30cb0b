"""Where checkpoint files live: a local directory or an S3-compatible bucket.

A checkpoint is a named set of files plus a manifest (``manifest.json``). The manifest is always the
last thing to become visible, so its presence is the commit marker: a reader that lists only names
with a manifest never sees a checkpoint whose commit died half-way. What such a commit leaves
behind is invisible to ``names()`` and removed by ``clean_partial()``.

This module imports no torch, and boto3 only when an ``S3Store`` is made without a client, so the
control plane can open, list and clean stores without either.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

MANIFEST = "manifest.json"
ENDPOINT_ENV = "POLYCHIP_S3_ENDPOINT_URL"

# Hidden entries of a LocalStore's root: a commit being written, a checkpoint on its way out, and the
# previous version of a name being replaced. All three are leftovers once their writer is gone.
_PARTIAL = ".partial-"
_DELETING = ".deleting-"
_REPLACED = ".replaced-"
# Directories a store's root may hold that no checkpoint left: a dedicated volume's mount point has one.
_NOT_CHECKPOINTS = frozenset({"lost+found"})

_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}")
_BUCKET_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]{1,61}[A-Za-z0-9]")
# S3's DeleteObjects takes at most this many keys a request.
_DELETE_BATCH = 1000


class StoreError(RuntimeError):
    """A store that cannot do what was asked: a missing or unreadable file, a failed write, no boto3."""


class CheckpointStore(Protocol):
    """The few operations checkpointing needs, so a local directory and a bucket are interchangeable."""

    location: str

    def names(self) -> list[str]:
        """The committed checkpoints (those whose manifest exists), sorted."""
        ...

    def commit(self, name: str, files: Mapping[str, bytes], manifest: bytes) -> None:
        """Store ``files`` and then ``manifest`` under ``name``: a reader sees all of it or nothing.
        Committing a name that exists (a retry of the same step) replaces it."""
        ...

    def read(self, name: str, file: str) -> bytes:
        """One file of a checkpoint (``manifest.json`` included); StoreError when missing or unreadable."""
        ...

    def delete(self, name: str) -> None:
        """Remove a checkpoint; nothing to do when it is already gone."""
        ...

    def clean_partial(self) -> int:
        """Remove what commits that died half-way left behind; how many such leftovers went.

        Call it only while no commit to this store is in flight (a job's start, before it saves):
        a commit in progress looks exactly like one that died."""
        ...


_NAME_RULE = "1-200 letters, digits, '_', '-' or '.', not starting with '.' or '-'"


def _check_name(name: str) -> None:
    # One path segment that cannot hide (no leading dot) or climb out of the store (no separators).
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(f"checkpoint name {name!r} must be {_NAME_RULE}")


def _check_file(file: str) -> None:
    if not isinstance(file, str) or not _NAME_RE.fullmatch(file):
        raise ValueError(f"checkpoint file name {file!r} must be {_NAME_RULE}")


def _check_files(files: Mapping[str, bytes]) -> None:
    for file in files:
        _check_file(file)
        if file == MANIFEST:
            raise ValueError(f"{MANIFEST} is the commit marker; pass it as the manifest, not among the files")


# --- a local directory -----------------------------------------------------------------------------


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "xb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    """Make the entries of ``path`` (a rename into it) durable; some filesystems cannot, which only
    weakens durability after a power loss, never the all-or-nothing view of a running reader."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _hidden_owner(entry: str, marker: str) -> str | None:
    """The checkpoint name inside ``<marker><name>-<pid>-<random>``, or None when it is not one."""
    if not entry.startswith(marker):
        return None
    parts = entry[len(marker) :].rsplit("-", 2)
    return parts[0] if len(parts) == 3 and parts[0] else None


class LocalStore:
    """Checkpoints as directories ``root/<name>/`` on a local or shared filesystem.

    A commit writes every file, then the manifest, into a hidden ``.partial-*`` directory, fsyncs
    each, and renames the directory into place: a rename is atomic, so ``root/<name>`` either does
    not exist or is complete. The root belongs to the store: ``clean_partial`` removes any directory
    in it that lacks a manifest (a checkpoint copied in half-way), ``lost+found`` excepted.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.location = str(self.root)

    def __repr__(self) -> str:
        return f"LocalStore({self.location!r})"

    def _hidden(self, marker: str, name: str) -> Path:
        return self.root / f"{marker}{name}-{os.getpid()}-{secrets.token_hex(4)}"

    def names(self) -> list[str]:
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StoreError(f"cannot list {self.location}: {exc}") from exc
        return sorted(
            entry.name
            for entry in entries
            if not entry.name.startswith(".")
            and entry.is_dir(follow_symlinks=False)
            and os.path.isfile(os.path.join(entry.path, MANIFEST))
        )

    def commit(self, name: str, files: Mapping[str, bytes], manifest: bytes) -> None:
        _check_name(name)
        _check_files(files)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            temp = self._hidden(_PARTIAL, name)
            temp.mkdir()
            try:
                for file, data in files.items():
                    _write_synced(temp / file, data)
                _write_synced(temp / MANIFEST, manifest)  # last: the commit marker
                _fsync_dir(temp)
                self._move_into_place(temp, name)
            except BaseException:
                shutil.rmtree(temp, ignore_errors=True)
                raise
        except OSError as exc:
            raise StoreError(f"cannot commit {name} to {self.location}: {exc}") from exc

    def _move_into_place(self, temp: Path, name: str) -> None:
        final = self.root / name
        if not os.path.lexists(final):
            os.rename(temp, final)
            _fsync_dir(self.root)
            return
        # A retry of the same name. A directory cannot be renamed over a non-empty one, so the old one
        # steps aside first; a reader in between sees no checkpoint of that name, never a mixed one,
        # and a crash in between leaves a .replaced-* that clean_partial puts back.
        old = self._hidden(_REPLACED, name)
        os.rename(final, old)
        os.rename(temp, final)
        _fsync_dir(self.root)
        _remove(old)

    def read(self, name: str, file: str) -> bytes:
        _check_name(name)
        _check_file(file)
        try:
            return (self.root / name / file).read_bytes()
        except OSError as exc:
            raise StoreError(f"cannot read {file} of {name} in {self.location}: {exc.strerror or exc}") from exc

    def delete(self, name: str) -> None:
        _check_name(name)
        final = self.root / name
        # Renamed away first, so the checkpoint vanishes at once instead of file by file.
        doomed = self._hidden(_DELETING, name)
        try:
            os.rename(final, doomed)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StoreError(f"cannot delete {name} from {self.location}: {exc}") from exc
        _fsync_dir(self.root)
        try:
            _remove(doomed)
        except OSError as exc:
            raise StoreError(f"deleted {name} from {self.location} but cannot remove {doomed.name}: {exc}") from exc

    def clean_partial(self) -> int:
        try:
            entries = sorted(os.scandir(self.root), key=lambda entry: entry.name)
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise StoreError(f"cannot list {self.location}: {exc}") from exc
        removed = 0
        try:
            for entry in entries:
                path = Path(entry.path)
                owner = _hidden_owner(entry.name, _REPLACED)
                if owner is not None and not os.path.lexists(self.root / owner):
                    # The commit that replaced it died between its two renames: the old one is
                    # still the newest complete version of that name.
                    os.rename(path, self.root / owner)
                    continue
                torn = not entry.name.startswith(".") and entry.name not in _NOT_CHECKPOINTS
                torn = torn and entry.is_dir(follow_symlinks=False) and not (path / MANIFEST).is_file()
                if owner is not None or torn or entry.name.startswith((_PARTIAL, _DELETING)):
                    _remove(path)
                    removed += 1
        except OSError as exc:
            raise StoreError(f"cannot clean {self.location}: {exc}") from exc
        if removed:
            _fsync_dir(self.root)
        return removed


# --- an S3-compatible bucket -----------------------------------------------------------------------


def _make_s3_client(endpoint_url: str | None) -> Any:
    try:
        import boto3
    except ImportError as exc:
        raise StoreError("the S3 checkpoint store needs boto3: pip install 'polychip[s3]'") from exc
    return boto3.client("s3", endpoint_url=endpoint_url)


def _client_errors() -> tuple[type[BaseException], ...]:
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:  # an injected client without botocore: anything it raises is a store failure
        return (Exception,)
    return (BotoCoreError, ClientError)


class S3Store:
    """Checkpoints as objects ``<prefix>/<name>/<file>`` in an S3-compatible bucket (AWS, MinIO, Ceph...).

    S3 has no rename, so the manifest object is the commit marker: it is put after every file, and
    taken away first on delete or replace. S3's strong read-after-write consistency makes a listed
    manifest's files readable at once.
    """

    page_size = 1000  # keys per listing request: S3's maximum (tests lower it to exercise the paging)

    def __init__(
        self, bucket: str, prefix: str = "", endpoint_url: str | None = None, client: Any | None = None
    ) -> None:
        if not isinstance(bucket, str) or not _BUCKET_RE.fullmatch(bucket):
            raise ValueError(f"S3 bucket name {bucket!r} must be 3-63 letters, digits, '.', '_' or '-'")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        self.client = client if client is not None else _make_s3_client(endpoint_url)
        self._errors = _client_errors()
        self.location = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"

    def __repr__(self) -> str:
        endpoint = f", endpoint_url={self.endpoint_url!r}" if self.endpoint_url else ""
        return f"S3Store({self.location!r}{endpoint})"

    def _root(self) -> str:
        return f"{self.prefix}/" if self.prefix else ""

    def _key(self, name: str, file: str) -> str:
        return f"{self._root()}{name}/{file}"

    def _keys_under(self, prefix: str) -> list[str]:
        keys: list[str] = []
        paginator = self.client.get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=self.bucket, Prefix=prefix, PaginationConfig={"PageSize": self.page_size})
        for page in pages:
            keys.extend(obj["Key"] for obj in page.get("Contents", ()))
        return keys

    def _listing(self) -> dict[str, set[str]]:
        """Every ``<name>/<file>`` directly under the prefix, as name -> files; deeper keys are not ours."""
        root = self._root()
        try:
            keys = self._keys_under(root)
        except self._errors as exc:
            raise StoreError(f"cannot list {self.location}: {exc}") from exc
        listing: dict[str, set[str]] = {}
        for key in keys:
            parts = key[len(root) :].split("/")
            if len(parts) == 2 and parts[0] and parts[1]:
                listing.setdefault(parts[0], set()).add(parts[1])
        return listing

    def names(self) -> list[str]:
        return sorted(name for name, files in self._listing().items() if MANIFEST in files and _NAME_RE.fullmatch(name))

    def commit(self, name: str, files: Mapping[str, bytes], manifest: bytes) -> None:
        _check_name(name)
        _check_files(files)
        # A retry of the same name: the old manifest goes first, so no reader pairs it with new files.
        self.delete(name)
        try:
            for file, data in files.items():
                self.client.put_object(Bucket=self.bucket, Key=self._key(name, file), Body=data)
            self.client.put_object(Bucket=self.bucket, Key=self._key(name, MANIFEST), Body=manifest)
        except self._errors as exc:
            # Best effort: what did get written is invisible anyway, and clean_partial catches the rest.
            with contextlib.suppress(StoreError):
                self.delete(name)
            raise StoreError(f"cannot commit {name} to {self.location}: {exc}") from exc

    def read(self, name: str, file: str) -> bytes:
        _check_name(name)
        _check_file(file)
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(name, file))
            body = response["Body"]
            try:
                data: bytes = body.read()
            finally:
                body.close()
        except self._errors as exc:
            raise StoreError(f"cannot read {file} of {name} in {self.location}: {exc}") from exc
        return data

    def delete(self, name: str) -> None:
        _check_name(name)
        manifest_key = self._key(name, MANIFEST)
        try:
            keys = self._keys_under(self._key(name, ""))
            if manifest_key in keys:
                # First and alone: from here on the checkpoint is not listed, whatever else fails.
                self.client.delete_object(Bucket=self.bucket, Key=manifest_key)
            rest = [key for key in keys if key != manifest_key]
            for start in range(0, len(rest), _DELETE_BATCH):
                batch = rest[start : start + _DELETE_BATCH]
                response = self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": key} for key in batch], "Quiet": True}
                )
                errors = response.get("Errors") or []
                if errors:
                    first = errors[0]
                    raise StoreError(
                        f"cannot delete {first.get('Key')} from {self.location}: {first.get('Code')} "
                        f"{first.get('Message')} ({len(errors)} objects failed)"
                    )
        except self._errors as exc:
            raise StoreError(f"cannot delete {name} from {self.location}: {exc}") from exc

    def clean_partial(self) -> int:
        torn = [name for name, files in self._listing().items() if MANIFEST not in files and _NAME_RE.fullmatch(name)]
        for name in torn:
            self.delete(name)
        return len(torn)


# --- from a URL ------------------------------------------------------------------------------------


def open_store(url: str) -> CheckpointStore:
    """The store a URL names: ``s3://bucket/some/prefix`` (optionally ``?endpoint=http://host:port``,
    else ``$POLYCHIP_S3_ENDPOINT_URL``, else boto3's default endpoint), ``file:///abs/path`` or a
    plain directory path. A URL that cannot be used raises ValueError saying what to fix."""
    usage = "use s3://bucket/prefix, file:///absolute/path or a plain directory path"
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"the checkpoint store URL is empty; {usage}")
    url = url.strip()
    if "://" not in url:
        if url.lower().startswith(("file:", "s3:")):
            raise ValueError(f"{url!r}: write file:///absolute/path or s3://bucket/prefix, with the two slashes")
        return LocalStore(url)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{url!r}: file URLs name a local path, so the host must be empty (file:///abs/path)")
        if parts.query or parts.fragment:
            raise ValueError(f"{url!r}: a file URL takes no query or fragment; percent-encode '?' and '#' in the path")
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise ValueError(f"{url!r}: a file URL needs an absolute path (file:///abs/path)")
        return LocalStore(path)
    if scheme == "s3":
        return _open_s3(url, parts.netloc, parts.path, parts.query, parts.fragment)
    raise ValueError(f"{url!r}: unsupported scheme {scheme!r}; {usage}")


def _open_s3(url: str, bucket: str, path: str, query: str, fragment: str) -> S3Store:
    if not bucket:
        raise ValueError(f"{url!r}: no bucket; write s3://bucket/prefix")
    if not _BUCKET_RE.fullmatch(bucket):
        raise ValueError(f"{url!r}: bucket {bucket!r} must be 3-63 letters, digits, '.', '_' or '-'")
    if fragment:
        raise ValueError(f"{url!r}: an s3 URL takes no fragment ('#...')")
    try:
        params = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as exc:
        raise ValueError(
            f"{url!r}: unreadable query {query!r}; the only parameter is ?endpoint=http://host:port"
        ) from exc
    unknown = sorted(set(params) - {"endpoint"})
    if unknown:
        raise ValueError(f"{url!r}: unknown parameter {unknown[0]!r}; the only parameter is ?endpoint=http://host:port")
    endpoint: str | None = None
    if "endpoint" in params:
        values = params["endpoint"]
        if len(values) != 1:
            raise ValueError(f"{url!r}: give endpoint once")
        endpoint = values[0]
        split = urlsplit(endpoint)
        if split.scheme not in ("http", "https") or not split.netloc:
            raise ValueError(f"{url!r}: endpoint {endpoint!r} must be an http:// or https:// URL with a host")
    else:
        endpoint = os.environ.get(ENDPOINT_ENV) or None
    return S3Store(bucket, unquote(path).strip("/"), endpoint_url=endpoint)
