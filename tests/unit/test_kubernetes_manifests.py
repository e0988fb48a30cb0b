"""What the Kubernetes backend asks of a cluster (runtime.backends.kubernetes.manifests): a tenant's namespace and its
guards, a run's parent and children. Every object is validated strictly against the Kubernetes 1.33 schemas
(kubernetes-validate, offline); what each says is asserted beside."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest

from runtime.backends.base import LaunchRequest, RankPlacement
from runtime.backends.kubernetes.manifests import (
    ClusterConfig,
    run_children,
    run_parent,
    tenant_namespace,
    tenant_objects,
)
from runtime.jobspec import WorkloadSpec
from runtime.worker.config import TELEMETRY_TOKEN_ENV, load_config

pytestmark = pytest.mark.unit

KUBERNETES = "1.33.0"
CONFIG = ClusterConfig(
    worker_image="registry.example/polychip-worker:1",
    resources={"h100-sxm": "nvidia.com/gpu", "ascend-910b": "huawei.com/Ascend910"},
    tolerations={"h100-sxm": frozenset({"nvidia.com/gpu"})},
)
RUN = "job-7-20261205120000000000-a1"
UID = "6f1c1e9e-2f0a-4a47-9d55-0b1f7c1d2e3a"


def valid(manifest: dict) -> dict:
    """The manifest, once the strict schema took it (unknown fields, wrong types and missing fields fail)."""
    kubernetes_validate.validate(manifest, KUBERNETES, strict=True)
    return manifest


def request(workload: WorkloadSpec | None = None) -> LaunchRequest:
    return LaunchRequest(
        job_id=RUN,
        placements=(
            RankPlacement(rank=0, device_id="gpu-a/0", flavor="h100-sxm", node="gpu-a", vendor="nvidia"),
            RankPlacement(rank=1, device_id="npu-b/3", flavor="ascend-910b", node="npu-b", vendor="huawei"),
        ),
        workload=workload or WorkloadSpec(),
        telemetry_url="http://polychip.polychip.svc/api/v1/ingest/jobs/7/telemetry",
        telemetry_token="ingest-secret",
        artifacts_dir="/artifacts/" + RUN,
    )


def test_a_tenants_namespace_is_guarded_by_quota_limits_and_a_default_deny_policy():
    objects = [valid(o) for o in tenant_objects(CONFIG, "acme", {"nvidia.com/gpu": 8, "huawei.com/Ascend910": 16})]
    by_kind = {o["kind"]: o for o in objects}
    assert by_kind["Namespace"]["metadata"]["name"] == "polychip-t-acme"
    assert all(o["metadata"].get("namespace", "polychip-t-acme") == "polychip-t-acme" for o in objects)
    assert by_kind["ResourceQuota"]["spec"]["hard"] == {
        "requests.huawei.com/Ascend910": "16",
        "requests.nvidia.com/gpu": "8",
    }
    assert by_kind["ServiceAccount"]["automountServiceAccountToken"] is False
    policy = by_kind["NetworkPolicy"]["spec"]
    assert policy["podSelector"] == {} and policy["policyTypes"] == ["Ingress", "Egress"]
    assert policy["ingress"] == [{"from": [{"podSelector": {}}]}]  # only the tenant's own pods reach them
    own, web, dns = policy["egress"]
    assert own == {"to": [{"podSelector": {}}]}
    assert web == {  # telemetry to the control plane's web pods, nothing else of it
        "to": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "polychip"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/component": "web"}},
            }
        ],
        "ports": [{"protocol": "TCP", "port": 8000}],
    }
    assert dns["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    binding = by_kind["RoleBinding"]
    assert binding["roleRef"]["name"] == "polychip-tenant-runs" and binding["roleRef"]["kind"] == "ClusterRole"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "polychip-control-plane", "namespace": "polychip"}
    ]


@pytest.mark.parametrize("slug", ["Has_Underscore", "x" * 60, "dot.ted"])
def test_a_namespace_that_cannot_be_a_dns_label_is_refused_with_the_fix(slug):
    with pytest.raises(ValueError, match=r"not a DNS label .* shorten the namespace prefix or the tenant's slug"):
        tenant_namespace(CONFIG, slug)


def test_the_parent_holds_every_ranks_config_but_not_the_token():
    configs = {r: {"rank": r, "job_id": RUN, "telemetry_token": "ingest-secret"} for r in (0, 1)}
    parent = valid(run_parent(request(), "polychip-t-acme", configs))
    assert parent["kind"] == "ConfigMap" and parent["metadata"]["name"] == RUN
    assert sorted(parent["data"]) == ["rank0.json", "rank1.json", "shared.json"]
    assert json.loads(parent["data"]["shared.json"]) == {"job_id": RUN}
    assert json.loads(parent["data"]["rank1.json"]) == {"rank": 1, "shared": "shared.json"}
    assert "ingest-secret" not in json.dumps(parent)


def test_a_256_rank_run_fits_one_object_and_each_worker_reads_back_its_whole_config(tmp_path, monkeypatch):
    """Each rank's config repeats arrays as long as the world: written whole per rank, 256 ranks passed the
    apiserver's 1 MiB per object. Shared once, the object stays small, and every worker reads exactly the
    config it was given."""
    from runtime.worker.config import WorkerConfig

    world = 256
    workers = {
        rank: WorkerConfig(
            job_id=RUN,
            rank=rank,
            world_size=world,
            master_addr=f"store.{RUN}",
            master_port=29500,
            flavor="h100-sxm" if rank % 2 else "ascend-910b",
            device_id=f"node-{rank // 8}/{rank % 8}",
            workload=WorkloadSpec(global_batch=world * 4),
            micro_batches=(4,) * world,
            artifacts_dir=str(tmp_path),
            scores=tuple(1.0 + (r % 2) * 2.1 for r in range(world)),
            caps=(64,) * world,
            vendor_groups=tuple(r % 2 for r in range(world)),
            telemetry_token="ingest-secret",
        )
        for rank in range(world)
    }
    whole = {rank: w.to_dict() for rank, w in workers.items()}
    assert sum(len(json.dumps(c)) for c in whole.values()) > 2**20  # what one file per rank would weigh
    parent = run_parent(request(), "ns", whole)
    size = sum(len(key) + len(value) for key, value in parent["data"].items())
    assert size < 2**20 / 4, size
    for name, text in parent["data"].items():
        (tmp_path / name).write_text(text)
    monkeypatch.setenv(TELEMETRY_TOKEN_ENV, "ingest-secret")
    for rank in (0, 1, 255):
        assert load_config(tmp_path / f"rank{rank}.json") == workers[rank]


def test_every_child_is_owned_by_the_parent_so_one_delete_tears_the_run_down():
    children = [valid(o) for o in run_children(CONFIG, request(), "polychip-t-acme", UID)]
    assert [(o["kind"], o["metadata"]["name"]) for o in children] == [
        ("Secret", f"{RUN}-token"),
        ("Service", RUN),
        ("Pod", f"{RUN}-store"),
        ("Pod", f"{RUN}-r0"),
        ("Pod", f"{RUN}-r1"),
    ]
    for child in children:
        (owner,) = child["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("ConfigMap", RUN, UID, True)
        assert child["metadata"]["labels"]["polychip.io/run"] == RUN
        assert child["metadata"]["namespace"] == "polychip-t-acme"
    service = children[1]["spec"]
    assert service["clusterIP"] == "None" and service["publishNotReadyAddresses"] is True
    assert service["selector"] == {"polychip.io/run": RUN}
    assert children[0]["stringData"] == {"token": "ingest-secret"}
    store = children[2]["spec"]
    assert store["hostname"] == "store" and store["subdomain"] == RUN
    assert store["containers"][0]["command"][-3:] == ["runtime.recovery.storehost", "0.0.0.0", "29500"]  # noqa: S104


def test_a_rank_pod_is_pinned_to_its_node_asks_one_device_of_its_flavor_and_has_the_torchrun_environment():
    pods = [o for o in run_children(CONFIG, request(), "polychip-t-acme", UID) if o["metadata"]["name"].endswith("-r1")]
    (pod,) = pods
    spec = pod["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["npu-b"]}]}]
    (container,) = spec["containers"]
    assert container["resources"]["limits"]["huawei.com/Ascend910"] == "1"
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert spec["tolerations"] == []  # the Ascend flavor tolerates no taint; the H100 one does
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["RANK"], env["WORLD_SIZE"]) == (
        f"store.{RUN}",
        "29500",
        "1",
        "2",
    )
    assert env[TELEMETRY_TOKEN_ENV] == {"secretKeyRef": {"name": f"{RUN}-token", "key": "token"}}
    assert container["image"] == CONFIG.worker_image
    assert container["command"][-1] == "/etc/polychip/run/rank1.json"
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    h100 = next(o for o in run_children(CONFIG, request(), "ns", UID) if o["metadata"]["name"].endswith("-r0"))
    assert {t["key"] for t in h100["spec"]["tolerations"]} == {"nvidia.com/gpu"}


def test_a_container_job_runs_the_tenants_image_and_command_with_the_same_environment():
    workload = WorkloadSpec(
        kind="container", image="ghcr.io/acme/train:3", command=("torchrun",), args=("train.py",), env={"A": "1"}
    )
    pod = [valid(o) for o in run_children(CONFIG, request(workload), "ns", UID)][-1]
    (container,) = pod["spec"]["containers"]
    assert (container["image"], container["command"], container["args"]) == (
        "ghcr.io/acme/train:3",
        ["torchrun"],
        ["train.py"],
    )
    assert {"name": "A", "value": "1"} in container["env"]
    only_args = WorkloadSpec(kind="container", image="ghcr.io/acme/train:3", args=("--epochs", "3"))
    (container,) = run_children(CONFIG, request(only_args), "ns", UID)[-1]["spec"]["containers"]
    assert "command" not in container and container["args"] == ["--epochs", "3"]  # the image's entrypoint runs


def test_a_python_jobs_ranks_fetch_and_check_its_bundle_before_they_start():
    bundle = "sha256:" + "b" * 64
    launch = request(WorkloadSpec(kind="torchrun", bundle=bundle, entrypoint="train.py"))
    url = "http://polychip-web.polychip.svc:8000/api/v1/ingest/jobs/7/bundle"
    rank = valid(run_children(CONFIG, launch, "ns", UID, bundle_url=url)[-1])

    (fetch,) = rank["spec"]["initContainers"]
    assert fetch["command"] == ["python", "-m", "runtime.codefetch", url, bundle, "/polychip/code/src"]
    assert fetch["image"] == CONFIG.worker_image
    token = {
        "name": "POLYCHIP_TELEMETRY_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": f"{RUN}-token", "key": "token"}},
    }
    assert token in fetch["env"]  # the run's own token, from its Secret
    (container,) = rank["spec"]["containers"]
    assert {"name": "code", "mountPath": "/polychip/code", "readOnly": True} in container["volumeMounts"]
    assert {"name": "code", "emptyDir": {"sizeLimit": "2Gi"}} in rank["spec"]["volumes"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"workload": WorkloadSpec(kind="python", bundle="sha256:" + "a" * 64, entrypoint="m:f")}, "bundle_url"),
        ({"placements": (RankPlacement(rank=0, device_id="x/0", flavor="tpu-v4", node="x"),)}, "'tpu-v4' has no"),
    ],
)
def test_what_the_backend_cannot_run_is_refused_with_why(change, message):
    base = request()
    launch = LaunchRequest(**{**base.__dict__, **change})
    with pytest.raises(ValueError, match=message):
        run_children(CONFIG, launch, "ns", UID)


def test_a_worker_reads_its_token_from_the_environment_when_the_shared_config_leaves_it_out(tmp_path, monkeypatch):
    from runtime.worker.config import WorkerConfig

    worker = WorkerConfig(
        job_id=RUN,
        rank=0,
        world_size=1,
        master_addr="127.0.0.1",
        master_port=29500,
        flavor="h100-sxm",
        device_id="gpu-a/0",
        workload=WorkloadSpec(),
        micro_batches=(WorkloadSpec().global_batch,),
        artifacts_dir=str(tmp_path),
        telemetry_token="ingest-secret",
    )
    shared = {k: v for k, v in worker.to_dict().items() if k != "telemetry_token"}
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(shared))
    monkeypatch.delenv(TELEMETRY_TOKEN_ENV, raising=False)
    assert load_config(path).telemetry_token == ""
    monkeypatch.setenv(TELEMETRY_TOKEN_ENV, "from-the-secret")
    assert load_config(path).telemetry_token == "from-the-secret"


def test_the_schema_check_is_strict_enough_to_catch_a_misspelt_field():
    pod = run_children(CONFIG, request(), "ns", UID)[-1]
    pod["spec"]["nodeAfinity"] = pod["spec"].pop("affinity")
    with pytest.raises(kubernetes_validate.ValidationError, match="nodeAfinity"):
        valid(pod)


def test_a_shared_config_must_lie_beside_the_ranks_file(tmp_path):
    from runtime.worker.config import ConfigError

    (tmp_path / "rank0.json").write_text(json.dumps({"rank": 0, "shared": "../elsewhere.json"}))
    with pytest.raises(ConfigError, match="shared"):
        load_config(tmp_path / "rank0.json")
