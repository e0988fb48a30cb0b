"""Polychip's own deployment (deploy/kubernetes/base, deploy/Containerfile): every manifest validates strictly against
the Kubernetes 1.33 schemas, the pieces refer to each other, and the control plane's role allows what the Kubernetes
backend renders. No apiserver runs here; kustomize's own rendering is not run by the tests (kubectl is not
installed everywhere), which is why the base holds whole manifests only: no generators, no patches."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from runtime.backends.base import LaunchRequest, RankPlacement
from runtime.backends.kubernetes.manifests import ClusterConfig, run_children, run_parent, tenant_objects
from runtime.jobspec import WorkloadSpec

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "kubernetes" / "base"
KUBERNETES = "1.33.0"


def kustomization() -> dict[str, Any]:
    return yaml.safe_load((BASE / "kustomization.yaml").read_text())


def manifests() -> list[dict[str, Any]]:
    found = []
    for name in kustomization()["resources"]:
        found += [doc for doc in yaml.safe_load_all((BASE / name).read_text()) if doc]
    return found


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["name"]: m for m in manifests() if m["kind"] == kind}


def pod_templates() -> list[dict[str, Any]]:
    return [m["spec"]["template"] for m in manifests() if m["kind"] in ("Deployment", "Job")]


def test_the_base_lists_every_file_and_uses_no_generator_or_patch():
    listed = kustomization()
    assert sorted(listed["resources"]) == sorted(p.name for p in BASE.glob("*.yaml") if p.name != "kustomization.yaml")
    assert not {"patches", "configMapGenerator", "secretGenerator", "components"} & set(listed)


def test_every_manifest_validates_strictly():
    checked = manifests()
    for manifest in checked:
        kubernetes_validate.validate(manifest, KUBERNETES, strict=True)
    kinds = {m["kind"] for m in checked}
    assert {"Deployment", "Job", "Service", "Ingress", "PodDisruptionBudget", "ConfigMap", "ClusterRole"} <= kinds
    assert len(checked) == 14


def test_web_worker_beat_and_migrations_run_the_one_image_with_the_settings_and_secrets():
    deployments = by_kind("Deployment")
    assert set(deployments) == {"polychip-web", "polychip-worker", "polychip-beat"}
    for template in pod_templates():
        spec = template["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        for container in spec.get("initContainers", []) + spec["containers"]:
            assert container["image"] == "polychip"  # the base's images entry sets name and tag
            assert container["envFrom"] == [
                {"configMapRef": {"name": "polychip-config"}},
                {"secretRef": {"name": "polychip-secrets"}},
            ]
            assert container["resources"]["requests"] and container["resources"]["limits"]
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert {i["name"] for i in kustomization()["images"]} == {"polychip"}
    assert "polychip-config" in by_kind("ConfigMap")
    web = deployments["polychip-web"]["spec"]["template"]["spec"]
    assert "migrate --check" in web["initContainers"][0]["command"][-1]
    assert {p: web["containers"][0][p]["httpGet"]["path"] for p in ("readinessProbe", "livenessProbe")} == {
        "readinessProbe": "/readyz",
        "livenessProbe": "/healthz",
    }
    assert (
        "inspect ping"
        in deployments["polychip-worker"]["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["exec"][
            "command"
        ][-1]
    )
    beat = deployments["polychip-beat"]["spec"]
    assert (beat["replicas"], beat["strategy"]["type"]) == (1, "Recreate")  # never two beats
    migrate = by_kind("Job")["polychip-migrate"]["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert "migrate --noinput" in migrate and "load_pool" in migrate


def test_the_service_the_budget_and_the_ingress_find_the_web_pods():
    labels = by_kind("Deployment")["polychip-web"]["spec"]["template"]["metadata"]["labels"]
    service = by_kind("Service")["polychip-web"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert by_kind("PodDisruptionBudget")["polychip-web"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    backend = by_kind("Ingress")["polychip"]["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "polychip-web", "port": {"name": "http"}}
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def _allowed(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"] for rule in rules)


def test_the_control_plane_holds_pod_and_secret_rights_only_in_tenants_namespaces():
    roles = by_kind("ClusterRole")
    cluster_wide, per_tenant = roles["polychip-control-plane"]["rules"], roles["polychip-tenant-runs"]["rules"]
    bound_cluster_wide = {b["roleRef"]["name"] for b in by_kind("ClusterRoleBinding").values()}
    assert bound_cluster_wide == {"polychip-control-plane"}  # never the tenant-runs role
    config = ClusterConfig(worker_image="w", resources={"h100-sxm": "nvidia.com/gpu"})
    launch = LaunchRequest(
        job_id="job-1-a0",
        placements=(RankPlacement(rank=0, device_id="n/0", flavor="h100-sxm", node="n"),),
        workload=WorkloadSpec(),
        telemetry_url=None,
        telemetry_token="t",
        artifacts_dir="/data/artifacts/job-1-a0",
    )
    tenant = tenant_objects(config, "acme", {"nvidia.com/gpu": 8})
    rendered = [*tenant, run_parent(launch, "ns", {0: {}}), *run_children(config, launch, "ns", "uid")]
    plural = {"NetworkPolicy": "networkpolicies", "ResourceQuota": "resourcequotas", "LimitRange": "limitranges"}
    for manifest in rendered:
        group = manifest["apiVersion"].rpartition("/")[0]
        resource = plural.get(manifest["kind"], manifest["kind"].lower() + "s")
        # Namespaces and the RoleBinding into them are the cluster-wide role's; the rest the tenant role's.
        rules = cluster_wide if manifest["kind"] in ("Namespace", "RoleBinding") else per_tenant
        for verb in ("create", "get", "patch"):
            assert _allowed(rules, group, resource, verb), f"{verb} {manifest['kind']}"
        if rules is per_tenant:
            assert _allowed(rules, group, resource, "delete") and _allowed(rules, group, resource, "watch")
    (binding,) = [m for m in tenant if m["kind"] == "RoleBinding"]
    assert binding["roleRef"]["name"] == "polychip-tenant-runs"
    assert binding["subjects"][0]["name"] in {
        s["name"] for s in by_kind("ClusterRoleBinding")["polychip-control-plane"]["subjects"]
    }
    assert any(r.get("resourceNames") == ["polychip-tenant-runs"] and r["verbs"] == ["bind"] for r in cluster_wide)
    assert _allowed(cluster_wide, "", "nodes", "watch") and _allowed(per_tenant, "", "pods/log", "get")
    for kind in ("pods", "secrets", "configmaps", "services"):
        assert not any(kind in rule["resources"] for rule in cluster_wide), f"{kind} cluster-wide"
    assert not _allowed(cluster_wide, "", "nodes", "patch")  # the control plane never changes a node
    assert not any("*" in rule["verbs"] or "*" in rule["resources"] for rule in cluster_wide + per_tenant)


def test_only_the_workers_and_the_web_mount_the_control_planes_token():
    mounts = {
        m["metadata"]["name"]: m["spec"]["template"]["spec"].get("automountServiceAccountToken", True)
        for m in manifests()
        if m["kind"] in ("Deployment", "Job")
    }
    assert mounts == {
        "polychip-migrate": False,
        "polychip-web": True,  # jobs' logs through the pods' log API
        "polychip-worker": True,
        "polychip-beat": False,
    }


def test_the_web_probes_pass_the_hosts_check_and_the_https_redirect(monkeypatch):
    from django.test import Client, override_settings

    from controlplane import health

    monkeypatch.setattr(health, "readiness", list)  # every part answers (none is asked: no database here)

    web = by_kind("Deployment")["polychip-web"]["spec"]["template"]["spec"]["containers"][0]
    config = by_kind("ConfigMap")["polychip-config"]["data"]
    assert config["POLYCHIP_ENV"] == "production" and config["POLYCHIP_SANDBOX"] == "required"
    hosts = config["DJANGO_ALLOWED_HOSTS"].split(",")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        headers = {h["name"]: h["value"] for h in web[probe]["httpGet"]["httpHeaders"]}
        assert headers["Host"] in hosts and headers["X-Forwarded-Proto"] == "https"
        with override_settings(
            ALLOWED_HOSTS=hosts,
            SECURE_SSL_REDIRECT=True,
            SECURE_PROXY_SSL_HEADER=("HTTP_X_FORWARDED_PROTO", "https"),
        ):
            client = Client()
            answered = client.get(web[probe]["httpGet"]["path"], headers=headers)
            assert answered.status_code == 200, probe
            assert client.get("/healthz", headers={"Host": "10.0.3.7:8000"}).status_code == 400  # the pod's IP


def test_the_containerfile_copies_what_exists_from_a_pinned_base_and_runs_as_a_user():
    text = (ROOT / "deploy" / "Containerfile").read_text()
    base = re.search(r"^ARG BASE=(\S+)$", text, re.M)
    assert base is not None and re.search(r":\d", base.group(1)) and not base.group(1).endswith(":latest")
    for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M):
        sources = [part for part in line.split() if not part.startswith("--")][:-1]
        for source in sources:
            assert (ROOT / source.removeprefix("./")).exists(), f"COPY {source}: not in the repository"
    users = re.findall(r"^USER (\S+)$", text, re.M)
    assert users and users[-1] not in ("root", "0")
    assert "torch==2.13.0" in text  # the version the project pins
    pinned = re.search(r'"torch==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert pinned is not None and f"torch=={pinned.group(1)}" in text
