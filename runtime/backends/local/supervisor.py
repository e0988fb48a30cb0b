"""Supervisor of one local job: ``python -m runtime.backends.local.supervisor RUN_DIR``.

Started detached by ``LocalBackend.provision``: it forks once more and calls setsid, so it is
reparented away from the provisioning process (a Celery worker child may die or never reap it) and
leads its own process group, which ``teardown`` signals as a whole. It then:

1. writes ``RUN_DIR/supervisor.pid`` (and launches nothing if the run was already torn down);
2. starts one rank launcher process per rank, as described by ``RUN_DIR/launch.json``, its stdout
   and stderr read through pipes into ``RUN_DIR/rank<N>.log``, capped at launch.json's
   ``log_cap_bytes`` per rank, oldest lines dropped (``runtime.backends.local.logs``);
3. keeps ``RUN_DIR/status.json`` current (atomically): phase, reason, each rank's pid and exit code;
4. if a rank exits non-zero, terminates the others (SIGTERM, then SIGKILL after ``grace_s``);
5. when every rank has exited writes the final status, ``succeeded`` or ``failed`` with a reason that
   names the rank that failed first (a rank that only lost a peer is not blamed when another is to
   blame), the run, and the last lines of its stderr.

SIGTERM, SIGINT or SIGHUP to the supervisor tears the ranks down the same way, status ``failed``.

When launch.json names a ``standby`` pool, the store's process and each rank are handed to a warm
standby of the host (``runtime.backends.local.standby``) instead of a fresh interpreter, where that is
safe (not as the job's user, not in a network namespace, the same start-up environment); status.json
records which ranks ran in one (``standby``) and why others started fresh (``standby_note``).

When launch.json's ``link`` mode is ``netns``, the supervisor first builds the job's link fabric
(``runtime.backends.local.netem``: a network namespace per vendor group, shaped by ``tc``) from
launch.json's ``fabric`` plan, starts each rank inside its group's namespace, relays the ranks'
telemetry to 127.0.0.1 when the rank configs post there, and removes the fabric once the ranks are
gone, however they went. A fabric that cannot be built fails the job before any rank starts.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

from runtime.backends.local import netem, sandbox, standby
from runtime.backends.local.files import atomic_write_json, atomic_write_text, read_json
from runtime.backends.local.logs import DEFAULT_CAP_BYTES, CapturedOutput, check_cap, last_lines, rank_log
from runtime.backends.local.procs import die_with_parent, signal_pid, wants_cpu
from runtime.worker.cli import EXIT_BAD_CONFIG, EXIT_PEER_LOST, EXIT_STOPPED

LAUNCH_FILE = "launch.json"
STATUS_FILE = "status.json"
PID_FILE = "supervisor.pid"
# Written by teardown before it looks for processes, read by the supervisor after it wrote its pid
# and on every round: whichever of the two comes second sees the other, so no launch escapes.
STOP_FILE = "stop"
POLL_S = 0.05
STORE_LOG = "storehost.log"
# How long an exited process's output may take to reach its log: a grandchild that holds the pipe
# open is not waited for longer.
DRAIN_S = 1.0
# A failure reason quotes the culprit's last lines, each cut to this length.
QUOTED_LINES = 15
QUOTED_LINE_CHARS = 400
DEFAULT_GRACE_S = 5.0
# A rank whose heartbeat file is older than this is declared failed and killed: a stopped or wedged
# process keeps its sockets open, so its peers would otherwise wait out the collective timeout.
DEFAULT_HEARTBEAT_TIMEOUT_S = 4.0
# A rank whose heartbeat is late but which waits for a CPU is starved, not dead: it gets this many
# heartbeat timeouts before it counts as lost (a rank spinning in a hang is caught then).
STARVED_PATIENCE = 10


def heartbeat_lost(age_s: float, timeout_s: float, starved: Callable[[], bool]) -> bool:
    """Whether a rank whose last heartbeat is ``age_s`` old counts as lost.

    Late by the timeout and not waiting for a CPU (stopped, frozen, gone): lost. Late but runnable
    (starved on a loaded host): lost only past ``STARVED_PATIENCE`` timeouts.
    """
    if age_s <= timeout_s:
        return False
    return age_s > STARVED_PATIENCE * timeout_s or not starved()


@dataclass
class _Rank:
    rank: int
    argv: list[str]
    log: Path  # rank_log(): where its output is kept
    proc: subprocess.Popen[bytes] | standby.StandbyProc | None = None
    exit_code: int | None = None
    exited_at: float | None = None  # wall clock
    terminated_by_us: bool = False
    killed_by_us: bool = False  # we sent it SIGKILL (a lost heartbeat, or the end of the grace)
    heartbeat_file: Path | None = None
    # Why the supervisor declared this rank failed, and when (wall clock): "exit" (it ended with an
    # error code), "signal" (killed), "heartbeat" (its heartbeats stopped; the supervisor killed it).
    cause: str | None = None
    detected_at: float | None = None
    output: CapturedOutput | None = None  # its stdout and stderr on their way to ``log``
    spawned_at: float | None = None  # wall clock: when it was started or handed to a standby


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    meaning = {
        EXIT_BAD_CONFIG: " (unusable config)",
        EXIT_PEER_LOST: " (lost a peer)",
        EXIT_STOPPED: " (stopped on request after a checkpoint)",
    }.get(code, "")
    return f"exited with code {code}{meaning}"


class Supervisor:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.status_path = run_dir / STATUS_FILE
        self.ranks: list[_Rank] = []
        self.started_at = time.time()
        self.stop_reason: str | None = None
        # A rank had already failed when the stop came: the control plane is tearing down a run that
        # failed, so the failure, not the teardown it caused, is what the run reports.
        self.rank_failed = False
        self.stopped_after_failure = False
        self.job_id = ""
        self.grace_s = DEFAULT_GRACE_S
        # netns link emulation: the plan from launch.json, each rank's vendor group, the loopback
        # ports the ranks post telemetry to; then the fabric and relays while the ranks run.
        self.fabric_plan: netem.FabricPlan | None = None
        self.rank_groups: dict[int, int] = {}
        self.relay_ports: set[int] = set()
        self.fabric: netem.Fabric | None = None
        self.relays: list[netem.LoopbackRelay] = []
        self.heartbeat_timeout_s = DEFAULT_HEARTBEAT_TIMEOUT_S
        # The c10d store's own process (launch.json "store_host": {"host", "port"}), when the ranks use one.
        self.store_host: tuple[str, int] | None = None
        self.store_proc: subprocess.Popen[bytes] | standby.StandbyProc | None = None
        # What launch.json says the ranks get: their whole environment (None: this process's, for a
        # launch.json written before there was one) and the job's user to run them as (None: ours).
        self.launch_env: dict[str, str] | None = None
        self.run_as: sandbox.RunAs | None = None
        self.store_output: CapturedOutput | None = None
        self.log_cap_bytes = DEFAULT_CAP_BYTES
        # launch.json "standby": {"dir"}: the host's pool of warm rank processes to claim from
        # (``runtime.backends.local.standby``); None: every rank starts fresh.
        self.standby_dir: Path | None = None
        self.standby_note = ""

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.stop_reason is None:
            self.stop_reason = f"torn down (supervisor received {signal.Signals(signum).name})"
            self.stopped_after_failure = self.rank_failed

    def write_status(self, phase: str, reason: str = "") -> None:
        atomic_write_json(
            self.status_path,
            {
                "job_id": self.job_id,
                "phase": phase,
                "reason": reason,
                "supervisor_pid": os.getpid(),
                "started_at": self.started_at,
                "updated_at": time.time(),
                "ranks": [
                    {
                        "rank": r.rank,
                        "pid": r.proc.pid if r.proc else None,
                        "exit_code": r.exit_code,
                        "spawned_at": r.spawned_at,
                        **({"cause": r.cause, "detected_at": r.detected_at} if r.cause else {}),
                        # A standby's command line does not name the rank's config: teardown checks
                        # the pid against this mark instead.
                        **(
                            {"standby": {"mark": r.proc.mark, "started_at": r.proc.started_at}}
                            if isinstance(r.proc, standby.StandbyProc)
                            else {}
                        ),
                    }
                    for r in self.ranks
                ],
                **({"standby_note": self.standby_note} if self.standby_note else {}),
                **({"failure": failure} if (failure := self._first_failure()) else {}),
                **({"failures": failures} if (failures := self._own_failures()) else {}),
            },
        )

    def _first_failure(self) -> dict[str, object] | None:
        """The culprit's rank, cause and detection time, for whoever recovers the job."""
        culprit = self._culprit()
        if culprit is None or culprit.cause is None:
            return None
        return {
            "rank": culprit.rank,
            "cause": culprit.cause,
            "detected_at": culprit.detected_at,
            "exit_code": culprit.exit_code,
        }

    def _own_failures(self) -> list[dict[str, object]]:
        """Every rank that failed on its own, in the order seen: when two devices go at once, both
        are evidence, not only the first. A rank that died of what we sent it (SIGTERM to stop it,
        SIGKILL at the end of the grace) or of losing a peer is not; a SIGKILL we did not send is,
        even when it came after we began stopping the run."""
        own = [
            r
            for r in self.ranks
            if r.cause is not None
            and (
                r.cause == "heartbeat"
                or (
                    r.exit_code not in (EXIT_PEER_LOST, -signal.SIGTERM)
                    and not r.killed_by_us
                    and (not r.terminated_by_us or r.exit_code == -signal.SIGKILL)
                )
            )
        ]
        own.sort(key=lambda r: r.detected_at or r.exited_at or 0.0)
        return [{"rank": r.rank, "cause": r.cause, "detected_at": r.detected_at, "exit_code": r.exit_code} for r in own]

    def load(self) -> str | None:
        """Read launch.json; returns an error message when it is unusable."""
        launch = read_json(self.run_dir / LAUNCH_FILE)
        entries = launch.get("ranks") if isinstance(launch, dict) else None
        if not isinstance(launch, dict) or not isinstance(entries, list) or not entries:
            return f"{self.run_dir / LAUNCH_FILE} is missing or not a launch description"
        self.job_id = str(launch.get("job_id", ""))
        self.grace_s = float(launch.get("grace_s", DEFAULT_GRACE_S))
        env = launch.get("env")
        if isinstance(env, dict):
            self.launch_env = {str(k): str(v) for k, v in env.items()}
        run_as = launch.get("run_as")
        if isinstance(run_as, dict):
            try:
                self.run_as = sandbox.RunAs(int(run_as["uid"]), int(run_as["gid"]))
            except (KeyError, TypeError, ValueError) as exc:
                return f"{self.run_dir / LAUNCH_FILE}: bad run_as ({exc!r})"
        python = str(launch.get("python") or sys.executable)
        try:
            for entry in entries:
                argv = [
                    python,
                    "-m",
                    "runtime.backends.local.rank",
                    "--config",
                    str(entry["config"]),
                    "--speed",
                    repr(float(entry["speed"])),
                    "--sample-time-ms",
                    repr(float(launch["sample_time_ms"])),
                ]
                if entry.get("speed_file"):
                    argv += ["--speed-file", str(entry["speed_file"])]
                if entry.get("device_id"):
                    argv += ["--device-id", str(entry["device_id"]), "--health-file", str(entry["health_file"])]
                    argv += ["--minutes-per-second", repr(float(launch.get("health_minutes_per_second", 1.0)))]
                rank = int(entry["rank"])
                heartbeat = Path(str(entry["heartbeat_file"])) if entry.get("heartbeat_file") else None
                log = rank_log(self.run_dir, rank)
                self.ranks.append(_Rank(rank, argv, log, heartbeat_file=heartbeat))
            self.heartbeat_timeout_s = float(launch.get("heartbeat_timeout_s", DEFAULT_HEARTBEAT_TIMEOUT_S))
            store_host = launch.get("store_host")
            if isinstance(store_host, dict):
                self.store_host = (str(store_host["host"]), int(store_host["port"]))
            self.log_cap_bytes = check_cap(launch.get("log_cap_bytes", DEFAULT_CAP_BYTES))
        except (KeyError, TypeError, ValueError) as exc:
            return f"{self.run_dir / LAUNCH_FILE}: bad entry ({exc!r})"
        pool = launch.get("standby")
        if isinstance(pool, dict) and isinstance(pool.get("dir"), str):
            self.standby_dir = Path(pool["dir"])
        link = launch.get("link")
        if isinstance(link, dict) and link.get("mode") == "netns":
            return self._load_fabric(launch, entries)
        return None

    def _load_fabric(self, launch: dict[str, object], entries: list[Any]) -> str | None:
        try:
            self.fabric_plan = netem.FabricPlan.from_json(launch.get("fabric"))
            groups = launch["vendor_groups"]
            if not isinstance(groups, list):
                raise TypeError("vendor_groups is not a list")
            self.rank_groups = {r.rank: int(groups[r.rank]) for r in self.ranks}
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            return f"{self.run_dir / LAUNCH_FILE}: link mode netns without a usable fabric plan ({exc})"
        if any(not 0 <= g < len(self.fabric_plan.groups) for g in self.rank_groups.values()):
            return f"{self.run_dir / LAUNCH_FILE}: vendor_groups name a group the fabric plan lacks"
        for entry in entries:
            config = read_json(Path(str(entry["config"])))
            url = config.get("telemetry_url") if isinstance(config, dict) else None
            if not isinstance(url, str) or not url:
                continue
            parts = urlsplit(url)
            # Inside a namespace 127.0.0.1 is the namespace's own loopback: relay it to the root's.
            if parts.hostname in ("127.0.0.1", "localhost"):
                try:
                    port = parts.port
                except ValueError:
                    continue  # the rank reports the bad URL itself
                self.relay_ports.add(port or (443 if parts.scheme == "https" else 80))
        return None

    def setup_link(self) -> str | None:
        """Build the fabric and the telemetry relays (netns mode only); an error message on failure."""
        plan = self.fabric_plan
        if plan is None:
            return None
        netem.cleanup_stale()  # fabrics left by supervisors that were killed outright
        try:
            self.fabric = netem.Fabric.create(plan, owner_arg=str(self.run_dir))
            for group in sorted(set(self.rank_groups.values())):
                for port in sorted(self.relay_ports):
                    self.relays.append(netem.LoopbackRelay(plan.namespace(group), port).start())
        except netem.FabricError as exc:
            return f"could not set up the emulated link (link_shaping netns): {exc}"
        return None

    def teardown_link(self) -> None:
        for relay in self.relays:
            relay.stop()
        self.relays = []
        if self.fabric is not None:
            self.fabric.destroy()
            self.fabric = None

    def start_store_host(self, env: dict[str, str]) -> str | None:
        """Start the c10d store's own process; an error message if it cannot be started.

        The ranks start at the same time, not after it listens: their clients retry the connection
        until the rendezvous timeout, and torch's import (a few seconds for it and for each rank)
        then happens side by side instead of one after the other. A store that dies is a failure of
        the run (``supervise``)."""
        if self.store_host is None:
            return None
        host, port = self.store_host
        argv = [self.ranks[0].argv[0], "-m", "runtime.recovery.storehost", host, str(port)]
        if self.fabric is not None:
            argv = self.fabric.wrap(argv, self.rank_groups[0])  # beside rank 0, at its group's address
        try:
            self.store_output = CapturedOutput(self.run_dir / STORE_LOG, self.log_cap_bytes)
            with self.store_output.pipes() as (stdout, stderr):
                # Warm too where the ranks may be: a store that imports torch afresh holds up the
                # rendezvous of ranks that did not.
                if self.standby_dir is not None and self.fabric is None:
                    proc, why = self._claim(argv, stdout, stderr, env, self.run_dir)
                    if proc is not None:
                        self.store_proc = proc
                        return None
                    self.standby_note = f"the store started fresh: {why}"
                self.store_proc = self._start(argv, stdout, stderr, env)
        except OSError as exc:
            return f"the rendezvous store could not be started: {exc}"
        return None

    def _store_host_died(self) -> str | None:
        if self.store_proc is None or self.store_proc.poll() is None:
            return None
        if self.store_output is not None:
            self.store_output.drain(DRAIN_S)
        last = last_lines(self.run_dir / STORE_LOG, 1, stream="err")
        why = last[-1].text[:QUOTED_LINE_CHARS] if last else f"exit code {self.store_proc.returncode}"
        host, port = self.store_host or ("?", 0)
        return f"the rendezvous store on {host}:{port} exited: {why}"

    def stop_store_host(self) -> None:
        if self.store_proc is not None and self.store_proc.poll() is None:
            self.store_proc.terminate()
            try:
                self.store_proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.store_proc.kill()
                self.store_proc.wait()
        self.store_proc = None

    def rank_env(self) -> dict[str, str]:
        env = dict(self.launch_env) if self.launch_env is not None else dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env.setdefault(var, "1")
        if sys.platform.startswith("linux"):
            # All ranks talk over loopback; without this gloo resolves the hostname, which fails in
            # some containers.
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        if self.fabric is not None:
            # Gloo binds the group's veth address; peers in the same namespace reach it over loopback.
            env["GLOO_SOCKET_IFNAME"] = self.fabric.plan.ifname
        return env

    def spawn(self, env: dict[str, str]) -> None:
        # The tenant's code starts in its unpacked bundle, where its relative paths point.
        code = self.run_dir / "work" / "code"
        cwd = code if code.is_dir() else self.run_dir
        # A standby cannot enter a network namespace: those ranks always start fresh. The job's own
        # user it can become (it drops to it, as setpriv does for a fresh rank, before the rank starts).
        warm = self.standby_dir is not None and self.fabric is None
        notes: list[str] = []
        for r in self.ranks:
            argv = sandbox.wrap(r.argv, self.run_as) if self.run_as is not None else r.argv
            argv = self.fabric.wrap(argv, self.rank_groups[r.rank]) if self.fabric is not None else argv
            r.output = CapturedOutput(r.log, self.log_cap_bytes)
            with r.output.pipes() as (stdout, stderr):
                r.spawned_at = time.time()
                if warm:
                    proc, why = self._claim(r.argv, stdout, stderr, env, cwd, self.run_as)
                    if proc is not None:
                        r.proc = proc
                        continue
                    notes.append(f"rank {r.rank}: {why}")
                r.proc = self._start(argv, stdout, stderr, env, cwd)
        if notes:
            self.standby_note = "; ".join(filter(None, (self.standby_note, "started fresh: " + "; ".join(notes))))

    def _claim(
        self,
        argv: list[str],
        stdout: int,
        stderr: int,
        env: dict[str, str],
        cwd: Path,
        run_as: sandbox.RunAs | None = None,
    ) -> tuple[standby.StandbyProc | None, str]:
        """``argv`` ([python, "-m", module, *arguments]) run in one of the host's warm standbys, as
        ``run_as`` when given."""
        if self.standby_dir is None or argv[1:2] != ["-m"]:
            return None, "no standby pool"
        return standby.claim(self.standby_dir, argv[0], argv[2], argv[3:], env, cwd, stdout, stderr, run_as=run_as)

    def _start(
        self, argv: list[str], stdout: int, stderr: int, env: dict[str, str], cwd: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """A child in the run dir, its stdout and stderr to these descriptors (the write ends of its
        ``CapturedOutput``'s pipes), that dies when this supervisor does."""
        me = os.getpid()
        # argv: the rank launcher that this backend wrote into launch.json (maybe inside `ip netns exec`).
        return subprocess.Popen(  # noqa: S603 (our own launcher, no shell)
            argv,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            cwd=cwd or self.run_dir,
            env=env,
            preexec_fn=lambda: die_with_parent(me),
        )

    def _alive(self) -> list[tuple[_Rank, subprocess.Popen[bytes] | standby.StandbyProc]]:
        """Each rank that was started and has not exited, with its process."""
        return [(r, r.proc) for r in self.ranks if r.proc is not None and r.exit_code is None]

    def _begin_termination(self) -> float:
        for r, proc in self._alive():
            r.terminated_by_us = True
            signal_pid(proc.pid, signal.SIGTERM)
        return time.monotonic() + self.grace_s

    def _culprit(self) -> _Rank | None:
        """The first rank to fail on its own, not one that merely lost a peer or that we stopped.

        A rank that lost a peer exits within milliseconds of the peer's death, and its exit can be
        seen first (a rank in a warm standby reports its end through the pool). While any rank is
        still running, such a failure names nobody: the one to blame shows a moment later, and the
        control plane must not mark the wrong device failed. Once every rank has ended with nothing
        else to blame, the first failure is named after all."""
        # A rank that stopped on request did not fail. Times are all wall clock: a heartbeat kill is
        # dated when it was declared, an exit when it was seen.
        failed = sorted(
            (
                r
                for r in self.ranks
                if r.cause is not None or (r.exit_code not in (None, 0, EXIT_STOPPED) and r.exited_at is not None)
            ),
            key=lambda r: r.detected_at or r.exited_at or 0.0,
        )
        if not failed:
            return None
        causes = [
            r for r in failed if r.cause == "heartbeat" or (r.exit_code != EXIT_PEER_LOST and not r.terminated_by_us)
        ]
        if causes:
            return causes[0]
        return None if self._alive() else failed[0]

    def _failure_reason(self) -> str:
        culprit = self._culprit()
        if culprit is None:
            return ""
        if culprit.cause == "heartbeat":
            reason = f"rank {culprit.rank} sent no heartbeat for {self.heartbeat_timeout_s:g} s and was killed"
        elif culprit.exit_code is not None:
            reason = f"rank {culprit.rank} {_describe_exit(culprit.exit_code)}"
        else:  # not reached: a culprit either stopped its heartbeats or exited
            reason = f"rank {culprit.rank} failed"
        if culprit.output is not None and culprit.exit_code is not None:
            culprit.output.drain(DRAIN_S)  # its last words may still be in the pipe
        stream = "stderr"
        lines = last_lines(culprit.log, QUOTED_LINES, stream="err", rank=culprit.rank)
        if not lines:  # a program that reports its errors on stdout
            stream, lines = "output", last_lines(culprit.log, QUOTED_LINES, rank=culprit.rank)
        if not lines:
            return reason
        quoted = "\n".join(line.text[:QUOTED_LINE_CHARS] for line in lines)
        run = f" (run {self.job_id})" if self.job_id else ""
        # The last line usually says why in one line; the lines before it follow for whoever digs deeper.
        return (
            f"{reason}: {lines[-1].text[:QUOTED_LINE_CHARS]}\n"
            f"--- last {len(lines)} lines of rank {culprit.rank}'s {stream}{run} ---\n{quoted}"
        )

    def supervise(self) -> str:
        """Wait for the ranks, stopping them all on the first failure; returns the final phase."""
        kill_at: float | None = None
        failed = False
        self.write_status("running")
        while True:
            changed = False
            for r, proc in self._alive():
                code = proc.poll()
                if code is not None:
                    r.exit_code, r.exited_at, changed = code, time.time(), True
                    if code not in (0, EXIT_STOPPED) and r.cause is None:
                        r.cause, r.detected_at = ("signal" if code < 0 else "exit"), time.time()
                    failed = failed or code not in (0, EXIT_STOPPED)
                elif kill_at is None and self._heartbeat_lost(r, proc.pid):
                    r.cause, r.detected_at, changed, failed = "heartbeat", time.time(), True, True
                    signal_pid(proc.pid, signal.SIGKILL)
            self.rank_failed = failed
            if self.stop_reason is None and (self.run_dir / STOP_FILE).exists():
                self.stop_reason = "torn down"
                self.stopped_after_failure = failed
            if self.stop_reason is None and (died := self._store_host_died()) is not None:
                self.stop_reason = died
            if kill_at is None and (failed or self.stop_reason is not None):
                kill_at = self._begin_termination()
            if kill_at is not None and time.monotonic() >= kill_at:
                for r, proc in self._alive():
                    r.killed_by_us = True
                    signal_pid(proc.pid, signal.SIGKILL)
            if not self._alive():
                break
            if changed:
                self.write_status("running", self._failure_reason())
            time.sleep(POLL_S)
        # Before the final status: whoever sees it may tear the job down at once, and then the
        # fabric must already be gone, not half-way through its removal.
        self.stop_store_host()
        self.teardown_link()
        self.finish_logs()
        if self.stop_reason is not None and not self.stopped_after_failure:
            cause = self._failure_reason()
            self.write_status("failed", f"{self.stop_reason}; {cause}" if cause else self.stop_reason)
            return "failed"
        if not failed and any(r.exit_code == EXIT_STOPPED for r in self.ranks):
            self.write_status("stopped", "the ranks saved a checkpoint and stopped on request")
            return "stopped"
        if failed:
            self.write_status("failed", self._failure_reason())
            return "failed"
        self.write_status("succeeded")
        return "succeeded"

    def finish_logs(self) -> None:
        """Let the last output of every process reach its log (its pipes end), then close the logs."""
        deadline = time.monotonic() + 2 * DRAIN_S
        for output in [*(r.output for r in self.ranks), self.store_output]:
            if output is not None:
                output.drain(max(0.0, deadline - time.monotonic()))
                output.close()

    def _heartbeat_lost(self, r: _Rank, pid: int) -> bool:
        # Only once the rank's first heartbeat is there: before that it is starting (importing torch,
        # rendezvous), which the rendezvous timeout bounds.
        if r.heartbeat_file is None:
            return False
        try:
            age = time.time() - r.heartbeat_file.stat().st_mtime
        except FileNotFoundError:
            return False
        return heartbeat_lost(age, self.heartbeat_timeout_s, starved=lambda: wants_cpu(pid))

    def run(self) -> int:
        # Handlers before the pid file: once teardown can find this process, SIGTERM is handled.
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        atomic_write_text(self.run_dir / PID_FILE, f"{os.getpid()}\n")
        previous = read_json(self.status_path)
        if (self.run_dir / STOP_FILE).exists() or (
            isinstance(previous, dict) and previous.get("phase") in ("succeeded", "failed")
        ):
            return 0  # torn down (or finished) before this supervisor got going: launch nothing
        error = self.load()
        if error is not None:
            self.write_status("failed", error)
            return 1
        if self.stop_reason is not None:
            self.write_status("failed", self.stop_reason)
            return 0
        try:
            error = self.setup_link()
            if error is not None or self.stop_reason is not None:
                self.teardown_link()
                # A teardown during the set-up may be what broke it (its SIGTERM reaches our `ip` too).
                self.write_status("failed", self.stop_reason or error or "")
                return 0 if self.stop_reason is not None else 1
            env = self.rank_env()
            error = self.start_store_host(env)
            if error is not None or self.stop_reason is not None:
                self.stop_store_host()
                self.teardown_link()
                self.write_status("failed", self.stop_reason or error or "")
                return 0 if self.stop_reason is not None else 1
            try:
                self.spawn(env)
            except OSError as exc:
                for r, proc in self._alive():
                    signal_pid(proc.pid, signal.SIGKILL)
                    r.exit_code = proc.wait()
                self.teardown_link()
                self.write_status("failed", f"could not start the rank processes: {exc}")
                return 1
            self.supervise()
            return 0
        finally:
            # Done already on every path that ends in a final status; this is for a crash.
            self.stop_store_host()
            self.teardown_link()


def _daemonize() -> None:
    # Fork so the process the provisioner started exits at once (it reaps it, no zombie), and
    # setsid so this process leads a fresh group that teardown can signal as a whole.
    if os.fork() > 0:
        os._exit(0)
    os.setsid()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.backends.local.supervisor")
    parser.add_argument("run_dir")
    parser.add_argument("--foreground", action="store_true", help="do not fork (for debugging)")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir).resolve()
    if not args.foreground:
        _daemonize()
    supervisor = Supervisor(run_dir)
    try:
        return supervisor.run()
    except Exception as exc:  # leave a final status behind rather than a silent corpse
        supervisor.write_status("failed", f"supervisor crashed: {exc!r}")
        raise


if __name__ == "__main__":
    sys.exit(main())
