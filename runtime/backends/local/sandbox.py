"""Ranks of the tenant's own code run as an unprivileged user of their job.

The local backend is for one trusted team: it runs everything on the control plane's own host. Still,
a ``python`` or ``torchrun`` job runs code that nobody on the platform reviewed, so when the control
plane runs as root its ranks run under a user id of their own job (no entry in /etc/passwd needed):
``setpriv`` drops to it, with no supplementary groups and no way to regain privileges, right before
the rank's interpreter starts. What that user can reach is set by the file system alone:

- the control plane's folders (var/, runs/, checkpoints/, artifacts/) are traversable but not
  listable (mode 0711); the database file, the secret key, the broker's messages and every other
  job's files stay owner-only (0600 / 0700, the control plane's umask);
- the job's own run folder holds a ``work/`` folder owned by the job's user (its home, the unpacked
  bundle, heartbeats), its rank configs (0600, the job's user), and the control files the backend
  writes for it (0644);
- the job's checkpoint store and artifacts folder belong to the job's user.

The Kubernetes backend isolates tenants properly (namespaces, pods, network policy); this is defence
in depth for one host, and the README says so.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from runtime.backends.local.procs import PR_SET_NO_NEW_PRIVS, prctl

# User ids handed to jobs: far above any system or login user. Derived from the job's name, so every
# attempt of a job is the same user (its checkpoints stay its own) and two jobs differ with
# overwhelming likelihood (2**20 ids).
UID_BASE = 2_000_000
UID_SPAN = 1 << 20
SANDBOXED_KINDS = ("python", "torchrun")


@dataclass(frozen=True)
class RunAs:
    uid: int
    gid: int

    def to_json(self) -> dict[str, int]:
        return {"uid": self.uid, "gid": self.gid}


def identity_for(job_key: str, base: int = UID_BASE) -> RunAs:
    digest = int.from_bytes(hashlib.sha256(job_key.encode()).digest()[:8], "big")
    uid = base + digest % UID_SPAN
    return RunAs(uid, uid)


def unavailable_reason() -> str | None:
    """Why ranks cannot be run as another user here, or None when they can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "the control plane does not run as root, so it cannot switch users"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed"
    return None


def wrap(argv: Sequence[str], run_as: RunAs) -> list[str]:
    """``argv`` run as ``run_as``: no supplementary groups, no new privileges, and the parent-death
    signal the launcher set kept across the switch (a credential change would clear it)."""
    setpriv = shutil.which("setpriv") or "setpriv"
    return [
        setpriv,
        f"--reuid={run_as.uid}",
        f"--regid={run_as.gid}",
        "--clear-groups",
        "--no-new-privs",
        "--pdeathsig=keep",
        "--",
        *argv,
    ]


def is_job_identity(uid: object, gid: object) -> bool:
    """Whether (uid, gid) is one that ``identity_for`` hands out: never root, never a login user."""
    ids = (uid, gid)
    return all(isinstance(i, int) and not isinstance(i, bool) and UID_BASE <= i < UID_BASE + UID_SPAN for i in ids)


def drop_to(run_as: RunAs) -> None:
    """Become ``run_as`` in this process, as ``wrap``'s setpriv does before exec: no supplementary
    groups, real, effective and saved ids all switched (so root cannot be regained, and the
    capabilities go with it), and no new privileges. For a warm standby forked by root
    (``runtime.backends.local.standby``) that runs the job's rank next. The kernel clears the
    parent-death signal on the switch: the caller sets it again. Raises OSError when it cannot."""
    if not is_job_identity(run_as.uid, run_as.gid):
        raise PermissionError(f"{run_as.uid}:{run_as.gid} is not a job's identity")
    os.setgroups([])
    os.setresgid(run_as.gid, run_as.gid, run_as.gid)
    os.setresuid(run_as.uid, run_as.uid, run_as.uid)
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def make_traversable(path: Path) -> None:
    """Let any user pass through ``path``'s ancestors (adds o+x where it lacks), never list them."""
    for folder in reversed(path.resolve().parents):
        try:
            mode = folder.stat().st_mode
        except OSError:
            continue
        if not mode & stat.S_IXOTH:
            os.chmod(folder, stat.S_IMODE(mode) | stat.S_IXOTH)


def hand_over(path: Path, run_as: RunAs, mode: int = 0o700) -> None:
    """Create ``path`` if needed and give it, and everything under it, to the job's user."""
    path.mkdir(parents=True, exist_ok=True)
    make_traversable(path)
    for folder, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            os.lchown(os.path.join(folder, name), run_as.uid, run_as.gid)
        os.lchown(folder, run_as.uid, run_as.gid)
    os.chmod(path, mode)
