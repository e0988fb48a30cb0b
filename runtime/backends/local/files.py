"""Small file helpers shared by the local backend and its supervisor (no torch, no Django)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def atomic_write_text(path: Path, text: str, mode: int = 0o600) -> None:
    """Write via a temp file, fsync and rename, so readers never see a half-written file.

    Owner-only (0600) unless told: rank configs carry the job's telemetry token. The control files a
    sandboxed rank must read (a stop request, its emulated speed) are 0644.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "w") as fh:
            os.fchmod(fh.fileno(), mode)  # whatever the process's umask
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_json(path: Path, data: Any, mode: int = 0o600) -> None:
    atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n", mode)


def read_json(path: Path) -> Any | None:
    """The parsed file, or None when it is missing or not (yet) valid JSON."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def tail(path: Path, max_lines: int = 15, max_chars: int = 2000) -> str:
    """The last lines of a log file, for failure reasons."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 16 * max_chars))
            data = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    text = "\n".join(data.rstrip().splitlines()[-max_lines:])
    return text[-max_chars:]
