"""The Kubernetes backend against the emulated apiserver (``tests.kubecluster.emulator``, kmock over
real HTTP) and the test node agent that runs each pod's command as a local process
(``tests.kubecluster.agent``): real ranks training over gloo, made, watched and removed only through the
Kubernetes API. Nothing here has met a real apiserver or kubelet; what the emulator and the agent stand
in for is listed in their modules."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runtime.backends.base import NODE_LOST, LaunchRequest, Observation, Phase, RankPlacement
from runtime.backends.kubernetes.api import Api, ApiError, connect
from runtime.backends.kubernetes.backend import KubernetesBackend
from runtime.backends.kubernetes.manifests import ClusterConfig
from runtime.jobspec import CheckpointSpec, WorkloadSpec
from runtime.recovery.store import LocalStore
from runtime.worker.cli import EXIT_BAD_CONFIG
from tests.kubecluster.agent import NodeAgent
from tests.kubecluster.emulator import RunningCluster
from tests.kubecluster.sink import TelemetrySink
from tests.runtime.conftest import wait_for

pytestmark = pytest.mark.runtime

IMAGE = "registry.example/polychip-worker:test"
RESOURCES = {"h100-sxm": "nvidia.com/gpu", "mi300x": "amd.com/gpu"}
NODES = {"gpu-a": "nvidia.com/gpu", "gpu-b": "amd.com/gpu"}
FINAL = (Phase.SUCCEEDED, Phase.FAILED, Phase.STOPPED, Phase.GONE)


@dataclass
class Kube:
    cluster: RunningCluster
    agent: NodeAgent
    backend: KubernetesBackend
    root: Path
    sink: TelemetrySink

    def run(self, request: LaunchRequest, timeout_s: float = 90) -> tuple[dict[str, Any], list[Observation]]:
        """Provision and observe until final; every observation whose phase differs from the one before."""
        handle = self.backend.provision(request)
        return handle, self.follow(handle, timeout_s)

    def follow(self, handle: dict[str, Any], timeout_s: float) -> list[Observation]:
        seen: list[Observation] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            observation = self.backend.observe(handle)
            if not seen or observation.phase != seen[-1].phase:
                seen.append(observation)
            if observation.phase in FINAL:
                break
            time.sleep(0.1)
        return seen


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[Kube]:
    with RunningCluster(tmp_path / "apiserver", bookmark_s=0.5) as cluster, TelemetrySink() as sink:
        for node, resource in NODES.items():
            cluster.add_node(node, labels={"polychip.io/flavor": node}, resources={resource: 4})
        agent_api = Api(connect(str(cluster.admin_kubeconfig)))
        with NodeAgent(
            agent_api, tmp_path / "nodes", images=frozenset({IMAGE}), logs_dir=cluster.cluster.logs_dir
        ) as agent:
            config = ClusterConfig(worker_image=IMAGE, resources=RESOURCES)
            backend = KubernetesBackend(
                Api(connect(str(cluster.kubeconfig))), config, tmp_path / "runs", watch_timeout_s=5, force_after_s=3
            )
            backend.sync_tenant("acme", {"h100-sxm": 8, "mi300x": 8})
            try:
                yield Kube(cluster, agent, backend, tmp_path, sink)
            finally:
                backend.close()
            assert agent.errors == []
            assert cluster.cluster.denied == []  # RBAC (deploy's rbac.yaml) allowed all the backend did


def _request(
    kube: Kube, run: str, *, steps: int = 30, checkpoint: CheckpointSpec | None = None, **workload: Any
) -> LaunchRequest:
    return LaunchRequest(
        job_id=run,
        placements=(
            RankPlacement(rank=0, device_id="gpu-a/0", flavor="h100-sxm", node="gpu-a", vendor="nvidia"),
            RankPlacement(rank=1, device_id="gpu-b/0", flavor="mi300x", node="gpu-b", vendor="amd"),
        ),
        workload=WorkloadSpec(**{"steps": steps, "global_batch": 32, "seed": 5, **workload}),
        telemetry_url=f"{kube.sink.url}/api/v1/ingest/jobs/1/telemetry",
        telemetry_token="secret-token",
        artifacts_dir=str(kube.root / "artifacts" / run),
        checkpoint=checkpoint,
        checkpoint_url=str(kube.root / "checkpoints" / run) if checkpoint else None,
        tenant="acme",
    )


def _phases(seen: list[Observation]) -> list[Phase]:
    return [o.phase for o in seen]


def test_a_job_mixing_two_flavors_trains_to_succeeded_and_leaves_nothing_behind(kube: Kube) -> None:
    request = _request(kube, "mixed-1")
    handle, seen = kube.run(request)

    assert _phases(seen)[-1] == Phase.SUCCEEDED, seen[-1].reason
    assert _phases(seen) in ([Phase.PENDING, Phase.RUNNING, Phase.SUCCEEDED], [Phase.RUNNING, Phase.SUCCEEDED])
    assert kube.backend.provision(request) == handle  # idempotent: nothing made twice
    pods = {p["metadata"]["name"]: p for p in kube.cluster.cluster.objects("pods", "polychip-t-acme")}
    assert sorted(pods) == ["mixed-1-r0", "mixed-1-r1", "mixed-1-store"]
    assert pods["mixed-1-r1"]["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpu"] == "1"
    finished = [line.text for line in kube.backend.logs(handle).lines if "finished 30 steps" in line.text]
    assert len(finished) == 2
    # Each rank reported its steps with the token it read from the run's Secret.
    assert kube.sink.steps("mixed-1", 1)[-1] == 30 and kube.sink.tokens == {"Bearer secret-token"}

    kube.backend.teardown(handle)

    assert kube.cluster.objects_of_run("mixed-1") == []
    assert kube.agent.running == {}
    # The output outlives the pods: kept beside the artifacts at teardown.
    assert sorted(line.rank for line in kube.backend.logs(handle).lines if "finished 30 steps" in line.text) == [0, 1]
    # Observed as it ended, as on the local backend: an observer racing the teardown sees the same news.
    assert kube.backend.observe(handle).phase == Phase.SUCCEEDED


def test_logs_page_on_per_rank_and_follow_from_a_cursor(kube: Kube) -> None:
    handle, seen = kube.run(_request(kube, "logs-1", steps=10))
    assert seen[-1].phase == Phase.SUCCEEDED
    everything = kube.backend.logs(handle)
    first = kube.backend.logs(handle, limit=1)
    rest = kube.backend.logs(handle, since=first.cursor, limit=10_000)

    assert first.more and len(first.lines) == 1
    assert [(line.rank, line.number) for line in first.lines + rest.lines] == [
        (line.rank, line.number) for line in everything.lines
    ]
    assert [line.rank for line in kube.backend.logs(handle, rank=1).lines] == [1] * len(
        [line for line in everything.lines if line.rank == 1]
    )
    assert kube.backend.logs(handle, tail=1).lines == everything.lines[-1:]
    assert kube.backend.logs(handle, tail=50).lines == everything.lines
    with pytest.raises(ValueError, match="cursor"):
        kube.backend.logs(handle, since="garbage")
    kube.backend.teardown(handle)


def test_a_watch_expired_with_410_is_listed_again_and_no_transition_is_lost_or_doubled(kube: Kube) -> None:
    handle = kube.backend.provision(_request(kube, "relist-1", steps=400))
    watch = kube.backend.watch_for("polychip-t-acme")
    assert wait_for(lambda: kube.backend.observe(handle).phase == Phase.RUNNING, timeout_s=30)
    assert wait_for(lambda: watch.synced.is_set(), timeout_s=10)

    kube.cluster.cluster.compact()  # every version so far is gone; open watches end
    seen = kube.follow(handle, timeout_s=120)

    assert watch.relists >= 1 and kube.cluster.cluster.gone_answers >= 1
    assert _phases(seen) == [Phase.RUNNING, Phase.SUCCEEDED], [o.reason for o in seen]
    # The cache converged on the store: every pod at its stored version.
    assert wait_for(
        lambda: (
            {p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in watch.pods_of("relist-1") or []}
            == {
                p["metadata"]["name"]: p["metadata"]["resourceVersion"]
                for p in kube.cluster.cluster.objects("pods", "polychip-t-acme")
            }
        ),
        timeout_s=10,
    )
    kube.backend.teardown(handle)
    assert kube.cluster.objects_of_run("relist-1") == []


def test_a_rank_killed_fails_the_run_with_that_rank_and_its_exit_code(kube: Kube) -> None:
    handle = kube.backend.provision(_request(kube, "kill-1", steps=100_000))
    assert wait_for(lambda: kube.agent.pid_of("polychip-t-acme", "kill-1-r1") is not None, timeout_s=30)
    assert wait_for(lambda: len(kube.sink.steps("kill-1", 0)) > 3, timeout_s=60)

    pid = kube.agent.pid_of("polychip-t-acme", "kill-1-r1")
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    seen = kube.follow(handle, timeout_s=90)

    failure = seen[-1].failure
    assert seen[-1].phase == Phase.FAILED
    assert failure is not None and (failure.rank, failure.cause, failure.exit_code) == (1, "exit", 137)
    kube.backend.teardown(handle)
    assert kube.cluster.objects_of_run("kill-1") == [] and kube.agent.running == {}
    kept = kube.backend.observe(handle)
    assert (kept.phase, kept.failure) == (Phase.FAILED, failure)


def test_a_node_that_fails_is_told_apart_from_the_program(kube: Kube) -> None:
    handle = kube.backend.provision(_request(kube, "node-1", steps=100_000))
    assert wait_for(lambda: kube.backend.observe(handle).phase == Phase.RUNNING, timeout_s=30)

    assert kube.agent.fail_node("gpu-b") == ["node-1-r1"]
    assert wait_for(lambda: kube.backend.observe(handle).failure is not None, timeout_s=30)

    failure = kube.backend.observe(handle).failure
    assert failure is not None and (failure.rank, failure.cause) == (1, NODE_LOST)
    assert failure.device_suspect  # evidence against the device, not the program's fault
    kube.backend.teardown(handle)
    assert kube.cluster.objects_of_run("node-1") == []


def test_a_stop_request_reaches_every_rank_through_the_config_map(kube: Kube) -> None:
    spec = CheckpointSpec(weights_every=1000, optimizer_every=1000)
    request = _request(kube, "stop-1", steps=100_000, checkpoint=spec)
    handle = kube.backend.provision(request)
    assert wait_for(lambda: len(kube.sink.steps("stop-1", 1)) > 3, timeout_s=60)

    kube.backend.request_stop(handle, "node drained by a test")
    seen = kube.follow(handle, timeout_s=60)

    assert seen[-1].phase == Phase.STOPPED, seen[-1].reason
    assert [r.exit_code for r in seen[-1].ranks] == [4, 4]
    assert len(LocalStore(Path(str(request.checkpoint_url))).names()) == 1
    kube.backend.teardown(handle)
    kube.backend.request_stop(handle, "again, after teardown")  # nothing to stop: no error


def test_an_image_name_that_cannot_be_one_fails_the_run_at_once(kube: Kube) -> None:
    request = _request(kube, "image-1", kind="container", image="Not An Image", command=("train",))
    handle, seen = kube.run(request, timeout_s=30)

    assert seen[-1].phase == Phase.FAILED
    assert "InvalidImageName" in seen[-1].reason
    assert seen[-1].failure is not None and seen[-1].failure.exit_code == EXIT_BAD_CONFIG
    kube.backend.teardown(handle)


def test_tenant_sync_is_idempotent_and_puts_back_what_was_changed(kube: Kube) -> None:
    api = kube.backend.api
    api.patch(
        "ResourceQuota", "polychip-t-acme", "polychip-devices", {"spec": {"hard": {"requests.nvidia.com/gpu": "999"}}}
    )

    assert kube.backend.sync_tenant("acme", {"h100-sxm": 4, "mi300x": 8, "tpu-v4": 2}) == "polychip-t-acme"

    quota = api.get("ResourceQuota", "polychip-t-acme", "polychip-devices")
    assert quota is not None
    assert quota["spec"]["hard"] == {"requests.nvidia.com/gpu": "4", "requests.amd.com/gpu": "8"}
    kinds = sorted(o["kind"] for o in kube.cluster.cluster.objects(namespace="polychip-t-acme"))
    assert kinds == ["LimitRange", "NetworkPolicy", "ResourceQuota", "RoleBinding", "ServiceAccount"]


def test_provision_names_what_is_wrong(kube: Kube) -> None:
    with pytest.raises(ValueError, match="DNS label"):
        kube.backend.provision(_request(kube, "Upper_Case"))
    request = _request(kube, "nowhere-1")
    # A tenant whose namespace was never synced: the control plane holds no right there at all.
    with pytest.raises(ApiError, match='cannot create resource "configmaps"') as caught:
        kube.backend.provision(LaunchRequest(**{**request.__dict__, "tenant": "nobody"}))
    assert caught.value.status == 403
    assert kube.cluster.objects_of_run("nowhere-1") == []
    kube.cluster.cluster.denied.clear()


def test_the_control_plane_holds_rights_in_tenants_namespaces_only(kube: Kube) -> None:
    """Authorized as deploy/kubernetes/base/rbac.yaml binds it: everything the backend did in the other
    tests passed (the fixture checks that nothing was denied); outside tenants' namespaces, nothing."""
    api = kube.backend.api
    for kind, namespace in (("Pod", "kube-system"), ("Secret", "polychip"), ("ConfigMap", "default")):
        with pytest.raises(ApiError) as caught:
            api.list(kind, namespace)
        assert caught.value.status == 403, kind
    with pytest.raises(ApiError, match="forbidden"):
        api.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x", "namespace": "kube-system"}})
    assert len(api.list("Node", None).items) == 2  # the inventory reads nodes cluster-wide
    assert api.list("Secret", "polychip-t-acme").items == []  # and its tenants' namespaces
    kube.cluster.cluster.denied.clear()
