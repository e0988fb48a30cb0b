"""Warm standby ranks: ``python -m runtime.backends.local.standby POOL_DIR --size N``.

A restarted job's new ranks used to pay for a fresh interpreter, ``import torch`` and torch's lazy
imports on the first optimizer (torch._dynamo, sympy) before they could even join the rendezvous:
9-15 s of the 13-22 s from a kill to the first step again on this 2-core host, measured with
``bench/recovery.py``; and on this backend every rank of a restarted job is a new process. This module
keeps a few rank processes per host that have already paid for that and wait for a rank to run:

- the **pool** (one per runs folder, so one per host in practice) is a small daemon that imports
  what a rank imports once (``_warm``), keeps ``size`` standbys forked from itself, listens on
  ``POOL_DIR/pool.sock`` (in a folder only the control plane's user can enter: whoever connects can
  run a rank), and relays each claimed rank's exit status;
- a **standby** is a child forked from the warm pool: it has torch and the worker loaded without
  having paid for them, and blocks on its socket to the pool until a rank is handed to it. Forking
  costs milliseconds and no CPU, so a claimed standby is replaced at once, without taking the cores
  from the restarted job it just sped up. The pool forks only while it is single-threaded (torch's
  import starts no thread; the pool never runs a torch operation); otherwise it keeps no standbys;
- a **claim** (``claim``, from a job's supervisor) sends the rank launcher's arguments, the rank's
  whole environment and working folder, and the write ends of its stdout and stderr pipes
  (SCM_RIGHTS). The standby takes them over (dup2 onto 1 and 2, stdin from /dev/null, the
  environment replaced, cwd and ``sys.path[0]`` moved, ``sys.argv`` set, numpy's global generator
  reseeded; Python's ``random`` reseeds itself after a fork and torch's generator was never used, as
  in a fresh process) and runs the module as ``python -m`` would (``runpy``): the rank launcher, or
  the rendezvous store's process (``MODULES``), whose own torch import would otherwise hold up the
  rendezvous of warm ranks. What differs from a fresh process: the interpreter's hash seed is the
  pool's, and the modules that ``_warm`` imported are already imported.

What a fresh rank gets and a standby cannot take over is refused, and the supervisor starts a fresh
process as before: an environment that differs in a variable read at interpreter or torch start-up
(only ``LATE_ENV`` may differ: the job's own folders and ids, the store's credentials; a job's own
``workload.env`` therefore means fresh ranks), another Python, or a rank inside a network namespace
(``link_shaping`` netns). A pool with no ready standby refuses too. The supervisor decides which ranks
may ask (``supervisor.spawn``).

A rank of the tenant's own code runs as the job's own user (the sandbox). Fresh, ``setpriv`` drops to
it before the interpreter starts; warm, the claim names the user and the standby drops to it after
taking the rank over and before the module runs (``sandbox.drop_to``: no supplementary groups, real,
effective and saved ids switched, so root and its capabilities cannot come back, no new privileges;
the parent-death signal, which the switch clears, set again), and checks that it is that user before
it answers. The pool refuses any user but one the sandbox hands out (``sandbox.is_job_identity``): a
claim never makes a standby root or a login user; and it says in its state that it honours a user
(``runs_as_job_user``), since a pool of an earlier version would ignore one: ``claim`` names a user
only to a pool that says so. The standby has closed every descriptor of the pool's by then (its
socket, lock, log and the other standbys' connections). A job with variables of its own never claims
(``LocalBackend._standby_usable``): the pool's memory, which every later standby copies, must never
hold one tenant's values on their way to another's rank. A claimed rank whose supervisor is gone gets
SIGTERM, and SIGKILL ``ORPHAN_GRACE_S`` later if the tenant's code ignored it.

A claimed rank stays the pool's child (a process cannot be handed to another parent): the pool reaps
it and writes ``exit CODE`` on the claim's connection, which the supervisor keeps open and reads
through ``StandbyProc`` (the ``poll``/``wait``/``pid`` of a ``subprocess.Popen``). Its life follows the
supervisor's as a fresh rank's does (a fresh rank gets SIGTERM when its supervisor dies): when that
connection closes while the rank runs, the pool sends it SIGTERM. When the pool itself dies, its
children get SIGTERM (the parent-death signal), claimed ranks included: their supervisors see a
failed rank and the job recovers.

The pool exits on SIGTERM (``stop_pool``, ``LocalBackend.stop_standby``; ``polychip down``), when its
socket or folder is removed, or after ``IDLE_EXIT_S`` without a claim while none of its ranks runs,
taking its standbys with it.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import runpy
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from runtime.backends.local.files import atomic_write_json, read_json
from runtime.backends.local.procs import die_with_parent, pid_alive, signal_pid
from runtime.backends.local.sandbox import RunAs, drop_to, is_job_identity

SOCKET_NAME = "pool.sock"
STATE_FILE = "pool.json"
PID_FILE = "pool.pid"
LOCK_NAME = "pool.lock"
LOG_NAME = "pool.log"
MODULE = "runtime.backends.local.standby"
# What a standby may run: the processes a supervisor starts, each with what it imports warmed up.
MODULES = ("runtime.backends.local.rank", "runtime.recovery.storehost")
# The pool's size when none is given (the control plane's is POLYCHIP_LOCAL_STANDBY_RANKS). A claimed
# standby is replaced by a fork before the supervisor's next claim (it claims one process at a time),
# so a small pool serves a job of any size; more only absorb claims from several supervisors at once.
# An idle standby costs no CPU and shares most of its memory with the pool (copy on write).
DEFAULT_SIZE = 2
# A pool nobody claimed from for this long, with no rank of its own running, exits.
IDLE_EXIT_S = 1800.0
# How long the pool waits for a standby to take over a claim, and a supervisor for the pool's answer.
HANDOFF_TIMEOUT_S = 10.0
POLL_S = 0.05
# AF_UNIX paths are limited to 108 bytes on Linux; a longer pool folder means no pool.
SOCKET_PATH_MAX = 100
MAX_MESSAGE = 4 << 20
# Variables that may differ between a standby's start-up environment and the rank's: read only
# after the hand-over (the job's folders and ids by the worker, the store's credentials when the
# store is opened). Everything else (PYTHON*, OMP_NUM_THREADS, LD_*, a job's own variables, ...) may
# be read at interpreter or torch start-up, so it must match or the rank starts fresh.
LATE_ENV = frozenset({"HOME", "POLYCHIP_JOB_ID", "POLYCHIP_ARTIFACTS_DIR", "POLYCHIP_CHECKPOINT_DIR"})
LATE_ENV_PREFIXES = ("AWS_",)
# How long a claimed rank whose supervisor is gone has to stop after SIGTERM before SIGKILL.
ORPHAN_GRACE_S = 5.0
# A claimed rank whose exit status was lost with its pool: the pool's death sent it SIGTERM.
LOST_CODE = -signal.SIGTERM


def socket_path(pool_dir: Path) -> Path:
    return pool_dir / SOCKET_NAME


def unavailable_reason(pool_dir: Path) -> str | None:
    """Why no pool can serve from ``pool_dir`` on this host, or None."""
    if not hasattr(socket, "AF_UNIX") or not hasattr(socket, "send_fds"):
        return "this platform has no Unix sockets that pass file descriptors"
    if len(str(socket_path(pool_dir.resolve()))) > SOCKET_PATH_MAX:
        return f"its socket path would exceed {SOCKET_PATH_MAX} bytes ({pool_dir})"
    return None


def _late(name: str, late: frozenset[str]) -> bool:
    return name in late or name.startswith(LATE_ENV_PREFIXES)


def env_mismatch(startup: Mapping[str, str], wanted: Mapping[str, str], late: frozenset[str] = LATE_ENV) -> list[str]:
    """The variables, read at start-up, in which ``wanted`` differs from ``startup`` (sorted)."""
    names = (set(startup) | set(wanted)) - {n for n in (set(startup) | set(wanted)) if _late(n, late)}
    return sorted(n for n in names if startup.get(n) != wanted.get(n))


# --- messages: a length, JSON, and maybe file descriptors ------------------------------------------


def _send(sock: socket.socket, payload: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(payload).encode()
    message = struct.pack("!I", len(data)) + data
    if fds:
        socket.send_fds(sock, [message], list(fds))
    else:
        sock.sendall(message)


def _recv(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and the descriptors that came with it; (None, []) when the peer closed first."""
    fds: list[int] = []
    buffer = b""
    while len(buffer) < 4 or len(buffer) < 4 + struct.unpack("!I", buffer[:4])[0]:
        if max_fds and not fds:
            chunk, got, _flags, _addr = socket.recv_fds(sock, 65536, max_fds)
            fds.extend(got)
        else:
            chunk = sock.recv(65536)
        if not chunk:
            for fd in fds:
                os.close(fd)
            return None, []
        buffer += chunk
        if len(buffer) >= 4 and struct.unpack("!I", buffer[:4])[0] > MAX_MESSAGE:
            raise ValueError("message too large")
    size = struct.unpack("!I", buffer[:4])[0]
    value = json.loads(buffer[4 : 4 + size])
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value, fds


# --- the supervisor's side --------------------------------------------------------------------------


class StandbyProc:
    """A rank that runs in a claimed standby, seen as the supervisor sees a ``subprocess.Popen``.

    The exit status arrives from the pool (the rank's parent) on the claim's connection; holding
    that connection open is what keeps the rank alive (the pool stops a rank whose claimer left)."""

    def __init__(self, sock: socket.socket, pid: int, mark: str, started_at: float) -> None:
        self.sock = sock
        self.pid = pid
        self.mark = mark  # an argument of the standby's command line: a reused pid lacks it
        self.started_at = started_at  # when the standby process started (before any claim)
        self.returncode: int | None = None
        self._buffer = b""
        self.sock.setblocking(False)

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        closed = False
        try:
            while chunk := self.sock.recv(4096):
                self._buffer += chunk
            closed = True  # the pool closes the connection after the exit line, or when it dies
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            closed = True
        for line in self._buffer.split(b"\n")[:-1]:
            if line.startswith(b"exit "):
                self._done(int(line.split()[1]))
                return self.returncode
        if closed and not pid_alive(self.pid, self.mark):
            self._done(LOST_CODE)  # the pool died before it could say; its death sent the rank SIGTERM
        return self.returncode

    def _done(self, code: int) -> None:
        self.returncode = code
        with contextlib.suppress(OSError):
            self.sock.close()

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"standby rank {self.pid}", timeout or 0.0)
            time.sleep(POLL_S)
        return code

    def terminate(self) -> None:
        signal_pid(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        signal_pid(self.pid, signal.SIGKILL)


def claim(
    pool_dir: Path,
    python: str,
    module: str,
    args: Sequence[str],
    env: Mapping[str, str],
    cwd: Path,
    stdout: int,
    stderr: int,
    timeout_s: float = HANDOFF_TIMEOUT_S,
    run_as: RunAs | None = None,
) -> tuple[StandbyProc | None, str]:
    """Run ``python -m module *args`` in a warm standby: (its process, "") or (None, why not).
    With ``run_as``, the standby becomes the job's user before the module starts (``sandbox.drop_to``)."""
    if run_as is not None and pool_state(pool_dir).get("runs_as_job_user") is not True:
        return None, "the pool cannot run a rank as the job's user (an earlier version: it stops with `polychip down`)"
    path = socket_path(pool_dir)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        sock.connect(str(path))
        request = {"python": python, "module": module, "args": list(args), "env": dict(env), "cwd": str(cwd)}
        if run_as is not None:
            request["run_as"] = run_as.to_json()
        _send(sock, request, [stdout, stderr])
        answer, _ = _recv(sock)
    except (OSError, ValueError) as exc:
        sock.close()
        return None, f"no standby pool at {path} ({exc})"
    if answer is None or not isinstance(answer.get("pid"), int):
        sock.close()
        return None, str(answer.get("error") if answer else "the pool closed the connection")
    return StandbyProc(sock, int(answer["pid"]), str(answer["mark"]), float(answer.get("started_at") or 0.0)), ""


# --- the pool ---------------------------------------------------------------------------------------


class _Child:
    """A forked child of the pool: the part of ``subprocess.Popen`` the pool uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = LOST_CODE
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while (code := self.poll()) is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.01)
        return code


@dataclass
class _Standby:
    proc: _Child
    sock: socket.socket
    started_at: float


@dataclass
class _Claimed:
    proc: _Child
    client: socket.socket | None = None  # the claimer's connection; None once it hung up
    kill_at: float | None = None  # when a rank told to stop (its supervisor gone) is killed if still running


@dataclass
class Pool:
    pool_dir: Path
    size: int
    python: str = sys.executable
    idle_exit_s: float = IDLE_EXIT_S
    standbys: dict[int, _Standby] = field(default_factory=dict)
    ranks: dict[int, _Claimed] = field(default_factory=dict)
    stopping: bool = False
    last_claim: float = field(default_factory=time.monotonic)
    claims: int = 0
    replaced: int = 0  # standbys that died unclaimed (and were replaced)
    note: str = ""  # why the pool keeps no standbys, when it cannot
    _keep: list[object] = field(default_factory=list)  # what a forked child must close: the lock, the listener
    startup_env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    warm_env: dict[str, str] = field(default_factory=dict)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        self.pool_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # One pool per folder: the lock is held for the pool's life (a second one exits at once).
        lock = open(self.pool_dir / LOCK_NAME, "a")  # noqa: SIM115 (held until exit)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 0
        (self.pool_dir / PID_FILE).write_text(f"{os.getpid()}\n")
        self._write_state()
        # Once, here: every standby is forked from this warm process. Torch's imports set a few
        # variables of their own (TORCHINDUCTOR_CACHE_DIR): a fresh rank's would too, so a standby
        # keeps them, and claims are compared with the environment from before them.
        self.startup_env = dict(os.environ)
        _warm()
        self.warm_env = {k: v for k, v in os.environ.items() if self.startup_env.get(k) != v}
        path = socket_path(self.pool_dir)
        path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        os.chmod(path, 0o600)
        listener.listen(16)
        self._keep = [lock, listener]
        try:
            self._loop(listener, path)
        finally:
            listener.close()
            path.unlink(missing_ok=True)
            self._shut_down()
            self._write_state()
        return 0

    def _loop(self, listener: socket.socket, path: Path) -> None:
        state = None
        while not self.stopping:
            if not path.exists():
                return  # the folder was removed (a test's, or the runs folder): nobody can claim
            self._reap()
            self._kill_the_deaf()
            self._replenish()
            if not self.ranks and time.monotonic() - self.last_claim > self.idle_exit_s:
                return
            now = self._state()
            if now != state:
                self._write_state(now)
                state = now
            watched: list[socket.socket] = [listener]
            watched += [s.sock for s in self.standbys.values()]
            watched += [r.client for r in self.ranks.values() if r.client is not None]
            try:
                readable, _, _ = select.select(watched, [], [], POLL_S * 2)
            except InterruptedError:
                continue
            for sock in readable:
                if sock is listener:
                    self._accept(listener)
                else:
                    self._readable(sock)

    def _replenish(self) -> None:
        while not self.stopping and not self.note and len(self.standbys) < self.size:
            threads = len(os.listdir(f"/proc/{os.getpid()}/task")) if os.path.isdir("/proc") else 1
            if threads > 1:
                # A fork copies only the forking thread: a lock another thread held stays held forever.
                self.note = f"the pool runs {threads} threads, so it forks no standbys"
                return
            self._fork()

    def _fork(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        me = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the standby
            code = 1
            try:
                ours.close()
                for kept in self._keep:
                    kept.close()  # type: ignore[attr-defined]
                for other in self.standbys.values():
                    other.sock.close()
                for rank in self.ranks.values():
                    if rank.client is not None:
                        rank.client.close()
                for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    signal.signal(signum, signal.SIG_DFL)
                die_with_parent(me)
                code = serve(theirs)
            finally:
                from runtime.worker.cli import exit_process

                exit_process(code)
        theirs.close()
        self.standbys[pid] = _Standby(_Child(pid), ours, time.time())

    def _reap(self) -> None:
        for pid, standby in list(self.standbys.items()):
            if standby.proc.poll() is not None:
                standby.sock.close()
                del self.standbys[pid]
                self.replaced += 1
        for pid, rank in list(self.ranks.items()):
            code = rank.proc.poll()
            if code is not None:
                if rank.client is not None:
                    with contextlib.suppress(OSError):
                        rank.client.sendall(f"exit {code}\n".encode())
                    rank.client.close()
                del self.ranks[pid]

    def _readable(self, sock: socket.socket) -> None:
        for pid, standby in self.standbys.items():
            if standby.sock is sock:
                # A waiting standby says nothing: readable means it died (EOF); _reap replaces it.
                signal_pid(pid, signal.SIGKILL)
                standby.proc.wait(5.0)
                return
        for pid, rank in self.ranks.items():
            if rank.client is sock:
                try:
                    data = sock.recv(64)
                except OSError:
                    data = b""
                if not data:
                    # Its supervisor is gone: the rank follows, as a fresh rank does on its parent's death;
                    # one that ignores SIGTERM (the tenant's code may) is killed after a grace.
                    signal_pid(pid, signal.SIGTERM)
                    sock.close()
                    rank.client = None
                    rank.kill_at = time.monotonic() + ORPHAN_GRACE_S
                return

    def _kill_the_deaf(self) -> None:
        now = time.monotonic()
        for pid, rank in self.ranks.items():
            if rank.kill_at is not None and now >= rank.kill_at and rank.proc.poll() is None:
                signal_pid(pid, signal.SIGKILL)
                rank.kill_at = None

    def _accept(self, listener: socket.socket) -> None:
        client, _ = listener.accept()
        client.settimeout(HANDOFF_TIMEOUT_S)
        try:
            request, fds = _recv(client, max_fds=2)
        except (OSError, ValueError):
            client.close()
            return
        try:
            if request is None or len(fds) != 2:
                client.close()
                return
            answer = self._hand_over(request, fds)
        finally:
            for fd in fds:
                os.close(fd)  # the standby has its own copies now
        pid = answer.get("pid")
        try:
            _send(client, answer)
        except OSError:
            if isinstance(pid, int):
                signal_pid(pid, signal.SIGTERM)  # nobody watches it
            client.close()
            return
        if isinstance(pid, int) and pid in self.ranks:
            client.setblocking(False)
            self.ranks[pid].client = client
        else:
            client.close()

    def _hand_over(self, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        env, args, cwd, module = request.get("env"), request.get("args"), request.get("cwd"), request.get("module")
        if not isinstance(env, dict) or not isinstance(args, list) or not isinstance(cwd, str):
            return {"error": "a claim needs env, args and cwd"}
        if module not in MODULES:
            return {"error": f"a standby runs {' or '.join(MODULES)}, not {module!r}"}
        if os.path.realpath(str(request.get("python"))) != os.path.realpath(self.python):
            return {"error": f"the standbys run {self.python}, the rank wants {request.get('python')}"}
        env = {str(k): str(v) for k, v in env.items()}
        mismatch = env_mismatch(self.startup_env, env)
        if mismatch:
            return {"error": f"the rank's environment differs in {', '.join(mismatch[:5])}"}
        run_as = request.get("run_as")
        if run_as is not None and not (
            isinstance(run_as, dict) and is_job_identity(run_as.get("uid"), run_as.get("gid"))
        ):
            return {"error": f"a standby runs as a job's own user only, not {run_as!r}"}
        if not self.standbys:
            return {"error": self.note or "no standby is ready"}
        started_at, pid = min((s.started_at, pid) for pid, s in self.standbys.items())
        standby = self.standbys.pop(pid)
        self.claims += 1
        self.last_claim = time.monotonic()
        try:
            standby.sock.settimeout(HANDOFF_TIMEOUT_S)
            warm = dict(self.warm_env)
            if run_as is not None and "TORCHINDUCTOR_CACHE_DIR" in warm:
                # Torch's import named a cache folder of the pool's user (root); the job's user gets its
                # own, in its home, where it may write.
                warm["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(env.get("HOME", cwd), ".cache", "torchinductor")
            handed = {"module": module, "args": args, "env": {**warm, **env}, "cwd": cwd, "run_as": run_as}
            _send(standby.sock, handed, fds)
            answer, _ = _recv(standby.sock)
        except (OSError, ValueError) as exc:
            answer = {"error": f"the standby did not take the rank: {exc}"}
        standby.sock.close()
        if answer is None or answer.get("ok") is not True:
            signal_pid(pid, signal.SIGKILL)
            standby.proc.wait(5.0)
            return {"error": str(answer.get("error") if answer else "the standby died taking the rank")}
        self.ranks[pid] = _Claimed(standby.proc)
        # The mark is the pool's folder, on the command line the standby inherited from the pool.
        return {"pid": pid, "mark": str(self.pool_dir), "started_at": started_at}

    def _state(self) -> dict[str, object]:
        return {
            "pid": os.getpid(),
            # A pool of an earlier version would ignore a claim's user and run the rank as root: a
            # supervisor names a user only to a pool that says it honours one (``claim``).
            "runs_as_job_user": True,
            "size": self.size,
            "standbys": sorted(
                ({"pid": pid, "started_at": s.started_at} for pid, s in self.standbys.items()),
                key=lambda s: int(str(s["pid"])),
            ),
            "ranks": sorted(self.ranks),
            "claims": self.claims,
            "replaced": self.replaced,
            "note": self.note,
            "stopping": self.stopping,
        }

    def _write_state(self, state: dict[str, object] | None = None) -> None:
        with contextlib.suppress(OSError):
            atomic_write_json(self.pool_dir / STATE_FILE, state or self._state(), mode=0o600)

    def _shut_down(self) -> None:
        """Stop every process of the pool: SIGTERM, then SIGKILL for any left after a grace."""
        procs = [s.proc for s in self.standbys.values()] + [r.proc for r in self.ranks.values()]
        for proc in procs:
            signal_pid(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                signal_pid(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5.0)
        for rank in self.ranks.values():
            if rank.client is not None:
                with contextlib.suppress(OSError):
                    rank.client.sendall(f"exit {rank.proc.returncode}\n".encode())
                rank.client.close()
        for standby in self.standbys.values():
            standby.sock.close()
        self.standbys.clear()
        self.ranks.clear()


# --- the standby's side -----------------------------------------------------------------------------


def _warm() -> None:
    """Import what a rank imports, and trigger torch's lazy imports that a rank pays for after its
    rendezvous (the first optimizer imports torch._dynamo and sympy)."""
    import torch
    import torch.distributed

    # The launchers' own modules stay unimported (run_module runs them as __main__, as python -m does).
    import runtime.backends.local.emulation
    import runtime.backends.local.health
    import runtime.worker.builtin.charlm
    import runtime.worker.builtin.digits
    import runtime.worker.builtin.synthetic
    import runtime.worker.checkpointing
    import runtime.worker.train  # noqa: F401

    torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1, momentum=0.9)


def serve(sock: socket.socket) -> int:
    """A standby's life: wait for a rank, take it over, run it. Returns its exit code."""
    startup_dir = os.getcwd()
    pool_pid = os.getppid()
    try:
        request, fds = _recv(sock, max_fds=2)
    except (OSError, ValueError) as exc:
        print(f"standby {os.getpid()}: bad claim: {exc}", file=sys.stderr, flush=True)  # noqa: T201
        return 1
    if request is None:
        return 0  # the pool let us go
    module = str(request["module"])
    args = [str(a) for a in request["args"]]
    env = {str(k): str(v) for k, v in request["env"].items()}
    cwd = str(request["cwd"])
    try:
        os.chdir(cwd)
    except OSError as exc:
        _send(sock, {"error": f"cannot enter {cwd}: {exc}"})
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for extra in fds:
        os.close(extra)
    run_as = request.get("run_as")
    if run_as is not None:
        # The job's own code runs next: become its user now, as setpriv does for a fresh rank. The
        # pool checked the identity; the switch clears the parent-death signal, so it is set again.
        try:
            drop_to(RunAs(int(run_as["uid"]), int(run_as["gid"])))
            if (os.getuid(), os.getgid()) != (int(run_as["uid"]), int(run_as["gid"])):
                raise PermissionError(f"still {os.getuid()}:{os.getgid()}")
        except (OSError, KeyError, TypeError, ValueError) as exc:
            _send(sock, {"error": f"cannot become the job's user {run_as}: {exc}"})
            return 1
        die_with_parent(pool_pid)
    os.environ.clear()
    os.environ.update(env)
    # python -m put the start-up folder first on sys.path; a fresh rank has its working folder there.
    if sys.path and os.path.realpath(sys.path[0] or ".") == os.path.realpath(startup_dir):
        sys.path[0] = cwd
    sys.argv = [module, *args]  # run_module puts the module's file first, as python -m does
    # A fresh process seeds numpy's global generator from the OS; a fork would share the pool's.
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    _send(sock, {"ok": True})
    sock.close()
    # As ``python -m module``: the rank launcher ends the process itself (exit_process), the store's
    # process with sys.exit.
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr, flush=True)  # noqa: T201 (what the interpreter would print)
        return 1
    return 0


def stop_pool(pool_dir: Path, timeout_s: float = 10.0) -> bool:
    """Stop the pool serving from ``pool_dir`` and wait for it; True when one was running."""
    pid = _pool_pid(pool_dir)
    if pid is None:
        return False
    signal_pid(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and pid_alive(pid, str(pool_dir)):
        time.sleep(POLL_S)
    if pid_alive(pid, str(pool_dir)):
        signal_pid(pid, signal.SIGKILL)
    return True


def _pool_pid(pool_dir: Path) -> int | None:
    try:
        pid = int((pool_dir / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid, str(pool_dir)) else None


def pool_running(pool_dir: Path) -> bool:
    return _pool_pid(pool_dir) is not None


def pool_state(pool_dir: Path) -> dict[str, Any]:
    state = read_json(pool_dir / STATE_FILE)
    return state if isinstance(state, dict) else {}


def start_pool(pool_dir: Path, size: int, python: str, env: Mapping[str, str]) -> None:
    """Start the pool for ``pool_dir`` unless one runs; returns at once (the standbys warm up behind)."""
    if pool_running(pool_dir):
        return
    pool_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(pool_dir / LOG_NAME, "ab") as log:
        intermediate = subprocess.Popen(  # noqa: S603 (our interpreter and module, no shell)
            [python, "-m", MODULE, str(pool_dir), "--size", str(size)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            cwd=pool_dir,
            env=dict(env),
            start_new_session=True,
            close_fds=True,
        )
    intermediate.wait(timeout=30)  # it forks the pool and exits at once


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    parser.add_argument("pool_dir")
    parser.add_argument("--size", type=int, default=DEFAULT_SIZE)
    parser.add_argument("--foreground", action="store_true", help="do not fork (for debugging)")
    args = parser.parse_args(argv)
    if args.size < 1:
        parser.error("--size: at least 1 (a pool of 0 is no pool: do not start one)")
    if not args.foreground:
        # As the supervisor does: the starter reaps this process at once, the pool leads a session.
        if os.fork() > 0:
            os._exit(0)
        os.setsid()
    return Pool(Path(args.pool_dir).resolve(), args.size).run()


if __name__ == "__main__":
    from runtime.worker.cli import exit_process

    exit_process(main())


__all__ = [
    "DEFAULT_SIZE",
    "Pool",
    "StandbyProc",
    "claim",
    "env_mismatch",
    "pool_running",
    "pool_state",
    "start_pool",
    "stop_pool",
    "unavailable_reason",
]
