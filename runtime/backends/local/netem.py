"""Real link shaping for the local backend: a network namespace per vendor group, ``tc`` on its veth.

On loopback every byte is free, so compression never pays. With ``link_shaping`` ``netns`` the
local backend puts each vendor group's ranks in a network namespace of their own, wired to a bridge
in the root namespace, and shapes what leaves each namespace with a token-bucket filter:

    root namespace:   bridge <name>br (10.A.B.1/24) ── <name>h<g> (root end of group g's veth)
    namespace <name>g<g>:   lo, and <ifname> (10.A.B.<10+g>/24, default route via 10.A.B.1), tbf

A byte from group 0 to group 1 leaves through group 0's veth (shaped there, once) and enters group
1's unshaped; ranks of one group talk over their namespace's own address, which the kernel routes
over the namespace's loopback, unshaped, like a fast in-vendor link.

``FabricPlan`` is the pure part (names, addresses; JSON in launch.json), ``Fabric`` runs ``ip`` and
``tc`` (root only). Every fabric leaves a marker in ``MARKER_DIR`` naming the process that owns it,
written before anything is created, so that ``cleanup_stale`` can remove fabrics whose supervisor
died without cleaning up, and nothing else. ``LoopbackRelay`` carries the ranks' HTTP telemetry to
127.0.0.1 of the root namespace (inside a namespace, 127.0.0.1 is the namespace's own loopback).

No torch, no Django: the supervisor imports this.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import hashlib
import ipaddress
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.backends.local.procs import pid_alive

__all__ = [
    "IFNAME",
    "MARKER_DIR",
    "PREFIX",
    "Fabric",
    "FabricError",
    "FabricPlan",
    "GroupLink",
    "LoopbackRelay",
    "cleanup_stale",
    "subnets_in_use",
    "tbf_args",
    "tx_bytes",
    "unavailable_reason",
]

# Every interface and namespace of ours starts with this; cleanup only ever touches such names.
PREFIX = "pcnet"
# The interface of a group's namespace; the same name in every namespace (GLOO_SOCKET_IFNAME).
IFNAME = "pcnet-link"
# Owner markers, one ``<name>.json`` per fabric. /run is a tmpfs: markers vanish with the fabrics on reboot.
MARKER_DIR = Path("/run/polychip-netem")
NETNS_DIR = Path("/var/run/netns")
# Group g has address .<_FIRST_HOST + g>; .1 is the bridge (the root namespace).
_FIRST_HOST = 10
MAX_GROUPS = 200
_NAME = re.compile(rf"^{PREFIX}[0-9a-f]{{6}}$")
_CMD_TIMEOUT_S = 10.0
CLONE_NEWNET = 0x40000000

# Shaping: tbf at the rate, a bucket of 2 ms of the rate (at least 64 KiB) and a 20 ms queue.
# Measured on this project's CI host, one TCP stream from one group to another over veth (GSO on),
# 2 s each: at 1 Gbit/s a 16 KiB bucket (the common recipe, and 1-2 MTU-sized ones) gives 0.67-0.88
# Gbit/s, as tbf splits every 64 KiB GSO packet and TCP sees drops; 64 KiB gives 0.88-0.92; 256 KiB
# and up 0.95-0.96, which is the rate less the TCP/IP/Ethernet headers (1448 of 1514 bytes = 95.6%).
# Bigger buckets gain nothing more and let a short message after an idle pause cross unshaped, so
# the bucket stays at 2 ms (250 KB at 1 Gbit/s: 0.953-0.957 measured; 0.47-0.48 at 0.5; 0.095 at
# 0.1; 4.4-4.7 at 5). The queue: 5 ms already suffices with such a bucket, 100 ms only adds delay.
_BURST_S = 0.002
_MIN_BURST_BYTES = 64 * 1024
_LATENCY_MS = 20


ETC_NETNS = Path("/etc/netns")


class FabricError(RuntimeError):
    """The fabric could not be created: the message names the command and what it said."""


# -- plan (pure) -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupLink:
    """Group g's end of the fabric: its namespace, its veth's root end, its address."""

    namespace: str
    host_veth: str
    address: str


@dataclass(frozen=True)
class FabricPlan:
    """Names and addresses of one job's fabric; JSON round-trippable (launch.json's ``fabric``)."""

    name: str
    job_id: str
    gbit: float
    subnet: str
    bridge: str
    host_address: str
    ifname: str
    groups: tuple[GroupLink, ...]

    @classmethod
    def for_job(
        cls, job_id: str, groups: int, gbit: float, *, key: str | None = None, in_use: Iterable[str] = ()
    ) -> FabricPlan:
        """The plan for ``groups`` vendor groups shaped to ``gbit`` Gbit/s.

        Names and the /24 come from a hash of ``key`` (default: the job id; the local backend passes
        the run dir, so that two runs dirs with the same job id get different fabrics). The subnet is
        10.A.B.0/24 with A in 128..239 (clear of the 10.0-10.127 ranges that clusters and VPNs like),
        stepping on, deterministically, while it overlaps a network in ``in_use``
        (``subnets_in_use()``)."""
        if not 1 <= groups <= MAX_GROUPS:
            raise ValueError(f"groups: a fabric has 1 to {MAX_GROUPS} vendor groups, got {groups}")
        if not gbit > 0:
            raise ValueError(f"gbit: must be > 0, got {gbit}")
        digest = hashlib.sha256((key if key is not None else job_id).encode()).digest()
        name = f"{PREFIX}{digest[:3].hex()}"
        taken = [ipaddress.ip_network(n, strict=False) for n in in_use]
        subnet = None
        for attempt in range(4096):
            seed = hashlib.sha256(digest + attempt.to_bytes(2, "big")).digest() if attempt else digest
            candidate = ipaddress.ip_network(f"10.{128 + seed[3] % 112}.{seed[4]}.0/24")
            if not any(candidate.overlaps(t) for t in taken if t.version == 4):
                subnet = candidate
                break
        if subnet is None:
            raise ValueError("no free 10.128-239.x.0/24 subnet for the link fabric; free one or use token_bucket")
        base = subnet.network_address
        return cls(
            name=name,
            job_id=job_id,
            gbit=float(gbit),
            subnet=str(subnet),
            bridge=f"{name}br",
            host_address=str(base + 1),
            ifname=IFNAME,
            groups=tuple(
                GroupLink(namespace=f"{name}g{g}", host_veth=f"{name}h{g}", address=str(base + _FIRST_HOST + g))
                for g in range(groups)
            ),
        )

    def address(self, group: int) -> str:
        return self.groups[group].address

    def namespace(self, group: int) -> str:
        return self.groups[group].namespace

    @property
    def prefix_len(self) -> int:
        return ipaddress.ip_network(self.subnet).prefixlen

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "job_id": self.job_id,
            "gbit": self.gbit,
            "subnet": self.subnet,
            "bridge": self.bridge,
            "host_address": self.host_address,
            "ifname": self.ifname,
            "groups": [{"namespace": g.namespace, "host_veth": g.host_veth, "address": g.address} for g in self.groups],
        }

    @classmethod
    def from_json(cls, raw: Any) -> FabricPlan:
        try:
            plan = cls(
                name=str(raw["name"]),
                job_id=str(raw["job_id"]),
                gbit=float(raw["gbit"]),
                subnet=str(raw["subnet"]),
                bridge=str(raw["bridge"]),
                host_address=str(raw["host_address"]),
                ifname=str(raw["ifname"]),
                groups=tuple(
                    GroupLink(namespace=str(g["namespace"]), host_veth=str(g["host_veth"]), address=str(g["address"]))
                    for g in raw["groups"]
                ),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"fabric: not a fabric plan ({exc!r}); it is written by the local backend") from None
        # Whatever the file says, only our own names are ever handed to ``ip link del``/``ip netns del``.
        # Exactly the shapes ``for_job`` makes: a name such as "<name>g1/.." would reach rmtree and ip as root.
        own = re.compile(rf"^{re.escape(plan.name)}(br|g\d{{1,3}}|h\d{{1,3}})$")
        names = [plan.bridge, *(g.namespace for g in plan.groups), *(g.host_veth for g in plan.groups)]
        if not _NAME.match(plan.name) or not all(own.match(n) for n in names) or plan.ifname != IFNAME:
            raise ValueError(f"fabric.name: {plan.name!r} and its interfaces must be {PREFIX}<6 hex>...")
        return plan


def tbf_args(gbit: float) -> list[str]:
    """``tc`` arguments after ``root`` for a link of ``gbit`` Gbit/s (see ``_BURST_S``)."""
    burst = max(_MIN_BURST_BYTES, int(gbit * 1e9 / 8 * _BURST_S))
    return ["tbf", "rate", f"{gbit * 1000:g}mbit", "burst", str(burst), "latency", f"{_LATENCY_MS}ms"]


# -- commands ---------------------------------------------------------------------------------------


def _run(argv: Sequence[str]) -> None:
    try:
        done = subprocess.run(  # noqa: S603 (an `ip`/`tc` argv built in this module, no shell)
            list(argv), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=_CMD_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FabricError(f"`{' '.join(argv)}` failed: {exc}") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise FabricError(f"`{' '.join(argv)}` failed: {said[-1] if said else f'exit code {done.returncode}'}")


def _quiet(argv: Sequence[str]) -> None:
    """For removal: errors are ignored, and the command runs in a session of its own, so that a
    teardown's SIGTERM to the supervisor's process group cannot stop a removal half-way."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(  # noqa: S603 (an `ip`/`tc` argv built in this module, no shell)
            list(argv),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_CMD_TIMEOUT_S,
            start_new_session=True,
        )


def subnets_in_use() -> list[str]:
    """The IPv4 networks this host's root namespace has addresses or routes in (best effort)."""
    found: list[str] = []
    for argv in (["ip", "-4", "-o", "addr", "show"], ["ip", "-4", "route", "show", "table", "all"]):
        try:  # S603: the fixed argv above, no shell
            out = subprocess.run(argv, capture_output=True, text=True, timeout=_CMD_TIMEOUT_S).stdout  # noqa: S603
        except (OSError, subprocess.SubprocessError):
            continue
        for token in out.split():
            with contextlib.suppress(ValueError):
                if "/" in token or token[:1].isdigit():
                    net = ipaddress.ip_network(token, strict=False)
                    if net.version == 4 and not net.is_loopback and net.prefixlen > 0:
                        found.append(str(net))
    return sorted(set(found))


# -- availability -----------------------------------------------------------------------------------

_unavailable: list[str | None] = []


def unavailable_reason() -> str | None:
    """None when real shaping works here, else why not, in one line. Probed once per process:
    a throwaway namespace, bridge, veth and tbf qdisc are created and removed."""
    if not _unavailable:
        _unavailable.append(_probe())
    return _unavailable[0]


def _probe() -> str | None:
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not on PATH (install iproute2)"
    if os.geteuid() != 0:
        return f"network namespaces and tc need root (this process runs as uid {os.geteuid()})"
    plan = FabricPlan.for_job(f"probe-{os.getpid()}-{threading.get_ident()}", 1, 1.0, in_use=subnets_in_use())
    try:
        Fabric.create(plan).destroy()
    except FabricError as exc:
        return f"could not build a test fabric: {exc}"
    return None


# -- the fabric -------------------------------------------------------------------------------------


class Fabric:
    """A created fabric; ``destroy`` removes it (and never raises)."""

    def __init__(self, plan: FabricPlan) -> None:
        self.plan = plan

    @property
    def marker(self) -> Path:
        return MARKER_DIR / f"{self.plan.name}.json"

    @classmethod
    def create(cls, plan: FabricPlan, *, owner_pid: int | None = None, owner_arg: str | None = None) -> Fabric:
        """Build the fabric for ``plan``, owned by ``owner_pid`` (default: this process) whose command
        line holds ``owner_arg`` (guards against pid reuse). A half-built fabric of the same name whose
        owner is gone is removed first; one whose owner lives is not touched (FabricError)."""
        fabric = cls(plan)
        owner_pid = os.getpid() if owner_pid is None else owner_pid
        if owner_arg is not None and not pid_alive(owner_pid, owner_arg):
            owner_arg = None  # the check would call a live owner dead: rather check the pid alone
        previous = _read_marker(fabric.marker)
        if previous is not None:
            pid, arg = previous.get("owner_pid"), previous.get("owner_arg")
            if isinstance(pid, int) and pid != owner_pid and pid_alive(pid, arg if isinstance(arg, str) else None):
                raise FabricError(f"fabric {plan.name} is in use by pid {pid} (another job hashes to the same name)")
        fabric._remove()
        try:
            MARKER_DIR.mkdir(parents=True, exist_ok=True)
            # The marker first: a crash half-way leaves something that ``cleanup_stale`` can find.
            fabric.marker.write_text(
                json.dumps({"plan": plan.to_json(), "owner_pid": owner_pid, "owner_arg": owner_arg}) + "\n"
            )
        except OSError as exc:
            raise FabricError(f"could not write the fabric marker {fabric.marker}: {exc}") from None
        try:
            fabric._build()
        except BaseException:
            fabric.destroy()
            raise
        return fabric

    def _build(self) -> None:
        plan = self.plan
        _run(["ip", "link", "add", plan.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{plan.host_address}/{plan.prefix_len}", "dev", plan.bridge])
        _run(["ip", "link", "set", plan.bridge, "up"])
        for group in plan.groups:
            ns = group.namespace
            _run(["ip", "netns", "add", ns])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            # The peer is born in the namespace: the shared in-namespace name never exists in the root.
            _run(["ip", "link", "add", group.host_veth, "type", "veth", "peer", "name", plan.ifname, "netns", ns])
            _run(["ip", "link", "set", group.host_veth, "master", plan.bridge])
            _run(["ip", "link", "set", group.host_veth, "up"])
            # No IPv6 link-local address: gloo binds the first address of GLOO_SOCKET_IFNAME, the IPv4 one.
            _run(["ip", "-n", ns, "link", "set", plan.ifname, "addrgenmode", "none"])
            _run(["ip", "-n", ns, "addr", "add", f"{group.address}/{plan.prefix_len}", "dev", plan.ifname])
            _run(["ip", "-n", ns, "link", "set", plan.ifname, "up"])
            _run(["ip", "-n", ns, "route", "add", "default", "via", plan.host_address])
            _run(["tc", "-n", ns, "qdisc", "add", "dev", plan.ifname, "root", *tbf_args(plan.gbit)])
            self._write_name_files(ns)

    def _write_name_files(self, namespace: str) -> None:
        """``ip netns exec`` mounts ``/etc/netns/NS/*`` over ``/etc``: give each namespace a hosts file
        naming every address of the fabric and a resolver without servers. c10d looks up the name of
        every peer that connects to its store; asked of a DNS server that the namespace cannot reach,
        each lookup hung ~10 s before failing (EAI_AGAIN), which held every job's start by ~20 s."""
        folder = ETC_NETNS / namespace
        folder.mkdir(parents=True, exist_ok=True)
        lines = ["127.0.0.1 localhost", f"{self.plan.host_address} {self.plan.bridge}"]
        lines += [f"{group.address} {group.namespace}" for group in self.plan.groups]
        (folder / "hosts").write_text("\n".join(lines) + "\n")
        (folder / "resolv.conf").write_text("# no name servers inside a Polychip link-emulation namespace\n")

    def _remove(self) -> None:
        plan = self.plan
        for group in plan.groups:
            shutil.rmtree(ETC_NETNS / group.namespace, ignore_errors=True)
            # Deleting one end of a veth deletes both; the namespace goes once its last process exits.
            if Path("/sys/class/net", group.host_veth).exists():
                _quiet(["ip", "link", "del", group.host_veth])
            if (NETNS_DIR / group.namespace).exists():
                _quiet(["ip", "netns", "del", group.namespace])
        if Path("/sys/class/net", plan.bridge).exists():
            _quiet(["ip", "link", "del", plan.bridge])

    def destroy(self) -> None:
        """Remove the namespaces, veths, bridge and marker. Never raises."""
        try:
            self._remove()
            self.marker.unlink(missing_ok=True)
        except Exception as exc:  # a cleanup that raises would hide why the job ended
            print(f"netem: could not remove fabric {self.plan.name}: {exc!r}", file=sys.stderr)  # noqa: T201 (our log)

    def wrap(self, argv: Sequence[str], group: int) -> list[str]:
        """``argv`` run inside ``group``'s namespace."""
        return ["ip", "netns", "exec", self.plan.namespace(group), *argv]


def tx_bytes(plan: FabricPlan, group: int) -> int:
    """Bytes sent so far by ``group``'s interface (what crossed its shaper)."""
    path = f"/sys/class/net/{plan.ifname}/statistics/tx_bytes"
    try:
        # `ip` from PATH, as everywhere in this module: iproute2 sits in /sbin or /usr/sbin by distribution.
        done = subprocess.run(  # noqa: S603 (a fixed argv, no shell)
            ["ip", "netns", "exec", plan.namespace(group), "cat", path],  # noqa: S607
            capture_output=True,
            text=True,
            timeout=_CMD_TIMEOUT_S,
            check=True,
        )
        return int(done.stdout.strip())
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise FabricError(f"could not read {path} in {plan.namespace(group)}: {exc}") from None


def _read_marker(path: Path) -> dict[str, Any] | None:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) else None


def cleanup_stale() -> list[str]:
    """Remove fabrics of ours whose owner is gone; returns their names.

    Conservative: only a fabric with a marker in ``MARKER_DIR`` whose owner process is dead is
    touched, and only the names its plan lists (all ``pcnet<hash>...``). Namespaces of ours without a
    marker are left alone (the marker is written before anything is created, so these are not ours
    to judge)."""
    removed: list[str] = []
    try:
        markers = sorted(MARKER_DIR.glob(f"{PREFIX}*.json"))
    except OSError:
        return removed
    for path in markers:
        raw = _read_marker(path)
        if raw is None or not _NAME.match(path.stem):
            continue
        pid, arg = raw.get("owner_pid"), raw.get("owner_arg")
        if not isinstance(pid, int) or pid_alive(pid, arg if isinstance(arg, str) else None):
            continue
        try:
            plan = FabricPlan.from_json(raw.get("plan"))
        except ValueError:
            continue
        if plan.name != path.stem:
            continue
        Fabric(plan).destroy()
        removed.append(plan.name)
    return removed


# -- telemetry relay --------------------------------------------------------------------------------


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _setns(fd: int) -> None:
    if _libc().setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


class LoopbackRelay:
    """Listens on 127.0.0.1:``port`` inside ``namespace`` and forwards each connection to
    127.0.0.1:``port`` of the root namespace (where the control plane listens).

    ``setns`` moves only the calling thread, and a socket stays in the namespace it was created in:
    a dedicated thread enters the namespace, creates the listener, and returns before it accepts, so
    every connection it opens afterwards is in the root namespace."""

    def __init__(self, namespace: str, port: int, *, target_port: int | None = None) -> None:
        self.namespace = namespace
        self.port = port
        self.target_port = port if target_port is None else target_port
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: str | None = None
        self._listener: socket.socket | None = None
        self._thread = threading.Thread(target=self._serve, name=f"relay-{namespace}", daemon=True)

    def start(self, timeout_s: float = 10.0) -> LoopbackRelay:
        self._thread.start()
        if not self._ready.wait(timeout_s):
            self._error = self._error or "timed out entering the namespace"
        if self._error is not None:
            self.stop()
            raise FabricError(f"telemetry relay into {self.namespace} on port {self.port}: {self._error}")
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)

    def _listen_in_namespace(self) -> socket.socket:
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            target = os.open(NETNS_DIR / self.namespace, os.O_RDONLY)
            try:
                _setns(target)
            finally:
                os.close(target)
            try:
                listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                try:
                    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    listener.bind(("127.0.0.1", self.port))
                    listener.listen(64)
                except OSError:
                    listener.close()
                    raise
            finally:
                # Back home, or this thread's connections would loop inside the namespace. A thread
                # that cannot return must not serve: the error below stops it.
                _setns(own)
        finally:
            os.close(own)
        return listener

    def _serve(self) -> None:
        try:
            listener = self._listen_in_namespace()
        except OSError as exc:
            self._error = str(exc)
            self._ready.set()
            return
        self._listener = listener
        self._ready.set()
        listener.settimeout(0.2)
        with listener:
            while not self._stop.is_set():
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                except OSError:
                    break
                threading.Thread(target=self._forward, args=(conn,), daemon=True).start()

    def _forward(self, conn: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=10.0)
        except OSError:
            conn.close()  # the rank sees a refused/closed connection, as it would without the relay
            return
        upstream.settimeout(None)
        conn.settimeout(None)
        back = threading.Thread(target=_pump, args=(upstream, conn), daemon=True)
        back.start()
        _pump(conn, upstream)
        back.join()
        conn.close()
        upstream.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)
