"""Which processes still run: for the tests that check nothing is left behind."""

from __future__ import annotations

import os
from pathlib import Path


def processes_mentioning(text: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X") and text in cmdline:
            found.append(int(entry.name))
    return found
