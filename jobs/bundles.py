"""Tenants' code bundles: uploads checked (``runtime.bundles``), stored content-addressed per tenant, found by
reference when a job names one.

A bundle is a file ``POLYCHIP_BUNDLES_DIR/<tenant id>/<sha256>.tar.gz`` (folders 0700, files 0600) and a
``Bundle`` row. An upload is streamed to a temporary file in the tenant's folder, hashed and counted as it
comes (it stops at the limit), inspected, and only then renamed to its address and recorded; any refusal
leaves no file, no row and no temporary file behind. The same bytes uploaded again by the same tenant are
the same bundle. Another tenant's bundle is never found: it answers as a missing one.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import Final, Protocol

from django.conf import settings
from django.db import transaction

from controlplane import domain
from jobs.contracts import BundleView
from jobs.models import Bundle
from runtime.bundles import BundleError, BundleManifest, find_entrypoint, inspect_bundle

_CHUNK: Final = 1024 * 1024
_SHA256: Final = re.compile(r"^[0-9a-f]{64}$")
_REF: Final = re.compile(r"^sha256:([0-9a-f]{64})$")
MAX_NAME_CHARS: Final = 255
_UPLOAD_PREFIX: Final = ".upload-"


class Readable(Protocol):
    """What an upload is read from: an uploaded file, or the request itself (its raw body)."""

    def read(self, size: int, /) -> bytes: ...


class BundleRefused(domain.Invalid):
    """An upload that is not a bundle Polychip takes (400); the message names the problem and the fix."""

    code = "invalid_bundle"
    field = "bundle"


class BundleTooLarge(BundleRefused):
    code = "too_large"


class BundleNotFound(domain.NotFound, LookupError):
    """No such bundle for this tenant (another tenant's answers exactly like a missing one)."""

    def __init__(self, sha256: str) -> None:
        super().__init__(f"no bundle sha256:{sha256}; GET /api/v1/bundles lists yours")
        self.sha256 = sha256


def max_bytes() -> int:
    return int(settings.POLYCHIP_BUNDLE_MAX_BYTES)


def _too_large() -> BundleTooLarge:
    return BundleTooLarge(
        f"the bundle is larger than {max_bytes()} bytes, the most a bundle may be; leave data sets, checkpoints "
        "and virtual environments out of it (code only), or ask an operator to raise POLYCHIP_BUNDLE_MAX_BYTES"
    )


def _tenant_folder(tenant_id: int) -> Path:
    """The tenant's folder, made private (0700, as is the store's own) when it is made."""
    root = Path(settings.POLYCHIP_BUNDLES_DIR)
    folder = root / str(tenant_id)
    for path in (root, folder):
        if not path.is_dir():
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(path, 0o700)  # mkdir's mode passes through the umask
    return folder


def _file_of(tenant_id: int, sha256: str) -> Path:
    return Path(settings.POLYCHIP_BUNDLES_DIR) / str(tenant_id) / f"{sha256}.tar.gz"


def _view(row: Bundle, *, entries: tuple[str, ...] | None = None, created: bool = False) -> BundleView:
    return BundleView(
        tenant_id=row.tenant_id,
        sha256=row.sha256,
        size_bytes=row.size_bytes,
        files=row.files,
        unpacked_bytes=row.unpacked_bytes,
        name=row.name,
        created_at=row.created_at,
        entries=entries,
        created=created,
    )


def _clean_name(name: str | None) -> str:
    name = (name or "").strip()
    if len(name) > MAX_NAME_CHARS or any(ord(c) < 32 for c in name):
        raise domain.Invalid(
            f"a bundle's name is at most {MAX_NAME_CHARS} printable characters; got {len(name)} characters",
            field="name",
        )
    return name


def _receive(upload_file: Readable, folder: Path) -> tuple[Path, str, int]:
    """Stream the upload into a private temporary file in ``folder``: its path, sha256 and size. Refuses
    (removing the file) as soon as it passes the limit."""
    limit = max_bytes()
    fd, name = tempfile.mkstemp(prefix=_UPLOAD_PREFIX, suffix=".part", dir=folder)  # 0600
    path = Path(name)
    digest = hashlib.sha256()
    size = 0
    try:
        with os.fdopen(fd, "wb") as out:
            while chunk := upload_file.read(_CHUNK):
                size += len(chunk)
                if size > limit:
                    raise _too_large()
                digest.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())  # on disk before it is recorded as stored
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path, digest.hexdigest(), size


def store_bundle(*, tenant_id: int, user_id: int | None, upload_file: Readable, name: str | None) -> BundleView:
    """Check and store an uploaded tar.gz; its view, ``created`` False when the tenant already had these
    bytes. ``BundleRefused`` (400, field ``bundle``) for anything ``runtime.bundles`` refuses, with nothing
    stored."""
    name = _clean_name(name)
    folder = _tenant_folder(tenant_id)
    temporary, sha256, size = _receive(upload_file, folder)
    try:
        if size == 0:
            raise BundleRefused(
                "the upload is empty; send the tar.gz as the request body or as the form field 'bundle'"
            )
        try:
            manifest = inspect_bundle(temporary, max_bytes=max_bytes())
        except BundleError as exc:
            raise BundleRefused(exc.message) from None
        if manifest.sha256 != sha256:  # the file under inspection is ours alone: this is a broken disk
            raise BundleRefused("the bundle changed while it was being checked; upload it again")
        # Renamed into place even when the row exists: the same bytes, so a file that went missing comes back.
        os.replace(temporary, _file_of(tenant_id, sha256))
    finally:
        temporary.unlink(missing_ok=True)
    return _record(tenant_id=tenant_id, user_id=user_id, manifest=manifest, name=name)


def _record(*, tenant_id: int, user_id: int | None, manifest: BundleManifest, name: str) -> BundleView:
    with transaction.atomic():
        row, created = Bundle.objects.get_or_create(
            tenant_id=tenant_id,
            sha256=manifest.sha256,
            defaults={
                "size_bytes": manifest.size_bytes,
                "unpacked_bytes": manifest.unpacked_bytes,
                "files": manifest.files,
                "name": name,
                "uploaded_by_id": user_id,
            },
        )
    return _view(row, entries=manifest.entries, created=created)


def _sha256_of(value: str) -> str | None:
    value = value.removeprefix("sha256:")
    return value if _SHA256.match(value) else None


def get_bundle(*, tenant_id: int, sha256: str) -> BundleView:
    """One of the tenant's bundles (``<hex>`` or ``sha256:<hex>``), with its files' names read from the
    stored archive; ``BundleNotFound`` (404) for a malformed address, a missing one or another tenant's."""
    digest = _sha256_of(sha256)
    row = Bundle.scoped.for_tenant(tenant_id).filter(sha256=digest).first() if digest else None
    if row is None:
        raise BundleNotFound(sha256.removeprefix("sha256:")[:64])
    try:
        entries: tuple[str, ...] | None = inspect_bundle(
            _file_of(tenant_id, row.sha256), max_bytes=max(max_bytes(), row.size_bytes)
        ).entries
    except (OSError, BundleError):
        entries = None  # the row stands; bundle_path says what is wrong with its file when a job needs it
    return _view(row, entries=entries)


def list_bundles(*, tenant_id: int) -> list[BundleView]:
    """The tenant's bundles, newest first (without their files' names: a listing reads only the rows)."""
    rows = Bundle.scoped.for_tenant(tenant_id).order_by("-created_at", "-pk")
    return [_view(row) for row in rows]


def bundle_path(*, tenant_id: int, ref: str) -> Path:
    """The stored file of the tenant's bundle ``ref`` ("sha256:<64 hex>"), for a job that names it.

    ``domain.Invalid`` (field ``workload.bundle``) when the reference is malformed, when the tenant has no
    such bundle (another tenant's is no such bundle), or when its file has gone from the store."""
    match = _REF.match(ref) if isinstance(ref, str) else None
    if match is None:
        raise _spec_error(
            f'{ref!r} is not a bundle reference: write "sha256:<64 hex digits>", as POST /api/v1/bundles answered'
        )
    sha256 = match.group(1)
    if not Bundle.scoped.for_tenant(tenant_id).filter(sha256=sha256).exists():
        raise _spec_error(
            f"no such bundle {ref}; upload your code with POST /api/v1/bundles and use the address it answers "
            "(GET /api/v1/bundles lists yours)"
        )
    path = _file_of(tenant_id, sha256)
    if not path.is_file():
        raise _spec_error(f"bundle {ref} is recorded but its file is gone from the store; upload the same tar.gz again")
    return path


def bundle_entrypoint(*, tenant_id: int, ref: str, entrypoint: str) -> str:
    """The file inside the tenant's bundle ``ref`` that ``entrypoint`` names (``pkg.mod:main`` or a script
    path), read from the stored archive; ``domain.Invalid`` naming ``workload.bundle`` or
    ``workload.entrypoint`` when there is none."""
    path = bundle_path(tenant_id=tenant_id, ref=ref)
    try:
        manifest = inspect_bundle(path, max_bytes=max(max_bytes(), path.stat().st_size))
        return find_entrypoint(manifest, entrypoint)
    except BundleError as exc:
        field = exc.field if exc.field == "workload.entrypoint" else "workload.bundle"
        raise _spec_error(exc.message, field=field) from None


def _spec_error(message: str, *, field: str = "workload.bundle") -> domain.Invalid:
    """A job spec naming a bundle it cannot use: answered like the spec's other errors (400 invalid_spec)."""
    return domain.Invalid(message, field=field, code="invalid_spec")
