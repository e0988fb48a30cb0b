"""The tenant's own code on the local backend: ``python`` jobs through the training API, unmodified
``torchrun`` scripts, and what the operating system lets that code touch.

Real gloo ranks, real bundles (tar.gz unpacked by the backend), no control plane.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from runtime.backends.base import LaunchRequest, Phase, RankPlacement
from runtime.backends.local import LocalBackend
from runtime.backends.local import standby as standby_module
from runtime.backends.local.procs import pid_alive
from runtime.backends.local.sandbox import unavailable_reason
from runtime.jobspec import CheckpointSpec, WorkloadSpec
from runtime.recovery.store import LocalStore
from tests.runtime.conftest import wait_for, wait_until_final, warm_pool
from tests.usercode import DDP_EXAMPLE, MIXED, SDK_EXAMPLE, make_bundle, run_alone, user_request

pytestmark = pytest.mark.runtime

needs_sandbox = pytest.mark.skipif(unavailable_reason() is not None, reason=f"sandbox: {unavailable_reason()}")


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A folder outside pytest's own temporary root: ranks of user code run as their job's user and
    must pass through every folder above their run, and pytest closes its root (0700) whenever a
    session starts."""
    folder = Path(tempfile.mkdtemp(prefix="polychip-usercode-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def step_events(run_dir: Path, rank: int = 0) -> list[dict[str, Any]]:
    for folder in (run_dir / "work", run_dir):
        path = folder / f"telemetry.rank{rank}.jsonl"
        if path.exists():
            return [e for e in map(json.loads, path.read_text().splitlines()) if e["kind"] == "step"]
    return []


def final_loss(lines: list[str]) -> float:
    losses = [float(m.group(1)) for line in lines if (m := re.search(r"loss ([0-9.]+)", line))]
    assert losses, lines
    return losses[-1]


def log_text(backend: LocalBackend, handle: dict[str, Any]) -> list[str]:
    return [line.text for line in backend.logs(handle, limit=100_000).lines]


def test_a_python_job_on_three_uneven_ranks_trains_what_one_process_trains(
    make_backend: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    backend = make_backend(telemetry_files=True)
    bundle = make_bundle(tmp_path / "bundle", {"train.py": SDK_EXAMPLE.read_text()})
    handle = backend.provision(user_request("py-exact", tmp_path, bundle))
    observation = wait_until_final(backend, handle, timeout_s=240)
    assert observation.phase == Phase.SUCCEEDED, observation.reason

    alone, _ = run_alone(SDK_EXAMPLE, tmp_path / "alone")
    gang = torch.load(tmp_path / "artifacts" / "py-exact" / "model.pt", weights_only=True)
    reference = torch.load(alone, weights_only=True)
    assert gang.keys() == reference.keys()
    for name, tensor in reference.items():
        torch.testing.assert_close(gang[name], tensor, rtol=1e-5, atol=1e-6, msg=f"parameter {name}")
    # The split was the balancer's, uneven across the unlike chips, and the scheduler's reports arrived.
    events = step_events(Path(handle["run_dir"]))
    splits = [e["split"] for e in events]
    assert any(len(set(chunk)) > 1 for split in splits for chunk in split), splits[-1]
    assert any("metrics" in e and "lr" in e["metrics"] for e in events)
    assert any(line.startswith("step 120: loss") for line in log_text(backend, handle))


def test_a_python_job_killed_mid_run_resumes_from_its_registered_state(
    make_backend: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    """kill -9 of a rank: the next attempt restores the model, the optimizer, the scheduler and the
    data position, and ends where an uninterrupted run ends."""
    backend = make_backend(telemetry_files=True, sample_time_ms=0.5)
    bundle = make_bundle(tmp_path / "bundle", {"train.py": SDK_EXAMPLE.read_text()})
    spec = CheckpointSpec(weights_every=10, optimizer_every=10, keep=3)
    first = backend.provision(user_request("py-kill-a0", tmp_path, bundle, checkpoint=spec, job_key="py-kill"))
    store = LocalStore(str(tmp_path / "checkpoints" / "py-kill"))
    assert wait_for(lambda: len(store.names()) >= 2, timeout_s=120)
    status = json.loads((Path(first["run_dir"]) / "status.json").read_text())
    victim = next(r["pid"] for r in status["ranks"] if r["rank"] == 1)
    os.kill(victim, signal.SIGKILL)
    observation = wait_until_final(backend, first, timeout_s=60)
    assert observation.phase == Phase.FAILED and observation.failure is not None
    assert observation.failure.rank == 1 and observation.failure.cause == "signal"

    second = backend.provision(
        user_request("py-kill-a1", tmp_path, bundle, checkpoint=spec, job_key="py-kill", flavors=MIXED[:2])
    )
    observation = wait_until_final(backend, second, timeout_s=240)
    assert observation.phase == Phase.SUCCEEDED, observation.reason
    lines = log_text(backend, second)
    resumed = [line for line in lines if line.startswith("resumed at step")]
    assert resumed, lines[:20]
    restored_step = int(resumed[0].split()[3]) - 1
    assert restored_step >= 10 and f"(data position {restored_step})" in resumed[0]

    _, alone = run_alone(SDK_EXAMPLE, tmp_path / "alone")
    assert final_loss(lines) == pytest.approx(final_loss(alone), rel=0.01)


def test_an_unmodified_torchrun_script_runs_on_two_ranks(
    make_backend: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    backend = make_backend()
    bundle = make_bundle(tmp_path / "bundle", {"train.py": DDP_EXAMPLE.read_text()})
    request = user_request(
        "ddp", tmp_path, bundle, kind="torchrun", flavors=("h100-sxm", "a100-sxm"), args=("--steps", "40")
    )
    handle = backend.provision(request)
    observation = wait_until_final(backend, handle, timeout_s=180)
    assert observation.phase == Phase.SUCCEEDED, observation.reason
    lines = log_text(backend, handle)
    assert "done" in lines and any(line.startswith("step 40: loss") for line in lines)
    # Its own checkpoint went to the job's store folder ($POLYCHIP_CHECKPOINT_DIR).
    assert (tmp_path / "checkpoints" / "ddp" / "ddp-example.pt").exists()


def test_a_python_entrypoint_that_never_uses_the_training_api_fails_and_says_why(
    make_backend: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    backend = make_backend()
    bundle = make_bundle(tmp_path / "bundle", {"job/main.py": "def run():\n    print('hello')\n"})
    request = user_request("no-sdk", tmp_path, bundle, entrypoint="job.main:run", flavors=("h100-sxm",))
    observation = wait_until_final(backend, backend.provision(request), timeout_s=120)
    assert observation.phase == Phase.FAILED
    assert "without calling runtime.sdk.init()" in observation.reason


def test_a_container_job_is_refused_by_the_local_backend_naming_kubernetes(
    make_backend: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    backend = make_backend()
    request = LaunchRequest(
        job_id="image",
        placements=(RankPlacement(rank=0, device_id="dev/0", flavor="h100-sxm", node="node"),),
        workload=WorkloadSpec(kind="container", model="", image="ghcr.io/acme/train:1"),
        telemetry_url=None,
        telemetry_token="",
        artifacts_dir=str(tmp_path / "artifacts"),
    )
    with pytest.raises(ValueError, match="Kubernetes backend"):
        backend.provision(request)


PROBE = """
import json, os
from pathlib import Path

def attempt(path):
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            Path(path).read_bytes()
        return "read"
    except PermissionError:
        return "refused"
    except OSError as exc:
        return f"error {exc.errno}"

def link(fd):
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None  # listdir's own descriptor, closed since

def main():
    targets = json.loads(Path("targets.json").read_text())  # beside the script: the job sets no variable
    found = {name: attempt(path) for name, path in targets.items()}
    found["env"] = sorted(os.environ)
    found["uid"] = os.getuid()
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    found["privileges"] = {k: status[k].strip() for k in ("NoNewPrivs", "CapEff", "CapPrm", "Groups")}
    found["open_files"] = sorted(filter(None, map(link, os.listdir("/proc/self/fd"))))
    Path(os.environ["POLYCHIP_ARTIFACTS_DIR"], "probe.json").write_text(json.dumps(found))
    import torch
    from runtime import sdk
    with sdk.init() as ctx:
        model = torch.nn.Linear(2, 1)
        ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        for _ in ctx.steps():
            for lo, hi in ctx.slices():
                ctx.backward(model(torch.ones(hi - lo, 2)).sum())
            ctx.step()

main()
"""


@needs_sandbox
@pytest.mark.parametrize("standby_ranks", [0, 2], ids=["fresh ranks", "warm standbys"])
def test_user_code_cannot_read_the_control_planes_secrets_or_other_jobs_runs(
    make_backend: Callable[..., LocalBackend], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, standby_ranks: int
) -> None:
    """A python job on the local backend, run by root: the operating system refuses its reads of the
    database file, the secret key, the var folder's listing and another job's run; its environment
    holds none of the control plane's settings. Alike whether its ranks start fresh (setpriv) or in
    warm standbys that root forked (each becomes the job's user before the rank starts): no
    capability, no supplementary group, no way to gain privileges, no file of the pool left open."""
    var = tmp_path / "var"
    var.mkdir(mode=0o711)
    os.chmod(var, 0o711)  # noqa: S103 (what controlplane.settings.keep_var_private leaves)
    for name in ("polychip.sqlite3", "secret-key"):
        (var / name).write_text("secret")
        os.chmod(var / name, 0o600)
    other = var / "runs" / "other-job" / "work"
    other.mkdir(parents=True)
    (other / "train.py").write_text("theirs")
    os.chmod(other, 0o700)
    monkeypatch.setenv("DATABASE_URL", "postgres://admin:pw@db/polychip")
    monkeypatch.setenv("DJANGO_SECRET_KEY", "not-for-tenants")
    targets = {
        "database": str(var / "polychip.sqlite3"),
        "secret_key": str(var / "secret-key"),
        "var_listing": str(var),
        "other_run_code": str(other / "train.py"),
        "other_run_folder": str(other),
    }
    backend = LocalBackend(
        var / "runs", make_backend().profiles, sample_time_ms=0.1, sandbox="required", standby_ranks=standby_ranks
    )
    if standby_ranks:  # warm before the launch, as for a restart
        warm_pool(backend, standby_ranks)
    # The targets travel in the bundle: a variable of the job's own would start its ranks fresh (a
    # standby's interpreter started without it).
    bundle = make_bundle(tmp_path / "bundle", {"probe.py": PROBE, "targets.json": json.dumps(targets)})
    request = user_request(
        "probe", tmp_path, bundle, entrypoint="probe.py", flavors=("h100-sxm",), steps=2, global_batch=4
    )
    request = LaunchRequest(**{**request.__dict__, "artifacts_dir": str(var / "artifacts" / "probe")})
    handle = backend.provision(request)
    try:
        observation = wait_until_final(backend, handle, timeout_s=120)
        assert observation.phase == Phase.SUCCEEDED, observation.reason
        status = json.loads((Path(handle["run_dir"]) / "status.json").read_text())
    finally:
        backend.teardown(handle)
        backend.stop_standby()
    assert all(("standby" in r) == bool(standby_ranks) for r in status["ranks"]), status
    found = json.loads((var / "artifacts" / "probe" / "probe.json").read_text())
    assert found["uid"] != 0
    assert found["privileges"] == {"NoNewPrivs": "1", "CapEff": "0" * 16, "CapPrm": "0" * 16, "Groups": ""}
    # Its stdin, stdout and stderr only (here: /dev/null and two pipes): no socket (the pool's listener
    # would let it claim other jobs' standbys) and no file of the pool's.
    pools = [f for f in found["open_files"] if f.startswith("socket:") or str(backend.standby_dir) in f]
    assert not pools, found["open_files"]
    for name in targets:
        assert found[name] == "refused", (name, found[name])
    assert "DATABASE_URL" not in found["env"] and "DJANGO_SECRET_KEY" not in found["env"]
    assert {"POLYCHIP_JOB_ID", "HOME"} <= set(found["env"])


DEAF = """
import os, signal, time
from pathlib import Path
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # deaf to the polite request
Path(os.environ["POLYCHIP_ARTIFACTS_DIR"], "started").write_text(str(os.getpid()))
while True:
    time.sleep(1)
"""


@needs_sandbox
def test_a_warm_rank_of_user_code_that_ignores_sigterm_is_killed_once_its_supervisor_is_gone(
    make_backend: Callable[..., LocalBackend], tmp_path: Path
) -> None:
    """The pool passes a dead supervisor's SIGTERM on to its claimed rank, as a fresh rank gets it from
    the parent-death signal; the tenant's code may ignore it, so the pool kills it after a grace."""
    backend = LocalBackend(tmp_path / "runs", make_backend().profiles, sample_time_ms=0.1, standby_ranks=2)
    warm_pool(backend, 2)
    bundle = make_bundle(tmp_path / "bundle", {"deaf.py": DEAF})
    request = user_request("deaf", tmp_path, bundle, entrypoint="deaf.py", flavors=("h100-sxm",))
    handle = backend.provision(request)
    try:
        started = Path(request.artifacts_dir) / "started"
        assert wait_for(started.exists, timeout_s=60)
        # A warm rank runs the tenant's code as soon as it is claimed: on a busy host it may write its
        # marker before the supervisor first writes the status that names it.
        status_path = Path(handle["run_dir"]) / "status.json"
        assert wait_for(status_path.exists, timeout_s=30)
        status = json.loads(status_path.read_text())
        [rank] = status["ranks"]
        assert rank.get("standby"), status
        os.kill(status["supervisor_pid"], signal.SIGKILL)

        assert wait_for(lambda: not pid_alive(rank["pid"]), timeout_s=standby_module.ORPHAN_GRACE_S + 20)
    finally:
        backend.teardown(handle)
        backend.stop_standby()
