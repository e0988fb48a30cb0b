"""Real link shaping for the local backend: network namespaces, veth and tc (root only).

The tests that build fabrics skip, with the reason, where this host cannot (not Linux, not root,
no ``ip``/``tc``); the plan and the fallback to the token bucket are checked everywhere.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from runtime.backends.base import LaunchRequest, Phase, RankPlacement
from runtime.backends.local import LocalBackend, netem
from runtime.jobspec import CommSpec, WorkloadSpec
from tests.runtime.conftest import processes_mentioning, wait_for, wait_until_final

pytestmark = pytest.mark.runtime

REASON = netem.unavailable_reason()
needs_netns = pytest.mark.skipif(REASON is not None, reason=f"no real link shaping here: {REASON}")

# Receiver: prints "ready", then, after the sender closes, the rate in Gbit/s between the first and
# the last byte. Sender: sends for SECONDS.
_TPUT = r"""
import socket, sys, time
mode, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "recv":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port)); s.listen(1); print("ready", flush=True)
    c, _ = s.accept(); n = 0; t0 = None
    while data := c.recv(1 << 20):
        if t0 is None: t0, first = time.monotonic(), len(data)
        n += len(data)
    print((n - first) * 8 / (time.monotonic() - t0) / 1e9, n, flush=True)
else:
    c = socket.create_connection((addr, port)); buf = b"x" * (1 << 20); end = time.monotonic() + float(sys.argv[4])
    while time.monotonic() < end: c.sendall(buf)
    c.close()
"""


def fabric_argv(plan: netem.FabricPlan, group: int) -> list[str]:
    return netem.Fabric(plan).wrap([sys.executable, "-c", _TPUT], group)


def _transfer(plan: netem.FabricPlan, src: int, dst: int, seconds: float = 1.5, port: int = 5301) -> tuple[float, int]:
    """Gbit/s and bytes of one TCP stream from a process in ``src``'s namespace to ``dst``'s address."""
    recv = subprocess.Popen(
        [*fabric_argv(plan, dst), "recv", plan.address(dst), str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert recv.stdout is not None and recv.stdout.readline().strip() == "ready"
        subprocess.run(
            [*fabric_argv(plan, src), "send", plan.address(dst), str(port), str(seconds)],
            check=True,
            timeout=30,
        )
        rate, sent = recv.stdout.readline().split()
        return float(rate), int(sent)
    finally:
        recv.kill()
        recv.wait()


def _leftovers(plan: netem.FabricPlan) -> list[str]:
    """Namespaces and interfaces of ``plan`` that still exist."""
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    found = [line.split()[0] for line in namespaces.splitlines() if line.startswith(plan.name)]
    found += [line.split(":")[1].strip().split("@")[0] for line in links.splitlines() if plan.name in line]
    return found


@pytest.fixture
def fabrics() -> Iterator[Callable[..., netem.Fabric]]:
    """Create fabrics that are destroyed at the end, pass or fail."""
    made: list[netem.Fabric] = []

    def create(job_id: str, groups: int, gbit: float, **kwargs: Any) -> netem.Fabric:
        plan = netem.FabricPlan.for_job(job_id, groups, gbit, key=f"test-netem:{job_id}", in_use=netem.subnets_in_use())
        fabric = netem.Fabric.create(plan, **kwargs)
        made.append(fabric)
        return fabric

    yield create
    for fabric in made:
        fabric.destroy()


# -- everywhere --------------------------------------------------------------------------------------


def test_a_plan_round_trips_json_with_short_names_in_a_free_subnet() -> None:
    plan = netem.FabricPlan.for_job("a-rather-long-job-id-" + "x" * 100, 3, 0.5)
    again = netem.FabricPlan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again == plan
    names = [plan.bridge, *(g.host_veth for g in plan.groups), plan.ifname]
    assert all(len(n) <= 15 for n in names), names
    assert plan.name.startswith(netem.PREFIX) and all(n.startswith(plan.name) for n in names[:-1])
    assert len({g.namespace for g in plan.groups}) == 3
    assert plan.subnet.startswith("10.") and plan.subnet.endswith(".0/24")
    assert plan.host_address == plan.subnet.replace(".0/24", ".1")
    assert [plan.address(g).rsplit(".", 1)[0] for g in range(3)] == [plan.subnet.rsplit(".", 1)[0]] * 3
    assert len({plan.address(g) for g in range(3)} | {plan.host_address}) == 4
    # Deterministic, keyed, and clear of networks in use.
    assert netem.FabricPlan.for_job(plan.job_id, 3, 0.5) == plan
    assert netem.FabricPlan.for_job(plan.job_id, 3, 0.5, key="elsewhere").name != plan.name
    moved = netem.FabricPlan.for_job(plan.job_id, 3, 0.5, in_use=[plan.subnet, "192.168.0.0/16"])
    assert moved.name == plan.name and moved.subnet != plan.subnet
    # A plan from a file never names interfaces that are not ours.
    with pytest.raises(ValueError, match=r"fabric\.name"):
        netem.FabricPlan.from_json({**plan.to_json(), "bridge": "eth0"})
    with pytest.raises(ValueError, match="fabric: not a fabric plan"):
        netem.FabricPlan.from_json({"name": plan.name})


def _mixed_request(tmp_path: Path, job_id: str, vendors: list[str], **workload: Any) -> LaunchRequest:
    return LaunchRequest(
        job_id=job_id,
        placements=tuple(
            RankPlacement(rank, f"node-{vendor}/{rank}", "h100-sxm", f"node-{vendor}", vendor=vendor)
            for rank, vendor in enumerate(vendors)
        ),
        workload=WorkloadSpec(**workload),
        telemetry_url=None,
        telemetry_token="",
        artifacts_dir=str(tmp_path / "artifacts" / job_id),
    )


def test_auto_falls_back_to_the_token_bucket_and_says_why(
    make_backend: Callable[..., LocalBackend], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(netem, "unavailable_reason", lambda: "tc not on PATH (install iproute2)")
    backend = make_backend(link_gbit=1.0)
    assert backend.link_for([0, 0, 1]).to_json() == {"mode": "token_bucket", "gbit": 1.0}
    assert backend.link_for([0, 0]).mode == "none"  # one group: no cross-group link to slow
    with pytest.raises(ValueError, match=r"link_shaping: netns is unavailable on this host \(tc not on PATH"):
        make_backend(link_gbit=1.0, link_shaping="netns").link_for([0, 1])

    run_dir = tmp_path / "written"
    run_dir.mkdir()
    request = _mixed_request(tmp_path, "fallback-1", ["a", "a", "b"], steps=2, global_batch=6)
    backend._write_launch(request, run_dir, {0: 1.0, 1: 1.0, 2: 1.0})
    launch = json.loads((run_dir / "launch.json").read_text())
    assert launch["link"] == {"mode": "token_bucket", "gbit": 1.0}
    assert launch["link_note"] == "token_bucket: netns is unavailable (tc not on PATH (install iproute2))"
    assert "fabric" not in launch
    assert json.loads((run_dir / "rank2.json").read_text())["master_addr"] == "127.0.0.1"


def test_token_bucket_when_asked_without_probing(
    make_backend: Callable[..., LocalBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    def probe() -> str | None:
        raise AssertionError("token_bucket must not probe for namespaces")

    monkeypatch.setattr(netem, "unavailable_reason", probe)
    assert make_backend(link_gbit=2.0, link_shaping="token_bucket").link_for([0, 1]).mode == "token_bucket"
    assert make_backend().link_for([0, 1]).mode == "none"


# -- where the machine allows it -------------------------------------------------------------------


@needs_netns
def test_the_shaped_link_carries_its_rate_and_a_group_talks_to_itself_fast(
    fabrics: Callable[..., netem.Fabric],
) -> None:
    fabric = fabrics("shape", 2, 0.5)
    plan = fabric.plan
    before = netem.tx_bytes(plan, 0)
    cross, sent = _transfer(plan, 0, 1)
    intra, _ = _transfer(plan, 0, 0)
    print(f"\ntc {' '.join(netem.tbf_args(0.5))}: cross-group {cross:.3f} Gbit/s, inside a group {intra:.2f} Gbit/s")
    assert 0.375 <= cross <= 0.625, cross
    assert intra >= 3 * cross, (intra, cross)
    # What left group 0 through its veth: the cross-group stream (and its headers), not the local one.
    crossed = netem.tx_bytes(plan, 0) - before
    assert sent <= crossed < 1.2 * sent, (sent, crossed)

    fabric.destroy()
    assert _leftovers(plan) == []
    assert not fabric.marker.exists()
    fabric.destroy()  # twice is fine


@needs_netns
def test_cleanup_removes_fabrics_whose_owner_is_gone_and_nothing_else(
    fabrics: Callable[..., netem.Fabric],
) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    orphan = fabrics("orphan", 1, 1.0, owner_pid=gone.pid)
    owned = fabrics("owned", 1, 1.0)  # owned by this test process, which lives
    assert _leftovers(orphan.plan) != []

    removed = netem.cleanup_stale()
    assert orphan.plan.name in removed and owned.plan.name not in removed
    assert _leftovers(orphan.plan) == [] and not orphan.marker.exists()
    assert _leftovers(owned.plan) != [] and owned.marker.exists()
    # A live owner's fabric is not taken over by a job that hashes to the same name.
    with pytest.raises(netem.FabricError, match=f"fabric {owned.plan.name} is in use by pid"):
        netem.Fabric.create(owned.plan, owner_pid=gone.pid)


@needs_netns
def test_the_relay_carries_http_from_a_namespace_to_the_root_loopback(fabrics: Callable[..., netem.Fabric]) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"from the root namespace"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    fabric = fabrics("relay", 1, 1.0)
    relay = netem.LoopbackRelay(fabric.plan.namespace(0), port).start()
    try:
        fetch = f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}/', timeout=5).read())"
        out = subprocess.run(
            fabric.wrap([sys.executable, "-c", fetch], 0), capture_output=True, text=True, timeout=30, check=True
        )
        assert out.stdout.strip() == "b'from the root namespace'"
    finally:
        relay.stop()
        server.shutdown()
        server.server_close()


class _Ingest:
    """An HTTP server on the root namespace's 127.0.0.1 that keeps every telemetry event posted."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        ingest = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                ingest.events.extend(json.loads(body)["events"])
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/ingest"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@needs_netns
def test_a_three_rank_two_vendor_job_runs_over_the_shaped_link(
    make_backend: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    ingest = _Ingest()
    try:
        backend = make_backend(link_gbit=1.0, link_shaping="netns", telemetry_files=True)
        request = LaunchRequest(
            job_id="netem-1",
            placements=tuple(
                RankPlacement(rank, f"node-{v}/{rank}", "h100-sxm", f"node-{v}", vendor=v)
                for rank, v in enumerate(["a", "a", "b"])
            ),
            workload=WorkloadSpec(steps=5, global_batch=24, hidden=64),
            telemetry_url=ingest.url,
            telemetry_token="t",
            artifacts_dir=str(tmp_path / "artifacts" / "netem-1"),
            comm=CommSpec(compression="auto"),
        )
        handle = backend.provision(request)
        run_dir = Path(handle["run_dir"])
        launch = json.loads((run_dir / "launch.json").read_text())
        plan = netem.FabricPlan.from_json(launch["fabric"])
        assert launch["link"] == {"mode": "netns", "gbit": 1.0}
        assert launch["link_note"].startswith("netns: tc tbf rate 1000mbit")
        assert launch["vendor_groups"] == [0, 0, 1] and len(plan.groups) == 2
        configs = [json.loads((run_dir / f"rank{r}.json").read_text()) for r in range(3)]
        assert {c["master_addr"] for c in configs} == {plan.address(0)}

        observation = wait_until_final(backend, handle, timeout_s=120)
        assert observation.phase == Phase.SUCCEEDED, observation.reason
        assert [(r.rank, r.exit_code) for r in observation.ranks] == [(0, 0), (1, 0), (2, 0)]
        # The fabric is gone with the job, before its final status.
        assert _leftovers(plan) == []
        assert not (netem.MARKER_DIR / f"{plan.name}.json").exists()

        for rank in range(3):
            events = [json.loads(line) for line in (run_dir / f"telemetry.rank{rank}.jsonl").read_text().splitlines()]
            assert [e["step"] for e in events if e["kind"] == "step"] == [1, 2, 3, 4, 5]
        # The same events reached the root namespace's 127.0.0.1 through the relay.
        assert wait_for(lambda: {e["rank"] for e in ingest.events if e["kind"] == "finished"} == {0, 1, 2}, 10)
        comm = [e for e in ingest.events if e["kind"] == "comm"]
        assert comm and all(e["link"] == {"mode": "netns", "gbit": 1.0} for e in comm)
        measured = comm[0]["link_gbit_measured"]
        print(f"\nthe ranks measured the shaped 1 Gbit/s link at {measured:.2f} Gbit/s")
        # The leaders time a 1 MiB ring all-reduce; what can cross a 1 Gbit/s shaper with a 250 KB bucket
        # in that time is at most 1.33 Gbit/s (less on a busy host: the probe counts gloo's own time too).
        assert 0 < measured < 1.4, measured
        # The supervisor writes the final status, then exits.
        assert wait_for(lambda: processes_mentioning(str(run_dir)) == [], 10)
    finally:
        ingest.close()


@needs_netns
def test_a_torn_down_netns_job_leaves_no_fabric(make_backend: Callable[..., LocalBackend], tmp_path: Path) -> None:
    backend = make_backend(link_gbit=1.0, link_shaping="netns")
    request = _mixed_request(tmp_path, "netem-long", ["a", "b"], steps=100_000, global_batch=8)
    handle = backend.provision(request)
    run_dir = Path(handle["run_dir"])
    plan = netem.FabricPlan.from_json(json.loads((run_dir / "launch.json").read_text())["fabric"])
    assert wait_for(lambda: len([r for r in backend.observe(handle).ranks if r.pid]) == 2, timeout_s=30)
    assert _leftovers(plan) != []

    backend.teardown(handle)
    assert backend.observe(handle).phase == Phase.FAILED
    assert processes_mentioning(str(run_dir)) == []
    assert _leftovers(plan) == []


@needs_netns
def test_a_fabric_that_cannot_be_built_fails_the_job_before_any_rank_starts(
    make_backend: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    backend = make_backend(link_gbit=1.0, link_shaping="netns")
    run_dir = backend.runs_dir / "netem-clash"
    # Someone alive (this test) holds a fabric of the very name the job's plan will use.
    clash = netem.FabricPlan.for_job("netem-clash", 2, 1.0, key=str(run_dir), in_use=netem.subnets_in_use())
    held = netem.Fabric.create(clash)
    try:
        handle = backend.provision(_mixed_request(tmp_path, "netem-clash", ["a", "b"], steps=5, global_batch=8))
        observation = wait_until_final(backend, handle, timeout_s=60)
        assert observation.phase == Phase.FAILED
        assert observation.reason.startswith("could not set up the emulated link (link_shaping netns): fabric ")
        assert "is in use by pid" in observation.reason
        assert all(r.pid is None for r in observation.ranks)
        assert _leftovers(clash) != []  # the holder's fabric is untouched
    finally:
        held.destroy()
