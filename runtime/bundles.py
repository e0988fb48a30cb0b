"""Tenants' code bundles: a tar.gz of training code, checked before it is stored and again as it is unpacked.

A bundle comes from outside, so nothing in it is trusted: not its names, not its links, not the sizes its
headers declare. ``inspect_bundle`` reads the whole archive once, as a stream (never the whole file in
memory), and refuses with a ``BundleError`` that names the problem and the fix:

- anything that is not a gzip'd tar, or is truncated or corrupt;
- a file larger than the upload limit;
- absolute names, ``..`` components, a name that passes through a link or a file, the same name twice;
- symbolic links whose target is absolute or resolves (through the bundle's other links) outside it,
  and hard links to anything but an earlier regular file of the bundle;
- devices, fifos, sparse files and any other kind of entry;
- more entries than ``max_files``, or more unpacked bytes than ``max_unpacked_bytes``: counted from the
  bytes actually decompressed, so that a compression bomb stops as soon as it passes the limit;
- a bundle without a single regular file.

``extract_bundle`` unpacks a stored bundle in the same single pass that checks it again (the file on disk
may have changed since it was stored; what is written is exactly what was checked), with tarfile's
``data`` filter on top, and removes everything it wrote when any check fails.

Plain Python: no Django here (``make lint``).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import stat
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final, cast

from runtime.errors import FieldError

__all__ = [
    "DEFAULT_MAX_FILES",
    "DEFAULT_MAX_UNPACKED_BYTES",
    "BundleError",
    "BundleManifest",
    "extract_bundle",
    "find_entrypoint",
    "inspect_bundle",
]

DEFAULT_MAX_FILES: Final = 10_000
# Code, configs and a small sample of data unpack to far less; a larger archive is a data set (which
# belongs in object storage) or a compression bomb.
DEFAULT_MAX_UNPACKED_BYTES: Final = 1024 * 1024 * 1024
# A pax or GNU long-name header carries a few names and numbers; tarfile reads each whole into memory,
# so a larger one is refused before it is read.
MAX_METADATA_HEADER_BYTES: Final = 1024 * 1024
# Besides the files' bytes, a tar stream holds a header block, perhaps an extended header and padding per
# entry, and the end-of-archive blocks.
_STREAM_OVERHEAD_PER_ENTRY: Final = 4 * 1024
_STREAM_OVERHEAD: Final = 1024 * 1024
_CHUNK: Final = 1024 * 1024
# Links followed while resolving one link target (Linux's own limit); more is a loop.
_MAX_LINK_HOPS: Final = 40
FILE_MODE: Final = 0o600
DIR_MODE: Final = 0o700
_GZIP_MAGIC: Final = b"\x1f\x8b"
_MAKE_ONE: Final = "make one with `tar -czf bundle.tar.gz -C <your code folder> .`"


class BundleError(FieldError):
    """A bundle refused: ``field`` is ``bundle`` (or ``workload.entrypoint`` for a missing entrypoint)."""

    def __init__(self, message: str, field: str = "bundle") -> None:
        super().__init__(field, message)


@dataclass(frozen=True)
class BundleManifest:
    sha256: str  # of the tar.gz as stored: the bundle's content address
    size_bytes: int  # the tar.gz
    files: int  # regular files (hard links included: they unpack to files)
    unpacked_bytes: int  # their bytes, summed
    entries: tuple[str, ...]  # the regular files' names, normalized ("src/train.py"), sorted

    @property
    def ref(self) -> str:
        return f"sha256:{self.sha256}"


@dataclass(frozen=True)
class _Limits:
    max_bytes: int | None
    max_files: int
    max_unpacked_bytes: int


# --- reading: hashed, counted streams ------------------------------------------------------------


class _HashingReader:
    """The raw file, hashed and counted as it is read; refuses past ``max_bytes`` (it may have grown)."""

    def __init__(self, raw: IO[bytes], max_bytes: int | None) -> None:
        self.raw = raw
        self.max_bytes = max_bytes
        self.digest = hashlib.sha256()
        self.size = 0

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size if size is not None and size >= 0 else _CHUNK)
        self.size += len(data)
        if self.max_bytes is not None and self.size > self.max_bytes:
            raise BundleError(_too_large(self.size, self.max_bytes))
        self.digest.update(data)
        return data

    def drain(self) -> None:
        while self.read(_CHUNK):
            pass


class _CountingReader:
    """The decompressed tar stream, counted as it is read: a compression bomb stops at the cap, before
    the bytes past it are produced (a read is refused when it could pass the cap, not after)."""

    def __init__(self, source: IO[bytes], cap: int, max_unpacked_bytes: int) -> None:
        self.source = source
        self.cap = cap
        self.max_unpacked_bytes = max_unpacked_bytes
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        want = size if size is not None and size >= 0 else _CHUNK
        data = self.source.read(min(want, self.cap - self.count + 1))
        self.count += len(data)
        if self.count > self.cap:
            raise BundleError(_too_many_unpacked_bytes(self.max_unpacked_bytes))
        return data

    def drain(self) -> None:
        while self.read(_CHUNK):
            pass


class _GuardedTarInfo(tarfile.TarInfo):
    """tarfile reads an extended header (pax, GNU long name) whole into memory: refuse a huge one first."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        metadata_types = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE, b"X")
        if self.type in metadata_types and self.size > MAX_METADATA_HEADER_BYTES:
            raise BundleError(
                f"not a tar.gz that Polychip takes: an extended header of {self.size} bytes (at most "
                f"{MAX_METADATA_HEADER_BYTES} are read); {_MAKE_ONE}"
            )
        return cast(tarfile.TarInfo, super()._proc_member(tarfile_))  # type: ignore[misc]


def _too_large(size: int, max_bytes: int) -> str:
    return (
        f"the bundle is larger than {max_bytes} bytes (at least {size}), the most a bundle may be; leave data "
        "sets, checkpoints and virtual environments out of it (code only), or ask an operator to raise the limit"
    )


def _too_many_unpacked_bytes(max_unpacked_bytes: int) -> str:
    return (
        f"the bundle unpacks to more than {max_unpacked_bytes} bytes, the most a bundle may unpack to (a compression "
        "bomb, or data that belongs in object storage); keep only code and small files in it"
    )


def _not_a_tar_gz(detail: str) -> BundleError:
    return BundleError(f"not a tar.gz: {detail}; {_MAKE_ONE}")


# --- the checks, one entry at a time --------------------------------------------------------------


@dataclass
class _Walk:
    """What the stream showed so far: the names seen, by kind, and the counts."""

    limits: _Limits
    entries: int = 0
    files: dict[str, int] = field(default_factory=dict)  # regular file -> its size
    dirs: set[str] = field(default_factory=set)  # folders, declared or implied by a name below them
    links: dict[str, str] = field(default_factory=dict)  # symbolic link -> its target
    hard_links: dict[str, str] = field(default_factory=dict)  # hard link -> the regular file it names
    unpacked_bytes: int = 0

    def name_of(self, member: tarfile.TarInfo) -> str:
        """The member's normalized name ("" for the bundle's root folder); refuses unsafe names."""
        raw = member.name
        if "\x00" in raw:
            raise BundleError(f"entry {raw!r} has a NUL character in its name; rename it")
        if raw.startswith("/") or _windows_absolute(raw):
            raise BundleError(
                f"entry {raw!r} has an absolute path; a bundle's paths are relative to its top folder "
                f"(tar -C <folder> .), {_MAKE_ONE}"
            )
        parts = [p for p in raw.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise BundleError(
                f"entry {raw!r} has a '..' component, which would reach outside the bundle; use paths "
                f"inside your code folder only, {_MAKE_ONE}"
            )
        return "/".join(parts)

    def admit(self, member: tarfile.TarInfo) -> str | None:
        """Check one entry against the limits and everything before it; its name, or None to skip it."""
        name = self.name_of(member)
        if not name:
            if member.isdir():
                return None  # "./": the root folder itself
            raise BundleError(f"entry {member.name!r} has no name; {_MAKE_ONE}")
        self.entries += 1
        if self.entries > self.limits.max_files:
            raise BundleError(
                f"the bundle holds more than {self.limits.max_files} entries (files, folders and links), the "
                "most a bundle may hold; leave data sets and virtual environments out of it"
            )
        if member.ischr() or member.isblk() or member.isfifo():
            kind = "a fifo" if member.isfifo() else "a device file"
            raise BundleError(f"entry {name!r} is {kind}; a bundle holds only files, folders and links, remove it")
        if member.issparse():
            raise BundleError(f"entry {name!r} is a sparse file; tar it without --sparse")
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
            raise BundleError(
                f"entry {name!r} is of a kind Polychip does not unpack (tar type {member.type!r}); a bundle holds "
                "only files, folders and links"
            )
        self._check_place(name, member)
        if member.isdir():
            self.dirs.add(name)
        elif member.issym():
            self._check_symlink(name, member.linkname)
            self.links[name] = member.linkname
        elif member.islnk():
            target = self._check_hard_link(name, member.linkname)
            self.hard_links[name] = target
            self._add_bytes(name, self.files[target])
        else:
            self._add_bytes(name, member.size)
            self.files[name] = member.size
        return name

    def _check_place(self, name: str, member: tarfile.TarInfo) -> None:
        """No name twice, and no entry below a link or a file (it would be written through the link)."""
        parts = name.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if parent in self.links or parent in self.hard_links:
                raise BundleError(
                    f"entry {name!r} lies below {parent!r}, which is a link: unpacking it would write "
                    "through the link; put the files in a real folder"
                )
            if parent in self.files:
                raise BundleError(f"entry {name!r} lies below {parent!r}, which is a file; rename one of them")
        taken = name in self.files or name in self.links or name in self.hard_links
        if taken or (name in self.dirs and not member.isdir()):
            raise BundleError(f"entry {name!r} appears twice in the bundle; keep one")
        for depth in range(1, len(parts)):
            self.dirs.add("/".join(parts[:depth]))

    def _check_symlink(self, name: str, target: str) -> None:
        if not target or target.startswith("/") or _windows_absolute(target):
            raise BundleError(
                f"entry {name!r} is a link to {target!r}, an absolute path outside the bundle; "
                "links may point only inside the bundle, by a relative path (or copy the file in)"
            )
        if _resolve(name.split("/")[:-1], target, self.links, 0) is None:
            raise BundleError(
                f"entry {name!r} is a link to {target!r}, which points outside the bundle; "
                "links may point only inside the bundle (or copy the file in)"
            )

    def _check_hard_link(self, name: str, target: str) -> str:
        if target.startswith("/") or _windows_absolute(target):
            raise BundleError(
                f"entry {name!r} is a hard link to {target!r}, an absolute path outside the bundle; "
                "copy the file in instead"
            )
        parts = [p for p in target.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise BundleError(
                f"entry {name!r} is a hard link to {target!r}, which points outside the bundle; "
                "copy the file in instead"
            )
        normalized = "/".join(parts)
        if normalized not in self.files:
            raise BundleError(
                f"entry {name!r} is a hard link to {target!r}, which is not a file stored earlier in the bundle; "
                "copy the file in instead"
            )
        return normalized

    def _add_bytes(self, name: str, size: int) -> None:
        self.unpacked_bytes += size
        if self.unpacked_bytes > self.limits.max_unpacked_bytes:
            raise BundleError(_too_many_unpacked_bytes(self.limits.max_unpacked_bytes))

    def finish(self) -> None:
        """What only the whole archive shows: a link resolving outside through a link that came later."""
        for name, target in self.links.items():
            if _resolve(name.split("/")[:-1], target, self.links, 0) is None:
                raise BundleError(
                    f"entry {name!r} is a link to {target!r}, which points outside the bundle (through the "
                    "bundle's other links); links may point only inside the bundle"
                )
        if not self.files and not self.hard_links:
            raise BundleError(f"the bundle holds no files; put your training code in it, {_MAKE_ONE}")

    def manifest(self, sha256: str, size_bytes: int) -> BundleManifest:
        names = sorted([*self.files, *self.hard_links])
        return BundleManifest(
            sha256=sha256,
            size_bytes=size_bytes,
            files=len(names),
            unpacked_bytes=self.unpacked_bytes,
            entries=tuple(names),
        )


def _windows_absolute(name: str) -> bool:
    """``C:/x`` or ``C:\\x``: absolute wherever the bundle might be unpacked by someone else's tools."""
    return len(name) >= 2 and name[1] == ":" and name[0].isalpha()


def _resolve(base: list[str], target: str, links: dict[str, str], hops: int) -> list[str] | None:
    """Where ``target``, relative to the folder ``base``, leads once the bundle's own links are followed;
    None when it leaves the bundle (or loops). Resolved as the kernel would, one component at a time, so a
    ``..`` after a link climbs from where the link points, not from where it lies."""
    if target.startswith("/"):
        return None
    here = list(base)
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not here:
                return None
            here.pop()
            continue
        candidate = "/".join([*here, part])
        if candidate in links:
            if hops >= _MAX_LINK_HOPS:
                return None
            resolved = _resolve(here, links[candidate], links, hops + 1)
            if resolved is None:
                return None
            here = resolved
        else:
            here.append(part)
    return here


# --- one pass over the archive --------------------------------------------------------------------


def _walk(
    path: Path, limits: _Limits, on_member: Callable[[tarfile.TarFile, tarfile.TarInfo, str], int]
) -> BundleManifest:
    """Read the bundle once, checking every entry; ``on_member`` reads (or writes out) each regular file and
    answers how many bytes it had. Any problem is a ``BundleError``."""
    with open(path, "rb") as raw:
        head = raw.read(len(_GZIP_MAGIC))
        if head != _GZIP_MAGIC:
            raw.seek(0)
            start = raw.read(265)
            if len(start) == 265 and start[257:262] == b"ustar":
                raise _not_a_tar_gz("it is an uncompressed tar; compress it with gzip")
            raise _not_a_tar_gz("it is not gzip-compressed" if head else "it is empty")
        raw.seek(0)
        hashed = _HashingReader(raw, limits.max_bytes)
        walk = _Walk(limits)
        cap = limits.max_unpacked_bytes + limits.max_files * _STREAM_OVERHEAD_PER_ENTRY + _STREAM_OVERHEAD
        try:
            with gzip.GzipFile(fileobj=cast(IO[bytes], hashed), mode="rb") as unzipped:
                counted = _CountingReader(cast(IO[bytes], unzipped), cap, limits.max_unpacked_bytes)
                with tarfile.open(
                    fileobj=cast(IO[bytes], counted), mode="r|", tarinfo=_GuardedTarInfo, errorlevel=2
                ) as tar:
                    for member in tar:
                        name = walk.admit(member)
                        if name is None:
                            continue
                        read = on_member(tar, member, name)
                        if member.isreg() and read != member.size:
                            raise _not_a_tar_gz(f"entry {name!r} is cut short ({read} of {member.size} bytes)")
                # Past the end-of-archive blocks: the rest of the gzip stream, so that its checksum is
                # verified (a corrupt or cut-short file is refused) and every byte is hashed.
                counted.drain()
            hashed.drain()
        except BundleError:
            raise
        except (tarfile.TarError, gzip.BadGzipFile, zlib.error, EOFError) as exc:
            raise _not_a_tar_gz(_describe(exc)) from None
    walk.finish()
    return walk.manifest(hashed.digest.hexdigest(), hashed.size)


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, EOFError):
        return "the file is cut short (the gzip stream ends early)"
    if isinstance(exc, tarfile.ReadError) and text in ("empty file", "invalid header", "bad checksum"):
        return f"the gzip'd data is not a tar archive ({text})"
    return text


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo, name: str) -> int:
    """Read a regular file's bytes through (counting them), without keeping them."""
    if not member.isreg():
        return 0
    source = tar.extractfile(member)
    if source is None:
        return 0
    count = 0
    while chunk := source.read(_CHUNK):
        count += len(chunk)
    return count


def inspect_bundle(
    path: Path | str,
    *,
    max_bytes: int,
    max_files: int = DEFAULT_MAX_FILES,
    max_unpacked_bytes: int = DEFAULT_MAX_UNPACKED_BYTES,
) -> BundleManifest:
    """Check a bundle file without unpacking it; its manifest, or a ``BundleError`` naming the problem."""
    path = Path(path)
    size = path.stat().st_size
    if size > max_bytes:
        raise BundleError(_too_large(size, max_bytes))
    return _walk(path, _Limits(max_bytes, max_files, max_unpacked_bytes), _read_member)


# --- unpacking -------------------------------------------------------------------------------------


def _safe_modes(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """tarfile's ``data`` filter (no absolute names, nothing outside ``dest``, no special files, no owners),
    then Polychip's modes: files read-write for their owner only, folders the owner's, no setuid bits."""
    vetted = tarfile.data_filter(member, dest)
    if vetted.isreg() or vetted.islnk():
        return vetted.replace(mode=FILE_MODE, deep=False)
    if vetted.isdir():
        return vetted.replace(mode=DIR_MODE, deep=False)
    return vetted


def extract_bundle(
    path: Path | str,
    dest: Path | str,
    *,
    expected_sha256: str | None = None,
    max_bytes: int | None = None,
    max_files: int = DEFAULT_MAX_FILES,
    max_unpacked_bytes: int = DEFAULT_MAX_UNPACKED_BYTES,
) -> BundleManifest:
    """Unpack a bundle into ``dest`` (a folder that does not exist yet, or an empty one), checking every
    entry again as it goes; on any refusal everything written is removed and ``BundleError`` raised.

    ``expected_sha256``: the bundle's content address; a file that no longer hashes to it is refused (and
    what was unpacked removed). Files end up 0600 and folders 0700, owned by whoever unpacks."""
    path, dest = Path(path), Path(dest)
    created = not dest.exists()
    if created:
        dest.mkdir(mode=DIR_MODE, parents=True)
    elif not dest.is_dir() or any(dest.iterdir()):
        raise FileExistsError(f"{dest} must not exist or be an empty folder to unpack a bundle into")
    root = os.path.realpath(dest)
    limits = _Limits(max_bytes, max_files, max_unpacked_bytes)

    def write(tar: tarfile.TarFile, member: tarfile.TarInfo, name: str) -> int:
        try:
            vetted = _safe_modes(member.replace(name=name, deep=False), root)
        except tarfile.FilterError as exc:
            raise BundleError(f"entry {name!r} refused: {exc}; links and paths must stay inside the bundle") from None
        try:
            tar.extract(vetted, root, set_attrs=True, filter="fully_trusted")
        except OSError as exc:
            raise BundleError(
                f"entry {name!r} could not be unpacked: {exc.strerror or exc}; rename or remove it"
            ) from None
        if vetted.isreg():
            return os.lstat(os.path.join(root, name)).st_size
        return 0

    try:
        manifest = _walk(path, limits, write)
        if expected_sha256 is not None and manifest.sha256 != expected_sha256:
            raise BundleError(
                f"the stored bundle no longer matches its address sha256:{expected_sha256} (it changed on disk); "
                "upload it again"
            )
        _settle_modes(root)
    except BaseException:
        _remove_contents(dest, remove_root=created)
        raise
    return manifest


def _settle_modes(root: str) -> None:
    """Folders that tarfile made for a name below them (no entry of their own) get 0700 too."""
    os.chmod(root, DIR_MODE)
    for folder, dirnames, filenames in os.walk(root):
        for d in dirnames:
            full = os.path.join(folder, d)
            if not os.path.islink(full):
                os.chmod(full, DIR_MODE)
        for f in filenames:
            full = os.path.join(folder, f)
            if stat.S_ISREG(os.lstat(full).st_mode):
                os.chmod(full, FILE_MODE)


def _remove_contents(dest: Path, *, remove_root: bool) -> None:
    if remove_root:
        shutil.rmtree(dest, ignore_errors=True)
        return
    for child in list(dest.iterdir()):
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


# --- entrypoints -----------------------------------------------------------------------------------


def _entrypoint_error(message: str) -> BundleError:
    return BundleError(message, field="workload.entrypoint")


def find_entrypoint(manifest: BundleManifest, entrypoint: str) -> str:
    """The bundle file that ``entrypoint`` names: ``pkg.mod:main`` is ``pkg/mod.py`` or
    ``pkg/mod/__init__.py``; a script path (``train.py``, ``./src/train.py``) is itself. ``BundleError``
    (field ``workload.entrypoint``) when the bundle has no such file, listing the Python files it has."""
    entries = set(manifest.entries)
    module, colon, function = entrypoint.partition(":")
    if colon:
        parts = module.split(".")
        if not all(p.isidentifier() for p in parts) or not all(p.isidentifier() for p in function.split(".")):
            raise _entrypoint_error(
                f"{entrypoint!r} is not 'package.module:function' (names of Python identifiers), nor a script path"
            )
        candidates = ["/".join(parts) + ".py", "/".join([*parts, "__init__.py"])]
        found = next((c for c in candidates if c in entries), None)
        if found is None:
            raise _entrypoint_error(
                f"module {module!r} is not in bundle sha256:{manifest.sha256[:12]}: it has neither "
                f"{candidates[0]} nor {candidates[1]}; {_python_files(manifest)}"
            )
        return found
    raw = entrypoint
    if raw.startswith("/") or not raw.endswith(".py"):
        raise _entrypoint_error(
            f"{entrypoint!r} is neither 'package.module:function' nor a script path inside the bundle "
            "such as 'train.py' or 'src/train.py'"
        )
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _entrypoint_error(f"{entrypoint!r} reaches outside the bundle ('..'); name a script inside it")
    script = "/".join(parts)
    if script not in entries:
        raise _entrypoint_error(
            f"script {script!r} is not in bundle sha256:{manifest.sha256[:12]}; {_python_files(manifest)}"
        )
    return script


def _python_files(manifest: BundleManifest, shown: int = 10) -> str:
    names = [e for e in manifest.entries if e.endswith(".py")]
    if not names:
        return "the bundle holds no Python files"
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return "its Python files are " + ", ".join(names[:shown]) + more
