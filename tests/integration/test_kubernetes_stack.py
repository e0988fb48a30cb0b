"""The job's life through the real stack on the Kubernetes backend: REST in, Celery in between, pods
underneath, made in the emulated apiserver (``tests.kubecluster``) and run by the test node agent as local
processes. The same paths as the local backend's tests (tests/integration/test_job_life.py,
test_recovery.py), with the cluster in place of the host. Nothing here has met a real apiserver."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from billing.models import UsageRecord
from jobs import services
from jobs.models import Allocation, JobEvent, TrainingJob
from runtime.backends.kubernetes import cluster_settings
from runtime.backends.kubernetes.api import Api, connect
from runtime.inventory import load_pool
from tests.attempts import handle_of, wait_until
from tests.kubecluster.agent import NodeAgent
from tests.kubecluster.emulator import RunningCluster
from tests.stack import free_port, running_stack, stack_env

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

IMAGE = "registry.example/polychip-worker:it"
FINAL = {"succeeded", "failed", "cancelled"}
NAMESPACE = "polychip-t-acme"


class Kube:
    def __init__(self, cluster: RunningCluster, agent: NodeAgent) -> None:
        self.cluster = cluster
        self.agent = agent

    def pods(self, run: str, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
        return [
            p
            for p in self.cluster.cluster.objects("pods", namespace)
            if p["metadata"]["labels"].get("polychip.io/run") == run
        ]


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    from django.conf import settings

    root = tmp_path_factory.mktemp("kube")
    pool = load_pool(settings.POLYCHIP_POOL_FILE)
    resources = {s.flavor: s.resource for s in cluster_settings(pool).selectors}
    with RunningCluster(root / "apiserver") as cluster:
        for node in pool.nodes:
            cluster.add_node(
                node.name, labels={"polychip.io/flavor": node.flavor}, resources={resources[node.flavor]: node.devices}
            )
        agent_api = Api(connect(str(cluster.admin_kubeconfig)))
        with NodeAgent(
            agent_api, root / "nodes", images=frozenset({IMAGE}), logs_dir=cluster.cluster.logs_dir
        ) as agent:
            yield Kube(cluster, agent)
            assert agent.errors == []
            assert cluster.cluster.denied == []  # RBAC (deploy's rbac.yaml) allowed all the control plane did


@pytest.fixture(scope="module")
def stack(django_db_setup: Any, django_db_blocker: Any, stack_var: Path, kube: Kube) -> Iterator[str]:
    """The stack of tests/stack.py with POLYCHIP_BACKEND=kubernetes, pointed at the emulated cluster."""
    port = free_port()
    env = {
        **stack_env(stack_var, port),
        "POLYCHIP_BACKEND": "kubernetes",
        "POLYCHIP_K8S_KUBECONFIG": str(kube.cluster.kubeconfig),
        "POLYCHIP_K8S_WORKER_IMAGE": IMAGE,
        # The agent runs the pods on this host: they reach the stack where it listens.
        "POLYCHIP_K8S_TELEMETRY_URL": f"http://127.0.0.1:{port}",
    }
    with running_stack(django_db_blocker, env, port) as url:
        yield url


def _run(job_id: int) -> str:
    handle = wait_until(lambda: handle_of(job_id), what="a launched run")
    assert handle["backend"] == "kubernetes", handle
    return str(handle["run"])


def _messages(job_id: int) -> list[str]:
    return list(JobEvent.objects.filter(job_id=job_id).order_by("pk").values_list("message", flat=True))


def _transitions(job_id: int) -> list[tuple[str, str]]:
    rows = JobEvent.objects.filter(job_id=job_id, kind="transition").order_by("pk")
    return list(rows.values_list("from_state", "to_state"))


def test_a_job_mixing_two_flavors_runs_to_succeeded_in_pods_and_is_metered(api_for, tenants, pool, kube):
    api = api_for(tenants[0].token)
    spec = {
        "name": "k8s-mixed",
        "devices": 4,
        "flavors": ["h100-sxm", "a100-sxm"],  # two of each in the pool: only a mixed gang fits
        "workload": {"steps": 60, "global_batch": 64, "seed": 3},
    }
    response = api.post("/api/v1/jobs", spec)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    run = _run(job_id)
    pods = wait_until(lambda: len(kube.pods(run)) == 5 and kube.pods(run), what="the run's pods")

    job = api.wait_for(job_id, FINAL, timeout_s=180)

    assert job["state"] == "succeeded", job
    assert job["progress"]["steps_done"] == 60
    assert sorted(d["flavor"] for d in job["devices"]) == ["a100-sxm", "a100-sxm", "h100-sxm", "h100-sxm"]
    ranks = {
        p["metadata"]["labels"]["polychip.io/flavor"]
        for p in pods
        if p["metadata"]["labels"]["polychip.io/role"] == "rank"
    }
    assert ranks == {"h100-sxm", "a100-sxm"}
    assert _transitions(job_id) == [
        ("", "queued"),
        ("queued", "admitted"),
        ("admitted", "running"),
        ("running", "succeeded"),
    ]
    # Torn down: nothing of the run is left in the cluster, and no process of it on the nodes.
    wait_until(lambda: kube.cluster.objects_of_run(run) == [], what="the run's objects gone")
    assert not any(key[1].startswith(run) for key in kube.agent.running)
    allocations = list(Allocation.objects.filter(job_id=job_id))
    assert {r.key for r in UsageRecord.objects.filter(job_id=job_id)} == {f"allocation:{a.pk}" for a in allocations}
    # The ranks' output, through the pods' log API while they ran, kept after.
    text = api.get(f"/api/v1/jobs/{job_id}/logs").text
    assert sorted(line.split("]")[0] for line in text.splitlines() if "finished 60 steps" in line) == [
        f"[rank {rank}" for rank in range(4)
    ], text
    # The tenant's namespace was made with its guards before the first launch.
    kinds = {o["kind"] for o in kube.cluster.cluster.objects(namespace=NAMESPACE)}
    assert {"ResourceQuota", "LimitRange", "NetworkPolicy", "ServiceAccount", "RoleBinding"} <= kinds


def test_the_demo_job_runs_to_succeeded_on_the_cluster(api_for, tenants, pool, kube):
    from controlplane.cli.server import DEMO_SPEC

    api = api_for(tenants[0].token)
    job_id = api.post("/api/v1/jobs", DEMO_SPEC).json()["id"]
    run = _run(job_id)

    job = api.wait_for(job_id, FINAL, timeout_s=240)

    assert job["state"] == "succeeded", (job["failure_reason"], _messages(job_id))
    assert job["progress"]["steps_done"] == DEMO_SPEC["workload"]["steps"]
    assert float(job["loss"]["last"]) < 0.6 * float(job["loss"]["first"]), job["loss"]
    wait_until(lambda: kube.cluster.objects_of_run(run) == [], what="the run's objects gone")


def test_a_cancelled_job_leaves_no_pod_behind(api_for, tenants, pool, kube):
    api = api_for(tenants[0].token)
    spec = {
        "name": "k8s-cancel",
        "devices": 2,
        "flavors": ["tpu-v4"],
        "workload": {"steps": 100_000, "global_batch": 32},
    }
    job_id = api.post("/api/v1/jobs", spec).json()["id"]
    run = _run(job_id)
    wait_until(lambda: api.get(f"/api/v1/jobs/{job_id}").json()["progress"]["steps_done"] > 5, what="steps")

    assert api.post(f"/api/v1/jobs/{job_id}/cancel").status_code in (200, 202)
    job = api.wait_for(job_id, FINAL, timeout_s=60)

    assert job["state"] == "cancelled"
    wait_until(lambda: kube.cluster.objects_of_run(run) == [], what="the run's objects gone")
    assert not any(key[1].startswith(run) for key in kube.agent.running)


def test_a_killed_rank_is_recovered_on_new_pods_and_both_attempts_are_metered(api_for, tenants, pool, kube):
    api = api_for(tenants[0].token)
    spec = {
        "name": "k8s-recover",
        "devices": 3,
        "flavors": ["ascend-910b"],
        "workload": {"steps": 300, "global_batch": 96, "seed": 5},
        "checkpoint": {"weights_every": 10, "keep": 3},
        "max_restarts": 2,
    }
    job_id = api.post("/api/v1/jobs", spec).json()["id"]
    run = _run(job_id)
    wait_until(lambda: api.get(f"/api/v1/jobs/{job_id}").json()["progress"]["steps_done"] >= 30, what="steps")
    pid = kube.agent.pid_of(NAMESPACE, f"{run}-r1")
    assert pid is not None
    os.kill(pid, signal.SIGKILL)

    job = api.wait_for(job_id, FINAL, timeout_s=240)

    assert job["state"] == "succeeded", (
        job["failure_reason"],
        list(JobEvent.objects.filter(job_id=job_id).values_list("message", flat=True)),
    )
    assert job["restarts"] == 1 and job["attempt"] == 1
    assert job["recovery"]["restored"]["step"] >= 20
    transitions = _transitions(job_id)
    assert ("running", "recovering") in transitions and ("recovering", "admitted") in transitions
    assert UsageRecord.objects.filter(job_id=job_id).count() == 6
    wait_until(lambda: kube.cluster.objects_of_run(run) == [], what="the first attempt's objects gone")
    assert TrainingJob.objects.get(pk=job_id).attempt == 1


@pytest.fixture
def as_the_stack(settings: Any, kube: Kube) -> Iterator[None]:
    """This test process acting on jobs as the stack's processes do: through the Kubernetes backend."""
    from jobs.backends import get_backend

    settings.POLYCHIP_BACKEND = "kubernetes"
    settings.POLYCHIP_K8S_KUBECONFIG = str(kube.cluster.kubeconfig)
    settings.POLYCHIP_K8S_WORKER_IMAGE = IMAGE
    get_backend.cache_clear()
    yield
    get_backend().close()  # type: ignore[attr-defined]
    get_backend.cache_clear()


def test_draining_a_node_stops_its_pods_after_a_checkpoint_and_moves_the_job(
    api_for, tenants, pool, kube, as_the_stack
):
    api = api_for(tenants[0].token)
    spec = {
        "name": "k8s-drain",
        "devices": 2,
        "flavors": ["h100-sxm", "a100-sxm"],
        "workload": {"steps": 400, "global_batch": 64, "seed": 4},
        "checkpoint": {"weights_every": 25, "optimizer_every": 50},
    }
    job_id = api.post("/api/v1/jobs", spec).json()["id"]
    run = _run(job_id)
    wait_until(lambda: api.get(f"/api/v1/jobs/{job_id}").json()["progress"]["steps_done"] >= 10, what="steps")
    node = TrainingJob.objects.get(pk=job_id).allocations.get(rank=0).device.node.name

    assert services.drain_node(node, by="op") == [job_id]
    job = api.wait_for(job_id, FINAL, timeout_s=180)

    assert job["state"] == "succeeded", job["failure_reason"]
    assert job["restarts"] == 0 and job["attempt"] == 1, _messages(job_id)
    # The stop reached the ranks through the run's ConfigMap: every rank ended with 4 after a full save.
    assert job["recovery"]["restored"]["optimizer_step"] == job["recovery"]["restored"]["step"] > 0
    wait_until(lambda: kube.cluster.objects_of_run(run) == [], what="the drained attempt's objects gone")


def test_a_borrower_preempted_for_its_lender_loses_its_pods_and_waits(api_for, tenants, pool, kube):
    from tenants.models import Cohort, Quota, Tenant

    acme, globex = tenants[0], tenants[1]
    cohort = Cohort.objects.create(name="k8s-lab")
    Tenant.objects.filter(pk__in=[acme.id, globex.id]).update(cohort=cohort)
    for tenant in (acme, globex):
        Quota.objects.create(tenant_id=tenant.id, resource="ascend-910b", nominal=2)
    borrowing = {"name": "k8s-borrower", "devices": 4, "flavors": ["ascend-910b"]}
    borrower = api_for(globex.token).post("/api/v1/jobs", {**borrowing, "workload": {"steps": 100_000}}).json()["id"]
    run = _run(borrower)
    wait_until(lambda: len(kube.pods(run, "polychip-t-globex")) == 5, what="the borrower's pods")

    owner_spec = {"name": "k8s-owner", "devices": 2, "flavors": ["ascend-910b"], "workload": {"steps": 40}}
    owner = api_for(acme.token).post("/api/v1/jobs", owner_spec).json()["id"]
    done = api_for(acme.token).wait_for(owner, FINAL, timeout_s=180)

    assert done["state"] == "succeeded", done
    preempted = TrainingJob.objects.get(pk=borrower)
    assert preempted.preemptions == 1 and preempted.attempt >= 1
    assert kube.cluster.objects_of_run(run) == []  # the preempted attempt's pods went before the owner's came
    assert api_for(globex.token).post(f"/api/v1/jobs/{borrower}/cancel").status_code in (200, 202)


def test_the_clusters_word_on_its_nodes_takes_devices_out_and_returns_only_its_own(tenants, pool, kube, as_the_stack):
    from jobs.models import Device, DeviceHealth

    def health(node: str) -> set[str]:
        return set(Device.objects.filter(node__name=node).values_list("health", flat=True))

    emulated = kube.cluster.cluster
    not_ready = [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]
    emulated.set_node_conditions("tpu-v4-0", not_ready)
    emulated.set_node_conditions("npu-910b-0", not_ready)
    services.set_device_health(
        Device.objects.filter(node__name="npu-910b-0").values_list("device_id", flat=True), "cordoned", by="op"
    )

    assert services.sync_cluster_inventory() == {"devices": 12, "health_changes": 4}
    assert health("tpu-v4-0") == {DeviceHealth.FAILED} and health("npu-910b-0") == {DeviceHealth.CORDONED}
    by = Device.objects.filter(node__name="tpu-v4-0").first().events.last().by
    assert by == "cluster: not Ready (KubeletNotReady)"

    ready = [{"type": "Ready", "status": "True"}]
    emulated.set_node_conditions("tpu-v4-0", ready)
    emulated.set_node_conditions("npu-910b-0", ready)
    services.sync_cluster_inventory()

    # What the cluster took out comes back; what the operator cordoned stays cordoned.
    assert health("tpu-v4-0") == {DeviceHealth.HEALTHY} and health("npu-910b-0") == {DeviceHealth.CORDONED}
    assert services.sync_cluster_inventory() == {"devices": 12, "health_changes": 0}

    # A node the cluster no longer has takes its devices out with it, until it is back.
    node = kube.cluster.cluster.objects("nodes")
    (tpu_node,) = [n for n in node if n["metadata"]["name"] == "tpu-v4-0"]
    emulated.delete(("nodes", "", "tpu-v4-0"))
    assert services.sync_cluster_inventory() == {"devices": 8, "health_changes": 4}
    assert health("tpu-v4-0") == {DeviceHealth.CORDONED}
    assert Device.objects.filter(node__name="tpu-v4-0").first().events.last().by == (
        "cluster: node tpu-v4-0: no longer in the cluster"
    )
    emulated.put(
        "nodes",
        {k: v for k, v in tpu_node.items() if k != "metadata"}
        | {"metadata": {"name": "tpu-v4-0", "labels": tpu_node["metadata"]["labels"]}},
    )
    services.sync_cluster_inventory()
    assert health("tpu-v4-0") == {DeviceHealth.HEALTHY}
    services.set_device_health(
        Device.objects.filter(node__name="npu-910b-0").values_list("device_id", flat=True), "healthy", by="op"
    )


def test_a_torchrun_script_from_a_bundle_runs_in_pods_that_fetch_and_check_its_code(
    api_for, tenants, pool, kube, tmp_path
):
    from tests.integration.test_user_code_stack import upload
    from tests.usercode import DDP_EXAMPLE

    api = api_for(tenants[0].token)
    bundle = upload(api, tmp_path / "bundle", {"train.py": DDP_EXAMPLE.read_text()})
    spec = {
        "name": "k8s-ddp",
        "devices": 2,
        "flavors": ["tpu-v4"],
        "workload": {"kind": "torchrun", "bundle": bundle, "entrypoint": "train.py", "steps": 40},
    }
    job_id = api.post("/api/v1/jobs", spec).json()["id"]
    run = _run(job_id)
    pods = wait_until(lambda: len(kube.pods(run)) == 3 and kube.pods(run), what="the run's pods")

    job = api.wait_for(job_id, FINAL, timeout_s=240)

    assert job["state"] == "succeeded", (job["failure_reason"], _messages(job_id))
    assert "done" in api.get(f"/api/v1/jobs/{job_id}/logs?rank=0").text.splitlines()
    ranks = [p for p in pods if p["metadata"]["labels"]["polychip.io/role"] == "rank"]
    assert all(p["spec"]["initContainers"][0]["name"] == "code" for p in ranks)
    fetched = (kube.cluster.cluster.logs_dir / NAMESPACE / f"{run}-r0.code.log").read_text()
    assert "fetched and unpacked" in fetched


def test_a_container_job_runs_the_tenants_image_and_command_on_a_cluster(api_for, tenants, pool, kube):
    api = api_for(tenants[0].token)
    spec = {
        "name": "k8s-container",
        "devices": 2,
        "flavors": ["tpu-v4"],
        # The one image the emulated nodes hold; the command is the tenant's own, not Polychip's worker.
        "workload": {
            "kind": "container",
            "image": IMAGE,
            "command": [
                "python",
                "-c",
                "import os; print('hello from rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])",
            ],
        },
    }
    response = api.post("/api/v1/jobs", spec)
    assert response.status_code == 201, response.text

    job = api.wait_for(response.json()["id"], FINAL, timeout_s=90)

    assert job["state"] == "succeeded", (job["failure_reason"], _messages(job["id"]))
    text = api.get(f"/api/v1/jobs/{job['id']}/logs").text
    assert {line.split("] ", 1)[1] for line in text.splitlines()} == {
        "hello from rank 0 of 2",
        "hello from rank 1 of 2",
    }
