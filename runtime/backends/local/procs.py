"""Process helpers: liveness that is not fooled by zombies or reused pids."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
from pathlib import Path

_PROC = Path("/proc")


def pid_alive(pid: int, arg: str | None = None) -> bool:
    """True when ``pid`` runs (not a zombie) and, if ``arg`` is given, ``arg`` is one of its arguments.

    The argument check guards against pid reuse: a recycled pid belongs to some other program.
    Without /proc (not Linux) only existence is checked.
    """
    if pid <= 0:
        return False
    proc = _PROC / str(pid)
    if _PROC.is_dir():
        try:
            stat = (proc / "stat").read_text()
            # The state follows the parenthesised command name, which may itself contain spaces.
            state = stat.rsplit(")", 1)[1].split()[0]
            if state in ("Z", "X"):
                return False
            if arg is not None:
                return arg.encode() in (proc / "cmdline").read_bytes().split(b"\0")
            return True
        except (OSError, IndexError):
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wants_cpu(pid: int) -> bool:
    """True when a thread of ``pid`` is running or waiting for a CPU (state R in /proc).

    A rank whose heartbeat is late while one of its threads is runnable is starved (a loaded host,
    more ranks than cores), not dead; a stopped (T), frozen or vanished rank has no runnable thread.
    Without /proc (not Linux) nothing is known: False.
    """
    tasks = _PROC / str(pid) / "task"
    try:
        stats = [(task / "stat").read_text() for task in tasks.iterdir()]
    except OSError:
        return False
    # The state is the field after the command's closing parenthesis (the command may hold spaces).
    return any(stat.rpartition(")")[2].split()[:1] == ["R"] for stat in stats)


def signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def signal_pid(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)


PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38


def prctl(option: int, value: int) -> None:
    """Linux's prctl(option, value); OSError when libc cannot be loaded or the call fails."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value}) failed")


def die_with_parent(parent_pid: int) -> None:
    """In a child before exec: get SIGTERM when the parent dies (Linux only; elsewhere a no-op).

    Keeps ranks from training on, unobserved, after their supervisor was killed.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    except OSError:
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
