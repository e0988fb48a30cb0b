"""Code bundles (runtime.bundles): every way a tar.gz can reach outside its folder or blow up is refused,
with a message that names the problem; a good bundle's manifest, its unpacking and its entrypoints."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from runtime.bundles import BundleError, BundleManifest, extract_bundle, find_entrypoint, inspect_bundle

MB = 1024 * 1024
LIMIT = 8 * MB
TRAIN = b"import runtime.sdk\n\ndef main():\n    pass\n"


def member(name: str, data: bytes | None = None, **attrs) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    if data is not None:
        info.size = len(data)
    for key, value in attrs.items():
        setattr(info, key, value)
    return info, data


def symlink(name: str, target: str):
    return member(name, type=tarfile.SYMTYPE, linkname=target)


def hardlink(name: str, target: str):
    return member(name, type=tarfile.LNKTYPE, linkname=target)


def folder(name: str):
    return member(name, type=tarfile.DIRTYPE, mode=0o755)


def tar_bytes(members, fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def write_bundle(path: Path, members, *, trailer: bytes = b"") -> Path:
    path.write_bytes(gzip.compress(tar_bytes(members) + trailer))
    return path


def good_members():
    return [
        folder("./"),
        member("./train.py", TRAIN, mode=0o644),
        folder("./pkg"),
        member("./pkg/__init__.py", b""),
        member("./pkg/model.py", b"class Model: ...\n", mode=0o4755),  # setuid, executable
        member("data/sample.csv", b"x,y\n1,2\n"),  # its folder has no entry of its own
        symlink("latest.py", "train.py"),
        symlink("pkg/up.py", "../train.py"),
        hardlink("copy.py", "./train.py"),
    ]


@pytest.fixture
def good(tmp_path: Path) -> Path:
    return write_bundle(tmp_path / "good.tar.gz", good_members())


def refused(path: Path, **limits) -> str:
    with pytest.raises(BundleError) as caught:
        inspect_bundle(path, **{"max_bytes": LIMIT, **limits})
    assert caught.value.field == "bundle"
    return caught.value.message


# --- a good bundle -------------------------------------------------------------------------------


def test_a_good_bundles_manifest(good: Path):
    manifest = inspect_bundle(good, max_bytes=LIMIT)
    assert manifest.sha256 == hashlib.sha256(good.read_bytes()).hexdigest()
    assert manifest.ref == f"sha256:{manifest.sha256}"
    assert manifest.size_bytes == good.stat().st_size
    # Regular files (and the hard link, which unpacks to one), normalized and sorted; links are not files.
    assert manifest.entries == ("copy.py", "data/sample.csv", "pkg/__init__.py", "pkg/model.py", "train.py")
    assert manifest.files == 5
    assert manifest.unpacked_bytes == 2 * len(TRAIN) + len(b"class Model: ...\n") + len(b"x,y\n1,2\n")


def test_the_same_bytes_have_the_same_address(tmp_path: Path):
    one = inspect_bundle(write_bundle(tmp_path / "a.tar.gz", good_members()), max_bytes=LIMIT)
    two = inspect_bundle(write_bundle(tmp_path / "b.tar.gz", good_members()), max_bytes=LIMIT)
    other = inspect_bundle(
        write_bundle(tmp_path / "c.tar.gz", [member("train.py", TRAIN + b"# changed\n")]), max_bytes=LIMIT
    )
    assert one.sha256 == two.sha256 != other.sha256


# --- refusals: names and links -------------------------------------------------------------------


def test_path_traversal_is_refused(tmp_path: Path):
    message = refused(write_bundle(tmp_path / "b.tar.gz", [member("train.py", TRAIN), member("../x", b"boom")]))
    assert "'../x'" in message and "'..'" in message and "tar -czf" in message


def test_traversal_in_the_middle_of_a_name_is_refused(tmp_path: Path):
    message = refused(write_bundle(tmp_path / "b.tar.gz", [member("src/../../x.py", b"boom")]))
    assert "'..'" in message


def test_an_absolute_path_is_refused(tmp_path: Path):
    message = refused(write_bundle(tmp_path / "b.tar.gz", [member("train.py", TRAIN), member("/etc/x", b"boom")]))
    assert "'/etc/x'" in message and "absolute path" in message


def test_a_symlink_to_an_absolute_path_is_refused(tmp_path: Path):
    message = refused(write_bundle(tmp_path / "b.tar.gz", [member("train.py", TRAIN), symlink("pw", "/etc/passwd")]))
    assert "'pw'" in message and "'/etc/passwd'" in message and "absolute" in message


def test_a_symlink_climbing_out_is_refused(tmp_path: Path):
    message = refused(write_bundle(tmp_path / "b.tar.gz", [member("train.py", TRAIN), symlink("a", "../../x")]))
    assert "'a'" in message and "outside the bundle" in message


def test_a_symlink_out_through_another_link_is_refused(tmp_path: Path):
    # Read as text, "q/../s/.." stays inside; resolved as the kernel does, s is the top folder and its
    # parent is outside. The link that makes it so comes last, so only the whole archive shows it.
    members = [member("train.py", TRAIN), folder("q"), symlink("q/t", "../s/.."), symlink("s", ".")]
    message = refused(write_bundle(tmp_path / "b.tar.gz", members))
    assert "'q/t'" in message and "outside the bundle" in message


def test_a_file_below_a_link_is_refused(tmp_path: Path):
    members = [member("train.py", TRAIN), symlink("d", "sub"), member("d/x.py", b"x")]
    message = refused(write_bundle(tmp_path / "b.tar.gz", members))
    assert "'d/x.py'" in message and "through the link" in message


@pytest.mark.parametrize("target", ["../outside", "/etc/passwd", "missing.py"])
def test_a_hard_link_outside_or_to_nothing_is_refused(tmp_path: Path, target: str):
    message = refused(write_bundle(tmp_path / "b.tar.gz", [member("train.py", TRAIN), hardlink("h", target)]))
    assert "'h' is a hard link" in message and repr(target) in message


@pytest.mark.parametrize(
    ("kind", "words"),
    [(tarfile.CHRTYPE, "a device file"), (tarfile.BLKTYPE, "a device file"), (tarfile.FIFOTYPE, "a fifo")],
)
def test_devices_and_fifos_are_refused(tmp_path: Path, kind: bytes, words: str):
    members = [member("train.py", TRAIN), member("dev", type=kind, devmajor=1, devminor=3)]
    message = refused(write_bundle(tmp_path / "b.tar.gz", members))
    assert f"'dev' is {words}" in message


def test_the_same_name_twice_is_refused(tmp_path: Path):
    message = refused(write_bundle(tmp_path / "b.tar.gz", [member("train.py", TRAIN), symlink("./train.py", "x")]))
    assert "'train.py' appears twice" in message


def test_a_bundle_without_files_is_refused(tmp_path: Path):
    message = refused(write_bundle(tmp_path / "b.tar.gz", [folder("src"), symlink("a", "src")]))
    assert "holds no files" in message


# --- refusals: not a tar.gz ----------------------------------------------------------------------


def test_not_gzip_is_refused(tmp_path: Path):
    path = tmp_path / "b.tar.gz"
    path.write_bytes(b"print('hello')\n" * 20)
    assert refused(path).startswith("not a tar.gz: it is not gzip-compressed")


def test_an_uncompressed_tar_is_named_as_such(tmp_path: Path):
    path = tmp_path / "b.tar"
    path.write_bytes(tar_bytes([member("train.py", TRAIN)]))
    assert "uncompressed tar" in refused(path)


def test_an_empty_file_is_refused(tmp_path: Path):
    path = tmp_path / "b.tar.gz"
    path.write_bytes(b"")
    assert refused(path).startswith("not a tar.gz: it is empty")


def test_gzip_of_something_else_is_refused(tmp_path: Path):
    path = tmp_path / "b.tar.gz"
    path.write_bytes(gzip.compress(b"just some text, not a tar archive\n" * 100))
    message = refused(path)
    assert message.startswith("not a tar.gz:") and "not a tar archive" in message


def test_a_cut_short_bundle_is_refused(tmp_path: Path, good: Path):
    path = tmp_path / "cut.tar.gz"
    path.write_bytes(good.read_bytes()[:-40])
    assert refused(path).startswith("not a tar.gz:")


# --- refusals: limits ------------------------------------------------------------------------------


def test_a_bundle_over_the_size_limit_is_refused(good: Path):
    message = refused(good, max_bytes=good.stat().st_size - 1)
    assert f"larger than {good.stat().st_size - 1} bytes" in message


def test_too_many_files_are_refused(tmp_path: Path):
    members = [member(f"m{i}.py", b"x = 1\n") for i in range(5)]
    message = refused(write_bundle(tmp_path / "b.tar.gz", members), max_files=3)
    assert "more than 3 entries" in message


def test_a_compression_bomb_is_refused(tmp_path: Path):
    # 64 MB of zeros compress to about 64 KB: the file is small, what it unpacks to is not.
    path = write_bundle(tmp_path / "bomb.tar.gz", [member("train.py", TRAIN), member("zeros", bytes(64 * MB))])
    assert path.stat().st_size < MB
    message = refused(path, max_unpacked_bytes=4 * MB)
    assert "unpacks to more than 4194304 bytes" in message and "compression bomb" in message


def test_a_bomb_that_no_header_declares_is_refused_while_streaming(tmp_path: Path):
    # The headers declare a few bytes; 64 MB of zeros follow the end of the archive inside the gzip
    # stream. Only counting the bytes as they are decompressed sees them.
    path = write_bundle(tmp_path / "bomb.tar.gz", [member("train.py", TRAIN)], trailer=bytes(64 * MB))
    message = refused(path, max_unpacked_bytes=MB, max_files=10)
    assert "unpacks to more than 1048576 bytes" in message


def test_a_huge_extended_header_is_refused_before_it_is_read(tmp_path: Path):
    info, data = member("train.py", TRAIN)
    info.pax_headers = {"comment": "x" * (2 * MB)}
    message = refused(write_bundle(tmp_path / "b.tar.gz", [(info, data)]))
    assert "extended header" in message


# --- unpacking -------------------------------------------------------------------------------------


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_extract_writes_the_files_with_private_modes(tmp_path: Path, good: Path):
    dest = tmp_path / "run" / "code"
    manifest = extract_bundle(good, dest, expected_sha256=inspect_bundle(good, max_bytes=LIMIT).sha256)
    assert manifest.entries == inspect_bundle(good, max_bytes=LIMIT).entries
    assert (dest / "train.py").read_bytes() == TRAIN
    assert (dest / "copy.py").read_bytes() == TRAIN
    assert (dest / "data" / "sample.csv").read_bytes() == b"x,y\n1,2\n"
    assert os.readlink(dest / "latest.py") == "train.py"
    assert (dest / "pkg" / "up.py").read_bytes() == TRAIN  # a link inside the bundle works
    for file in ("train.py", "copy.py", "pkg/model.py", "pkg/__init__.py", "data/sample.csv"):
        assert mode_of(dest / file) == 0o600, file  # no setuid, nothing for group or others
    for directory in (".", "pkg", "data"):  # "data" had no entry: tarfile made it for the file below
        assert mode_of(dest / directory) == 0o700, directory


def test_extract_into_an_empty_folder(tmp_path: Path, good: Path):
    dest = tmp_path / "empty"
    dest.mkdir()
    extract_bundle(good, dest)
    assert (dest / "train.py").exists()


def test_extract_refuses_a_folder_with_something_in_it(tmp_path: Path, good: Path):
    dest = tmp_path / "full"
    dest.mkdir()
    (dest / "keep").write_text("mine")
    with pytest.raises(FileExistsError):
        extract_bundle(good, dest)
    assert [p.name for p in dest.iterdir()] == ["keep"]


def test_extract_checks_again_and_leaves_nothing(tmp_path: Path):
    # The bundle was checked when stored; then the file changed on disk. The good entries come first and
    # are written before the bad one is read: all of it is removed again.
    path = write_bundle(tmp_path / "b.tar.gz", [member("train.py", TRAIN), member("pkg/m.py", b"x")])
    sha = inspect_bundle(path, max_bytes=LIMIT).sha256
    write_bundle(path, [member("train.py", TRAIN), member("pkg/m.py", b"x"), symlink("escape", "../../etc")])
    dest = tmp_path / "code"
    with pytest.raises(BundleError, match="outside the bundle"):
        extract_bundle(path, dest, expected_sha256=sha)
    assert not dest.exists()


def test_extract_refuses_a_file_that_no_longer_matches_its_address(tmp_path: Path, good: Path):
    sha = inspect_bundle(good, max_bytes=LIMIT).sha256
    write_bundle(good, [member("train.py", TRAIN + b"# edited on disk\n")])
    dest = tmp_path / "code"
    dest.mkdir()
    with pytest.raises(BundleError, match="no longer matches"):
        extract_bundle(good, dest, expected_sha256=sha)
    assert list(dest.iterdir()) == []


def test_extract_refuses_a_bomb(tmp_path: Path):
    path = write_bundle(tmp_path / "bomb.tar.gz", [member("train.py", TRAIN), member("zeros", bytes(16 * MB))])
    dest = tmp_path / "code"
    with pytest.raises(BundleError, match="unpacks to more than"):
        extract_bundle(path, dest, max_unpacked_bytes=MB)
    assert not dest.exists()


# --- entrypoints ------------------------------------------------------------------------------------


MANIFEST = BundleManifest(
    sha256="ab" * 32,
    size_bytes=100,
    files=4,
    unpacked_bytes=100,
    entries=("README.md", "pkg/__init__.py", "pkg/train.py", "src/train.py"),
)


@pytest.mark.parametrize(
    ("entrypoint", "file"),
    [
        ("src/train.py", "src/train.py"),
        ("./src/train.py", "src/train.py"),
        ("pkg.train:main", "pkg/train.py"),
        ("pkg:main", "pkg/__init__.py"),
    ],
)
def test_find_entrypoint(entrypoint: str, file: str):
    assert find_entrypoint(MANIFEST, entrypoint) == file


@pytest.mark.parametrize(
    ("entrypoint", "words"),
    [
        ("train.py", "script 'train.py' is not in bundle"),
        ("pkg.missing:main", "module 'pkg.missing' is not in bundle"),
        ("../train.py", "reaches outside"),
        ("/src/train.py", "neither"),
        ("README.md", "neither"),
        ("my-pkg:main", "not 'package.module:function'"),
    ],
)
def test_find_entrypoint_refuses(entrypoint: str, words: str):
    with pytest.raises(BundleError) as caught:
        find_entrypoint(MANIFEST, entrypoint)
    assert caught.value.field == "workload.entrypoint"
    assert words in caught.value.message


def test_a_missing_entrypoint_lists_the_python_files():
    with pytest.raises(BundleError) as caught:
        find_entrypoint(MANIFEST, "main.py")
    assert "pkg/__init__.py, pkg/train.py, src/train.py" in caught.value.message
