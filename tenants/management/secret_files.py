"""Secrets the management commands hand to a person: files only their owner can read."""

from __future__ import annotations

import os
from pathlib import Path


def write_secret(path: Path, secret: str) -> None:
    """Write a secret readable by its owner only (mode 0600, also when the file existed before)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secret + "\n")
