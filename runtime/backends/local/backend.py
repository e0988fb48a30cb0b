"""The local backend: each device of a job is a process on this host, talking gloo over loopback.

Layout of a run directory ``RUNS_DIR/<job_id>/``:

- ``launch.lock``: created exclusively by the one provision call that launches the job;
- ``rank<N>.json``: each rank's worker config; ``launch.json``: what the supervisor starts;
- ``supervisor.pid``, ``supervisor.out``, ``supervisor.err``: the detached supervisor;
- ``status.json``: phase, reason and per-rank pid / exit code, kept by the supervisor;
- ``rank<N>.log``, ``rank<N>.log.1``: each rank's stdout and stderr, capped per rank, oldest dropped
  (``runtime.backends.local.logs``; read with ``logs``);
- ``speed.rank<N>`` (optional): a float that overrides rank N's relative speed while it runs;
- ``heartbeat.rank<N>``: touched by rank N every second; the supervisor kills a rank that goes silent;
- ``health.rank<N>`` (on request): injects a slow degradation of rank N's emulated device;
- ``control.json`` (on request): asks the ranks to checkpoint and stop (``request_stop``);
- ``storehost.log``: the c10d store's own process's output, capped the same way;
- ``telemetry.rank<N>.jsonl`` (when ``telemetry_files`` is on): every telemetry event of rank N.

Beside the run directories, ``RUNS_DIR/.standby/`` holds the host's pool of warm standby ranks
(``runtime.backends.local.standby``, when ``standby_ranks`` > 0): its socket, pid, state and log.

Handles are ``{"backend": "local", "run_dir": str, "job_id": str}``: any process on this host can
observe or tear down a job from its handle alone.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import runtime
from runtime.backends.base import Failure, LaunchRequest, LogPage, Observation, Phase, RankState, vendor_groups
from runtime.backends.launch import check_request, worker_configs
from runtime.backends.local import netem
from runtime.backends.local import sandbox as sandbox_module
from runtime.backends.local import standby as standby_module
from runtime.backends.local.files import atomic_write_json, atomic_write_text, read_json, tail
from runtime.backends.local.logs import DEFAULT_CAP_BYTES, check_cap, read_logs
from runtime.backends.local.procs import pid_alive, signal_group, signal_pid
from runtime.backends.local.supervisor import LAUNCH_FILE, PID_FILE, STATUS_FILE, STOP_FILE
from runtime.bundles import extract_bundle
from runtime.comm.link import LinkEmulation
from runtime.recovery.store import ENDPOINT_ENV as STORE_ENDPOINT_ENV

if TYPE_CHECKING:
    from runtime.bench.suite import SuiteResult

LOCK_FILE = "launch.lock"
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_SUPERVISOR_MODULE = "runtime.backends.local.supervisor"
_RANK_MODULE = "runtime.backends.local.rank"
# How long provision waits for the detached supervisor to announce its pid.
_START_TIMEOUT_S = 15.0
# A run dir with a launch lock but no supervisor pid after this long was abandoned mid-launch.
_STARTUP_GRACE_S = 60.0
# How long a supervisor may take to exit after writing its final status before that status stands
# while it still runs.
_EXIT_GRACE_S = 10.0
_FINAL_PHASES = {"succeeded": Phase.SUCCEEDED, "failed": Phase.FAILED, "stopped": Phase.STOPPED}
CONTROL_FILE = "control.json"
WORK_DIR = "work"


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it; rank 0 binds it shortly after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _project_root() -> Path:
    return Path(runtime.__file__).resolve().parent.parent


def relative_speed(profiles: dict[str, dict[str, Any]], flavor: str) -> float:
    if flavor not in profiles:
        known = ", ".join(sorted(profiles)) or "none"
        raise ValueError(f"flavor {flavor!r} has no local profile (known: {known}); add it to the pool file")
    speed = profiles[flavor].get("relative_speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, int | float) or not math.isfinite(speed) or speed <= 0:
        raise ValueError(f"flavors.{flavor}.local_profile.relative_speed: must be a number > 0, got {speed!r}")
    return float(speed)


class LocalBackend:
    """Runs jobs as local processes; a flavor's ``relative_speed`` stretches each rank's steps."""

    name = "local"

    def __init__(
        self,
        runs_dir: str | Path,
        profiles: dict[str, dict[str, Any]],
        sample_time_ms: float = 0.5,
        python: str = sys.executable,
        *,
        telemetry_files: bool = False,
        grace_s: float = 5.0,
        worker_overrides: dict[int, dict[str, Any]] | None = None,
        link_gbit: float | None = None,
        link_shaping: str = "auto",
        collective_timeout_s: float = 30.0,
        heartbeat_timeout_s: float = 4.0,
        health_minutes_per_second: float = 5.0,
        log_cap_bytes: int = DEFAULT_CAP_BYTES,
        sandbox: str = "auto",
        sandbox_uid_base: int = sandbox_module.UID_BASE,
        standby_ranks: int = 0,
    ) -> None:
        """``profiles`` maps flavor -> {"relative_speed": float} (``Pool.local_profiles``).

        ``sample_time_ms`` is the emulated time per sample at relative speed 1.0. ``telemetry_files``
        also records each rank's events as JSON lines in the run dir. ``grace_s`` is how long a
        SIGTERMed rank gets before SIGKILL. ``worker_overrides`` merges extra keys into rank N's
        worker config (e.g. ``{1: {"fail_at_step": 3}}`` for fault injection in tests).

        ``link_gbit`` slows the link between vendor groups to that many Gbit/s, so that the effect of
        compression shows on one host (loopback is too fast for it to pay). ``link_shaping``: ``netns``
        (real shaping, ``tc`` in network namespaces; needs root), ``token_bucket`` (the ranks' own
        transport waits), or ``auto`` (netns where the machine allows it, else the token bucket).

        Failure handling: ``collective_timeout_s`` bounds how long a rank waits for its peers (gloo's
        default of 30 minutes turns a lost peer into a hang); the supervisor kills a rank whose
        heartbeats stop for ``heartbeat_timeout_s`` (they come every second); the c10d store runs in
        a process of its own, so no rank's death takes the rendezvous down.

        Each rank reports its emulated device's health with its heartbeats, ``health_minutes_per_second``
        emulated minutes per second (``runtime.backends.local.health``); ``inject_degradation`` starts a
        slow degradation that ends in the device's death.

        ``log_cap_bytes``: how much of each rank's output is kept (at least 1 MiB); past it the oldest
        lines are dropped, and ``logs`` says how many.

        ``sandbox``: ranks of ``python`` and ``torchrun`` jobs (the tenant's own code) run as a user of
        their job (``runtime.backends.local.sandbox``): ``auto`` where this host can switch users (the
        control plane runs as root), ``required`` (refuse to launch otherwise) or ``off``.

        ``standby_ranks``: how many warm rank processes (torch imported, waiting for a rank) this
        host keeps for the ranks of the next launches, a restart's above all
        (``runtime.backends.local.standby``); 0 keeps none. The pool starts with the first launch
        and lives in ``RUNS_DIR/.standby``; ``stop_standby`` (and ``tear_down_every_run``) stops it.
        Ranks that run as the job's user or in a network namespace always start fresh.
        """
        if sample_time_ms < 0:
            raise ValueError(f"sample_time_ms must be >= 0, got {sample_time_ms}")
        self.runs_dir = Path(runs_dir).resolve()
        self.profiles = {flavor: dict(profile) for flavor, profile in profiles.items()}
        self.sample_time_ms = float(sample_time_ms)
        self.python = python
        self.telemetry_files = telemetry_files
        self.grace_s = grace_s
        self.worker_overrides = worker_overrides or {}
        if link_gbit is not None and not link_gbit > 0:
            raise ValueError(f"link_gbit: must be a number of Gbit/s > 0, or None for no throttling; got {link_gbit}")
        if link_shaping not in ("auto", "netns", "token_bucket"):
            raise ValueError(f"link_shaping: {link_shaping!r}; use auto, netns or token_bucket")
        self.link_gbit = link_gbit
        self.link_shaping = link_shaping
        if not collective_timeout_s > 0 or not heartbeat_timeout_s > 0:
            raise ValueError("collective_timeout_s and heartbeat_timeout_s must be > 0 seconds")
        self.collective_timeout_s = float(collective_timeout_s)
        self.heartbeat_timeout_s = float(heartbeat_timeout_s)
        if not health_minutes_per_second > 0:
            raise ValueError(f"health_minutes_per_second must be > 0, got {health_minutes_per_second}")
        self.health_minutes_per_second = float(health_minutes_per_second)
        self.log_cap_bytes = check_cap(log_cap_bytes)
        if sandbox not in ("auto", "off", "required"):
            raise ValueError(f"sandbox: {sandbox!r}; use auto (where this host can switch users), off or required")
        self.sandbox = sandbox
        self.sandbox_uid_base = sandbox_uid_base
        if standby_ranks < 0:
            raise ValueError(f"standby_ranks: must be >= 0 (0 keeps no warm ranks), got {standby_ranks}")
        self.standby_ranks = int(standby_ranks)
        self.standby_dir = self.runs_dir / ".standby"

    def link_for(self, groups: Sequence[int]) -> LinkEmulation:
        """How this backend emulates the cross-group link for a job whose ranks are in ``groups``."""
        return self._link_choice(groups)[0]

    def _link_choice(self, groups: Sequence[int]) -> tuple[LinkEmulation, str]:
        """The link emulation and a one-line note of which one runs and why (launch.json's ``link_note``)."""
        if self.link_gbit is None:
            return LinkEmulation(), "none: link_gbit is not set"
        if len(set(groups)) < 2:
            return LinkEmulation(), "none: one vendor group, no cross-group link"
        if self.link_shaping == "token_bucket":
            return LinkEmulation("token_bucket", self.link_gbit), "token_bucket: link_shaping is token_bucket"
        reason = netem.unavailable_reason()
        if reason is None:
            args = " ".join(netem.tbf_args(self.link_gbit))
            return LinkEmulation("netns", self.link_gbit), f"netns: tc {args} on each vendor group's veth"
        if self.link_shaping == "netns":
            raise ValueError(
                f"link_shaping: netns is unavailable on this host ({reason}); use link_shaping='auto' or 'token_bucket'"
            )
        return LinkEmulation("token_bucket", self.link_gbit), f"token_bucket: netns is unavailable ({reason})"

    # -- provision ---------------------------------------------------------------------------------

    def provision(self, request: LaunchRequest) -> dict[str, Any]:
        self._validate(request)
        speeds = {p.rank: relative_speed(self.profiles, p.flavor) for p in request.placements}
        run_dir = self.runs_dir / request.job_id
        handle = {"backend": self.name, "run_dir": str(run_dir), "job_id": request.job_id}
        run_dir.mkdir(parents=True, exist_ok=True)
        try:
            # The exclusive create is the claim: of two concurrent provisions only one launches.
            fd = os.open(run_dir / LOCK_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return handle
        with os.fdopen(fd, "w") as fh:
            json.dump({"pid": os.getpid(), "at": time.time()}, fh)
        try:
            self._write_launch(request, run_dir, speeds)
            intermediate = self._start_supervisor(run_dir)
        except BaseException:
            # Nothing was started: release the claim so a retry can launch.
            (run_dir / LOCK_FILE).unlink(missing_ok=True)
            raise
        try:
            self._await_supervisor(run_dir, intermediate)
        except BaseException:
            # It may still come up late: make sure it launches nothing, with nobody watching.
            self.teardown(handle)
            raise
        return handle

    def _validate(self, request: LaunchRequest) -> None:
        if not _JOB_ID.match(request.job_id):
            raise ValueError(
                f"job_id {request.job_id!r}: use 1-128 letters, digits, '_', '-' or '.', "
                "starting with a letter or digit"
            )
        check_request(request)

    def _write_launch(self, request: LaunchRequest, run_dir: Path, speeds: dict[int, float]) -> None:
        port = find_free_port()
        groups = vendor_groups(request.placements)
        link, link_note = self._link_choice(groups)
        fabric: netem.FabricPlan | None = None
        master_addr = "127.0.0.1"
        if link.mode == "netns":
            # Names from the run dir, not the job id alone: two runs dirs may hold the same job id.
            fabric = netem.FabricPlan.for_job(
                request.job_id, len(set(groups)), link.gbit, key=str(run_dir), in_use=netem.subnets_in_use()
            )
            # The store's process runs inside rank 0's group's namespace, at that group's address.
            master_addr = fabric.address(groups[0])
        run_as = self._run_as(request)
        # The rank's own folder: its home, the unpacked bundle and, when it runs as the job's user,
        # the files it writes (heartbeats, telemetry); the run folder itself stays the backend's.
        work_dir = run_dir / WORK_DIR
        work_dir.mkdir(mode=0o700, exist_ok=True)
        written = work_dir if run_as is not None else run_dir
        code_dir = self._unpack_bundle(request, work_dir)
        written_at = str(written)

        def files(rank: int) -> dict[str, Any]:
            return {
                "telemetry_file": f"{written_at}/telemetry.rank{rank}.jsonl" if self.telemetry_files else None,
                "heartbeat_file": f"{written_at}/heartbeat.rank{rank}",
                "control_file": str(run_dir / CONTROL_FILE),
                "code_dir": str(code_dir) if code_dir is not None else None,
            }

        configs = worker_configs(
            request,
            master_addr=master_addr,
            master_port=port,
            link=link,
            collective_timeout_s=self.collective_timeout_s,
            telemetry_url=request.telemetry_url,
            files=files,
        )
        entries = []
        for placement in sorted(request.placements, key=lambda p: p.rank):
            rank = placement.rank
            config = configs[rank]
            config.update(self.worker_overrides.get(rank, {}))
            config_path = run_dir / f"rank{rank}.json"
            atomic_write_json(config_path, config)
            if run_as is not None:
                os.chown(config_path, run_as.uid, run_as.gid)  # its own token and config, nobody else's
            entries.append(
                {
                    "rank": rank,
                    "config": str(config_path),
                    "speed": speeds[rank],
                    "speed_file": str(run_dir / f"speed.rank{rank}"),
                    "heartbeat_file": config["heartbeat_file"],
                    "device_id": placement.device_id,
                    "health_file": str(run_dir / f"health.rank{rank}"),
                }
            )
        atomic_write_json(
            run_dir / LAUNCH_FILE,
            {
                "job_id": request.job_id,
                "python": self.python,
                "sample_time_ms": self.sample_time_ms,
                "grace_s": self.grace_s,
                "heartbeat_timeout_s": self.heartbeat_timeout_s,
                "health_minutes_per_second": self.health_minutes_per_second,
                "log_cap_bytes": self.log_cap_bytes,
                "env": self._rank_env(request, work_dir),
                "run_as": run_as.to_json() if run_as is not None else None,
                "store_host": {"host": master_addr, "port": port},
                "vendor_groups": list(groups),
                "link": link.to_json(),
                "link_note": link_note,
                **({"fabric": fabric.to_json()} if fabric is not None else {}),
                **({"standby": {"dir": str(self.standby_dir)}} if self._standby_usable(request, link) else {}),
                "ranks": entries,
            },
        )

        if run_as is not None:
            self._hand_over(request, run_dir, work_dir, run_as)

    def _standby_usable(self, request: LaunchRequest, link: LinkEmulation) -> bool:
        """Whether this launch's ranks may be handed to warm standbys, starting the host's pool if
        it is not running. Ranks in a network namespace may not. Nor may a job with variables of its
        own (``workload.env``): a claim carries the rank's environment to the pool, whose memory every
        later standby copies, and a tenant's values (its keys, say) must never reach another tenant's
        rank that way. Ranks of the job's own user may (the standby becomes that user before the rank
        starts: ``sandbox.drop_to``)."""
        if self.standby_ranks <= 0 or link.mode == "netns" or request.workload.env:
            return False
        if standby_module.unavailable_reason(self.standby_dir) is not None:
            return False
        # Started by the first launch, it warms up behind it: the next launch (a restart) finds it ready.
        standby_module.start_pool(self.standby_dir, self.standby_ranks, self.python, self.standby_env())
        return True

    def standby_env(self) -> dict[str, str]:
        """The environment the standbys start with: a rank's, less what belongs to one job (a
        claim's environment may differ only there: ``standby.LATE_ENV``)."""
        return self._base_env(self.standby_dir / "home")

    def stop_standby(self) -> bool:
        """Stop the host's standby pool and its warm processes; True when one was running."""
        return standby_module.stop_pool(self.standby_dir)

    def _run_as(self, request: LaunchRequest) -> sandbox_module.RunAs | None:
        """The job's own user for the tenant's code, when this host can switch users (``sandbox``)."""
        if request.workload.kind not in sandbox_module.SANDBOXED_KINDS or self.sandbox == "off":
            return None
        reason = sandbox_module.unavailable_reason()
        if reason is not None:
            if self.sandbox == "required":
                raise ValueError(
                    f"sandbox: ranks of {request.workload.kind} jobs must run as their own user, but {reason}"
                )
            return None
        return sandbox_module.identity_for(request.job_key or request.job_id, self.sandbox_uid_base)

    def _unpack_bundle(self, request: LaunchRequest, work_dir: Path) -> Path | None:
        kind = request.workload.kind
        if kind == "container":
            raise ValueError(
                "workload.kind container runs an image, which needs the Kubernetes backend "
                "(POLYCHIP_BACKEND=kubernetes); the local backend runs builtin, python and torchrun jobs"
            )
        if kind not in ("python", "torchrun"):
            return None
        if not request.bundle_path:
            raise ValueError(f"workload.bundle: a {kind} job needs its code bundle (LaunchRequest.bundle_path)")
        code_dir = work_dir / "code"
        if not code_dir.exists():
            # Checked again as it is unpacked: the stored file must still be the bytes the tenant sent.
            extract_bundle(
                Path(request.bundle_path), code_dir, expected_sha256=request.workload.bundle.removeprefix("sha256:")
            )
        return code_dir

    def _rank_env(self, request: LaunchRequest, work_dir: Path) -> dict[str, str]:
        """Everything a rank's environment holds: what its job needs, nothing of the control plane's
        (no database URL, no secret key, no other job's anything). The S3 settings of the checkpoint
        store pass through, since the ranks write their checkpoints there."""
        env = self._base_env(work_dir)
        env["POLYCHIP_JOB_ID"] = request.job_id
        env["POLYCHIP_ARTIFACTS_DIR"] = request.artifacts_dir
        checkpoint_dir = _local_store_dir(request.checkpoint_url)
        if checkpoint_dir is not None:
            # Where a torchrun script keeps its own checkpoints: the job's store, across its attempts.
            env["POLYCHIP_CHECKPOINT_DIR"] = str(checkpoint_dir)
        env.update(request.workload.env)
        return env

    def _base_env(self, home: Path) -> dict[str, str]:
        """What every rank's environment holds, whatever its job."""
        python_dir = str(Path(self.python).parent)
        env = {
            "PATH": os.pathsep.join((python_dir, "/usr/local/bin", "/usr/bin", "/bin")),
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "PYTHONPATH": str(_project_root()),
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
        }
        if sys.platform.startswith("linux"):
            # All ranks talk over loopback; without this gloo resolves the hostname, which fails in
            # some containers.
            env["GLOO_SOCKET_IFNAME"] = "lo"
        for name, value in os.environ.items():
            if name.startswith("AWS_") or name == STORE_ENDPOINT_ENV:
                env[name] = value
        return env

    def _hand_over(self, request: LaunchRequest, run_dir: Path, work_dir: Path, run_as: sandbox_module.RunAs) -> None:
        """Give the job's user its folders and let it reach them, and nothing else of ours."""
        sandbox_module.hand_over(work_dir, run_as)
        sandbox_module.hand_over(Path(request.artifacts_dir), run_as)
        checkpoint_dir = _local_store_dir(request.checkpoint_url)
        if checkpoint_dir is not None:
            sandbox_module.hand_over(checkpoint_dir, run_as)
        os.chmod(run_dir, 0o711)  # noqa: S103 (traversal only: its own files by exact name, no listing)
        sandbox_module.make_traversable(run_dir)

    def _start_supervisor(self, run_dir: Path) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        # The supervisor and ranks import ``runtime`` from the same tree as this process.
        root = str(_project_root())
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        with open(run_dir / "supervisor.out", "ab") as out, open(run_dir / "supervisor.err", "ab") as err:
            return subprocess.Popen(  # noqa: S603 (our interpreter and module, no shell)
                [self.python, "-m", _SUPERVISOR_MODULE, str(run_dir)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=run_dir,
                env=env,
                start_new_session=True,  # out of the caller's process group and terminal
                close_fds=True,
            )

    def _await_supervisor(self, run_dir: Path, intermediate: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        # The intermediate process forks the supervisor and exits at once; reap it.
        with contextlib.suppress(subprocess.TimeoutExpired):
            intermediate.wait(timeout=_START_TIMEOUT_S)
        while time.monotonic() < deadline:
            if (run_dir / PID_FILE).exists():
                return
            if intermediate.returncode not in (None, 0):
                break
            time.sleep(0.02)
        raise RuntimeError(
            f"local backend: the supervisor for {run_dir.name} did not start: "
            f"{tail(run_dir / 'supervisor.err') or 'no output'}"
        )

    # -- observe -----------------------------------------------------------------------------------

    def observe(self, handle: dict[str, Any]) -> Observation:
        run_dir = self._run_dir(handle)
        if not run_dir.is_dir():
            return Observation(phase=Phase.GONE, reason=f"{run_dir} does not exist")
        final = self._final_status(run_dir)
        if final is not None:
            return self._unless_exiting(run_dir, final)
        status = read_json(run_dir / STATUS_FILE)
        ranks = _rank_states(status)
        pid = _read_pid(run_dir / PID_FILE)
        if pid is None:
            lock = run_dir / LOCK_FILE
            try:
                age = time.time() - lock.stat().st_mtime
            except FileNotFoundError:
                return Observation(phase=Phase.GONE, reason=f"{run_dir} holds no launched job")
            if age < _STARTUP_GRACE_S:
                return Observation(phase=Phase.PENDING, reason="supervisor starting")
            return Observation(
                phase=Phase.FAILED, reason=f"the supervisor never started ({age:.0f} s since the launch was claimed)"
            )
        if pid_alive(pid, str(run_dir)):
            reason = str(status.get("reason", "")) if isinstance(status, dict) else ""
            return Observation(
                phase=Phase.RUNNING, ranks=ranks, reason=reason, failure=_failure(status), failures=_failures(status)
            )
        # It may have written the final status just before exiting.
        final = self._final_status(run_dir)
        if final is not None:
            return final
        err = tail(run_dir / "supervisor.err")
        reason = f"the supervisor (pid {pid}) died without a final status"
        return Observation(phase=Phase.FAILED, ranks=ranks, reason=f"{reason}: {err}" if err else reason)

    def _unless_exiting(self, run_dir: Path, final: Observation) -> Observation:
        """The final status, once the supervisor that wrote it has exited: a job reported final has no
        process left. A supervisor still alive long after its final word is hung in its exit; the
        status stands then, and teardown kills it."""
        status = read_json(run_dir / STATUS_FILE)
        written_at = status.get("updated_at") if isinstance(status, dict) else None
        if not isinstance(written_at, (int, float)) or time.time() - written_at > _EXIT_GRACE_S:
            return final
        if self._alive_pids(run_dir) == (None, []):
            return final
        return Observation(phase=Phase.RUNNING, ranks=final.ranks, reason=f"exiting: {final.phase.value}")

    def _final_status(self, run_dir: Path) -> Observation | None:
        status = read_json(run_dir / STATUS_FILE)
        if not isinstance(status, dict) or status.get("phase") not in _FINAL_PHASES:
            return None
        return Observation(
            phase=_FINAL_PHASES[status["phase"]],
            ranks=_rank_states(status),
            reason=str(status.get("reason", "")),
            failure=_failure(status),
            failures=_failures(status),
        )

    # -- teardown ----------------------------------------------------------------------------------

    def teardown(self, handle: dict[str, Any]) -> None:
        run_dir = self._run_dir(handle)
        if not run_dir.is_dir():
            return
        before = self.observe(handle)
        atomic_write_text(run_dir / STOP_FILE, "torn down\n")
        if self._alive_pids(run_dir) != (None, []):
            self._signal(run_dir, signal.SIGTERM)
            deadline = time.monotonic() + self.grace_s + 2.0
            while time.monotonic() < deadline and self._alive_pids(run_dir) != (None, []):
                time.sleep(0.05)
            if self._alive_pids(run_dir) != (None, []):
                self._signal(run_dir, signal.SIGKILL)
                deadline = time.monotonic() + 5.0
                while time.monotonic() < deadline and self._alive_pids(run_dir) != (None, []):
                    time.sleep(0.05)
        # A job that had already failed (its supervisor died) keeps that cause on record.
        self._mark_torn_down(run_dir, before.reason if before.phase == Phase.FAILED else "torn down")
        launch = read_json(run_dir / LAUNCH_FILE)
        if isinstance(launch, dict) and isinstance(launch.get("link"), dict) and launch["link"].get("mode") == "netns":
            # A supervisor killed before it removed its emulated link leaves it behind: remove what no
            # live supervisor owns.
            netem.cleanup_stale()

    def tear_down_every_run(self) -> list[str]:
        """Tear down every run under the runs folder that still has a process (``polychip down``: a
        stopped control plane leaves no training behind). Returns the run folders it stopped."""
        stopped = []
        for run_dir in sorted(p for p in self.runs_dir.glob("*") if p.is_dir() and p != self.standby_dir):
            if self._alive_pids(run_dir) != (None, []):
                self.teardown({"backend": self.name, "run_dir": str(run_dir)})
                stopped.append(str(run_dir))
        # After the runs (a claimed rank is the pool's child): the warm processes go too.
        self.stop_standby()
        return stopped

    def _alive_pids(self, run_dir: Path) -> tuple[int | None, list[int]]:
        """The supervisor's pid if it runs, and the pids of rank processes that still run."""
        sup_pid = _read_pid(run_dir / PID_FILE)
        if sup_pid is not None and not pid_alive(sup_pid, str(run_dir)):
            sup_pid = None
        status = read_json(run_dir / STATUS_FILE)
        marks = _standby_marks(status)
        ranks = [
            r.pid
            for r in _rank_states(status)
            if r.pid is not None and pid_alive(r.pid, marks.get(r.rank) or str(run_dir / f"rank{r.rank}.json"))
        ]
        return sup_pid, ranks

    def _signal(self, run_dir: Path, signum: int) -> None:
        sup_pid, rank_pids = self._alive_pids(run_dir)
        if sup_pid is not None:
            signal_group(sup_pid, signum)  # the supervisor leads its group (pgid == pid), ranks included
        # Ranks outlive a supervisor killed with SIGKILL only briefly (they get SIGTERM on its death),
        # but signal them one by one too.
        for pid in rank_pids:
            signal_pid(pid, signum)

    def _mark_torn_down(self, run_dir: Path, reason: str) -> None:
        # Leave a final status unless the supervisor already wrote one (success stays success).
        if self._final_status(run_dir) is not None or not (run_dir / LOCK_FILE).exists():
            return
        status = read_json(run_dir / STATUS_FILE)
        data = status if isinstance(status, dict) else {"ranks": []}
        data.update({"phase": "failed", "reason": reason, "updated_at": time.time()})
        atomic_write_json(run_dir / STATUS_FILE, data)

    def inject_degradation(self, handle: dict[str, Any], rank: int, mode: str, minutes_to_failure: float) -> None:
        """Start a slow degradation of rank N's emulated device (``runtime.recovery.health`` modes:
        thermal, ecc, pcie, jitter, mixed, sudden); it dies ``minutes_to_failure`` emulated minutes on."""
        if not minutes_to_failure > 0:
            raise ValueError(f"minutes_to_failure must be > 0, got {minutes_to_failure}")
        order = {"mode": mode, "minutes_to_failure": minutes_to_failure}
        atomic_write_json(self._run_dir(handle) / f"health.rank{rank}", order, mode=0o644)

    def request_stop(self, handle: dict[str, Any], reason: str) -> None:
        """Ask the ranks to save a full checkpoint and stop: they look for the control file every step."""
        run_dir = self._run_dir(handle)
        if run_dir.is_dir():
            order = {"action": "stop", "reason": reason, "at": time.time()}
            atomic_write_json(run_dir / CONTROL_FILE, order, mode=0o644)  # a sandboxed rank reads it

    # -- logs --------------------------------------------------------------------------------------

    def logs(
        self,
        handle: dict[str, Any],
        *,
        rank: int | None = None,
        since: str | float | None = None,
        limit: int = 1000,
        tail: int | None = None,
    ) -> LogPage:
        """The run's captured output (``runtime.backends.local.logs.read_logs``); empty for a run that
        has none (yet, or any more)."""
        return read_logs(self._run_dir(handle), rank, since, limit=limit, tail=tail)

    # -- benchmarks --------------------------------------------------------------------------------

    def benchmark_flavors(
        self, flavors: Sequence[str] | None = None, *, quick: bool = True, micro: bool = False
    ) -> dict[str, SuiteResult]:
        """``runtime.bench``'s suite once per flavor, emulated as this backend runs that flavor's
        ranks (see ``runtime.backends.local.bench.benchmark_flavors``): ``{flavor: SuiteResult}``."""
        from runtime.backends.local.bench import benchmark_flavors

        return benchmark_flavors(
            self.profiles, flavors, sample_time_ms=self.sample_time_ms, quick=quick, micro=micro, python=self.python
        )

    # -- helpers -----------------------------------------------------------------------------------

    def set_speed(self, handle: dict[str, Any], rank: int, relative_speed: float) -> None:
        """Change a running rank's emulated speed; it takes effect within about half a second."""
        if not math.isfinite(relative_speed) or relative_speed <= 0:
            raise ValueError(f"relative_speed must be a number > 0, got {relative_speed}")
        atomic_write_text(self._run_dir(handle) / f"speed.rank{rank}", f"{relative_speed!r}\n", mode=0o644)

    def _run_dir(self, handle: dict[str, Any]) -> Path:
        if handle.get("backend") != self.name or not isinstance(handle.get("run_dir"), str):
            raise ValueError(f"not a local backend handle: {handle!r}")
        return Path(handle["run_dir"])


def _local_store_dir(url: str | None) -> Path | None:
    """The folder of a checkpoint store on this host's file system, or None (S3, or none)."""
    if not url or ("://" in url and not url.startswith("file://")):
        return None
    return Path(url.removeprefix("file://"))


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _standby_marks(status: Any) -> dict[int, str]:
    """Rank -> the command-line mark of the standby that runs it (``runtime.backends.local.standby``)."""
    entries = status.get("ranks") if isinstance(status, dict) else None
    marks = {}
    for entry in entries if isinstance(entries, list) else ():
        pool = entry.get("standby") if isinstance(entry, dict) else None
        if isinstance(pool, dict) and isinstance(pool.get("mark"), str) and isinstance(entry.get("rank"), int):
            marks[entry["rank"]] = pool["mark"]
    return marks


def _failures(status: Any) -> tuple[Failure, ...]:
    entries = status.get("failures") if isinstance(status, dict) else None
    if not isinstance(entries, list):
        return ()
    parsed = (_failure({"failure": entry}) for entry in entries)
    return tuple(f for f in parsed if f is not None)


def _failure(status: Any) -> Failure | None:
    failure = status.get("failure") if isinstance(status, dict) else None
    if not isinstance(failure, dict):
        return None
    try:
        code = failure.get("exit_code")
        return Failure(
            rank=int(failure["rank"]),
            cause=str(failure["cause"]),
            detected_at=float(failure["detected_at"]),
            exit_code=code if isinstance(code, int) else None,
        )
    except (KeyError, TypeError, ValueError):
        return None


def _rank_states(status: Any) -> tuple[RankState, ...]:
    if not isinstance(status, dict) or not isinstance(status.get("ranks"), list):
        return ()
    states = []
    for entry in status["ranks"]:
        if isinstance(entry, dict) and isinstance(entry.get("rank"), int):
            pid, code = entry.get("pid"), entry.get("exit_code")
            states.append(
                RankState(
                    rank=entry["rank"],
                    pid=pid if isinstance(pid, int) else None,
                    exit_code=code if isinstance(code, int) else None,
                )
            )
    return tuple(states)
