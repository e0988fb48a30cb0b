"""Kubernetes backend figures, against the emulated apiserver (tests/kubecluster: kmock over HTTP with the
gaps it has filled in) and its test node agent. No real cluster is measured: the apiserver here is a
Python process on this host, so the latencies say what Polychip's side costs, not what a cluster adds.

    python bench/kubernetes.py [--quick]

1. manifests_validated, manifest_errors: every object the backend renders (a tenant's, and runs of 1,
   2, 8, 64 and 256 ranks over every flavor of the demo pool, with the torchrun environment, container
   workloads included) and every manifest of deploy/kubernetes/base, validated strictly against the
   Kubernetes 1.33 schemas with kubernetes-validate.
2. job_to_pods_ms_p50: Polychip on the embedded default (SQLite, filesystem broker) with
   POLYCHIP_BACKEND=kubernetes, pointed at the emulator; each job submitted over REST, from its admission
   (the transition's event time) to the last of its pods created (the pod's creationTimestamp).
3. reconcile_pass_ms_p50: 250 runs of 3 ranks and a store (1,000 pods) in the emulator, their statuses
   set; one pass observes every run from the reconciler's cache (list-then-watch) as the control plane's
   sweep does; the median pass.
4. relist_recovered: the emulator compacts (every version gone, open watches dropped) while pods change;
   1 when the watch got its 410, listed again, and its cache equals the store.
5. orphans_after_teardown: every one of the 250 runs torn down (one delete each); objects of any of them
   left in the store afterwards.
6. k8s_job_life_passed, k8s_recovery_passed: the Kubernetes tests (tests/integration/test_kubernetes_stack.py,
   tests/runtime/test_kubernetes_backend.py) run with pytest against PostgreSQL and Redis (the Makefile's
   test environment); passed/run of the life tests (submit, two flavors, cancel, preemption, drain, logs,
   tenancy) and of the recovery tests (kill -9, node failure, stop, 410). Skipped (null) with --quick.

--quick submits 3 jobs instead of 8 and times 5 reconcile passes instead of 20. The last line printed is
one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, this file's folder comes first on the path, and this file's name would hide the
# kubernetes client package: the folder goes, the repository root (for bench.*) comes.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

import kubernetes_validate  # noqa: E402
import yaml  # noqa: E402

from bench.skeleton import cli, free_port  # noqa: E402
from controlplane.cli.api import Api as Client  # noqa: E402
from runtime.backends.base import LaunchRequest, Phase, RankPlacement  # noqa: E402
from runtime.backends.kubernetes import ClusterConfig, KubernetesBackend, cluster_settings  # noqa: E402
from runtime.backends.kubernetes.api import Api, connect  # noqa: E402
from runtime.backends.kubernetes.manifests import run_children, run_parent, tenant_objects  # noqa: E402
from runtime.backends.launch import worker_configs  # noqa: E402
from runtime.comm.link import LinkEmulation  # noqa: E402
from runtime.inventory import load_pool  # noqa: E402
from runtime.jobspec import WorkloadSpec  # noqa: E402
from tests.kubecluster.agent import NodeAgent  # noqa: E402
from tests.kubecluster.emulator import RunningCluster  # noqa: E402

KUBERNETES = "1.33.0"
IMAGE = "registry.example/polychip-worker:bench"
POOL = load_pool(ROOT / "runtime" / "pools" / "demo.yaml")
SELECTORS = cluster_settings(POOL).selectors
CONFIG = ClusterConfig(
    worker_image=IMAGE,
    resources={s.flavor: s.resource for s in SELECTORS},
    tolerations={s.flavor: s.tolerations for s in SELECTORS},
)
FLAVORS = sorted(CONFIG.resources)


def _request(run: str, ranks: int, workload: WorkloadSpec | None = None) -> LaunchRequest:
    return LaunchRequest(
        job_id=run,
        placements=tuple(
            RankPlacement(rank=r, device_id=f"node-{r}/0", flavor=FLAVORS[r % len(FLAVORS)], node=f"node-{r}")
            for r in range(ranks)
        ),
        workload=workload or WorkloadSpec(steps=100, global_batch=max(64, ranks)),
        telemetry_url="http://polychip.example/api/v1/ingest/jobs/1/telemetry",
        telemetry_token="t",
        artifacts_dir="/var/lib/polychip/artifacts/" + run,
        tenant="bench",
    )


def _rendered(request: LaunchRequest) -> list[dict[str, Any]]:
    configs = worker_configs(
        request,
        master_addr=f"store.{request.job_id}",
        master_port=CONFIG.store_port,
        link=LinkEmulation(),
        collective_timeout_s=30,
        telemetry_url=request.telemetry_url,
        files=lambda rank: {"control_file": "/etc/polychip/run/control.json"},
    )
    parent = run_parent(request, "polychip-t-bench", configs)
    return [parent, *run_children(CONFIG, request, "polychip-t-bench", "00000000-0000-0000-0000-000000000000")]


def manifests() -> dict[str, int]:
    objects: list[dict[str, Any]] = tenant_objects(CONFIG, "bench", {r: 8 for r in CONFIG.resources.values()})
    for ranks in (1, 2, 8, 64, 256):
        objects += _rendered(_request(f"run-{ranks}", ranks))
    container = WorkloadSpec(kind="container", image="registry.example/acme/train:1", command=("python", "t.py"))
    objects += _rendered(_request("run-container", 4, container))
    base = ROOT / "deploy" / "kubernetes" / "base"
    for name in yaml.safe_load((base / "kustomization.yaml").read_text())["resources"]:
        objects += [doc for doc in yaml.safe_load_all((base / name).read_text()) if doc]
    errors = 0
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, KUBERNETES, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors += 1
            print(f"  invalid {obj['kind']} {obj['metadata']['name']}: {exc}", flush=True)
    print(f"manifests: {len(objects)} validated, {errors} invalid", flush=True)
    return {"manifests_validated": len(objects), "manifest_errors": errors}


def _nodes(cluster: RunningCluster) -> None:
    resources = CONFIG.resources
    for node in POOL.nodes:
        cluster.add_node(
            node.name, labels={"polychip.io/flavor": node.flavor}, resources={resources[node.flavor]: node.devices}
        )


def job_to_pods(jobs: int) -> float:
    """Admission to the last pod created, per job, through the control plane on the embedded default."""
    spec = {"devices": 2, "flavors": ["tpu-v4"], "workload": {"steps": 20, "global_batch": 32}}
    with tempfile.TemporaryDirectory(prefix="polychip-bench-k8s-") as scratch:
        root = Path(scratch)
        with RunningCluster(root / "apiserver") as cluster:
            _nodes(cluster)
            agent_api = Api(connect(str(cluster.admin_kubeconfig)))
            with NodeAgent(agent_api, root / "nodes", images=frozenset({IMAGE}), logs_dir=cluster.cluster.logs_dir):
                port = free_port()
                url = f"http://127.0.0.1:{port}"
                env = {
                    k: v
                    for k, v in os.environ.items()
                    if k not in {"DATABASE_URL", "CELERY_BROKER_URL", "CHANNEL_REDIS_URL"}
                }
                env.update(
                    POLYCHIP_VAR_DIR=str(root / "var"),
                    POLYCHIP_PUBLIC_URL=url,
                    POLYCHIP_BACKEND="kubernetes",
                    POLYCHIP_K8S_KUBECONFIG=str(cluster.kubeconfig),
                    POLYCHIP_K8S_WORKER_IMAGE=IMAGE,
                    POLYCHIP_K8S_TELEMETRY_URL=url,
                )
                cli(env, "demo", "--no-job", "--port", str(port))
                try:
                    client = Client(url, (root / "var" / "demo-token").read_text().strip())
                    delays = []
                    for n in range(jobs):
                        job_id = client.submit({**spec, "name": f"bench-k8s-{n}"})["id"]
                        delays.append(_admitted_to_pods(client, cluster, job_id))
                        print(f"  job {job_id}: admission to all pods {delays[-1]:.1f} ms", flush=True)
                finally:
                    cli(env, "down")
    return round(statistics.median(delays), 1)


def _admitted_to_pods(client: Client, cluster: RunningCluster, job_id: int) -> float:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        job = client.job(job_id)
        if job["state"] in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.2)
    if job["state"] != "succeeded":
        raise SystemExit(f"bench: job {job_id} ended {job['state']}: {job['failure_reason']}")
    events = list(client.pages(f"/api/v1/jobs/{job_id}/events", "events", limit=None))
    admitted = next(e for e in events if e.get("to_state") == "admitted")
    made = [
        datetime.fromisoformat(p["metadata"]["creationTimestamp"].replace("Z", "+00:00")).timestamp()
        for p in cluster.cluster.pods_made
        if p["metadata"]["labels"].get("polychip.io/run", "").startswith(f"job-{job_id}-")
    ]
    return (max(made) - datetime.fromisoformat(admitted["created_at"]).timestamp()) * 1000


def reconcile_and_teardown(passes: int) -> dict[str, Any]:
    runs, ranks = 250, 3
    with tempfile.TemporaryDirectory(prefix="polychip-bench-k8s-") as scratch, RunningCluster(Path(scratch)) as cluster:
        cluster.cluster.graceful_pods = False  # no agent: nothing runs the pods, deletes are at once
        backend = KubernetesBackend(
            Api(connect(str(cluster.kubeconfig))), CONFIG, Path(scratch) / "runs", force_after_s=30
        )
        backend.sync_tenant("bench", dict.fromkeys(CONFIG.resources, 10_000))
        handles = [backend.provision(_request(f"run-{n}", ranks)) for n in range(runs)]
        for pod in cluster.cluster.objects("pods"):
            cluster.cluster.set_status(pod["metadata"]["namespace"], pod["metadata"]["name"], _running())
        watch = backend.watch_for("polychip-t-bench")
        _until(lambda: watch.pod_count() == runs * (ranks + 1) and _cache_matches(watch, cluster), "the cache")
        times = []
        for _ in range(passes):
            started = time.perf_counter()
            phases = [backend.observe(handle).phase for handle in handles]
            times.append((time.perf_counter() - started) * 1000)
            assert phases.count(Phase.RUNNING) == runs, phases[:5]
        pods = watch.pod_count()
        print(
            f"reconcile: {pods} pods, {runs} runs observed per pass, median {statistics.median(times):.1f} ms",
            flush=True,
        )

        # A compaction while pods change: the watch must notice (410), list again and converge.
        lists = watch.lists
        cluster.cluster.compact()
        for pod in cluster.cluster.objects("pods")[:50]:
            cluster.cluster.set_status(pod["metadata"]["namespace"], pod["metadata"]["name"], _succeeded())
        recovered = _until(lambda: watch.lists > lists and _cache_matches(watch, cluster), "the relist", fail=False)
        print(
            f"relist: {watch.lists - lists} list(s) after the compaction, cache equal to the store: {recovered}",
            flush=True,
        )

        for handle in handles:
            backend.teardown(handle)
        left = [obj for obj in cluster.cluster.objects() if obj["metadata"].get("labels", {}).get("polychip.io/run")]
        backend.close()
        print(f"teardown: {runs} runs, {len(left)} objects of theirs left", flush=True)
    return {
        "reconcile_pods": pods,
        "reconcile_pass_ms_p50": round(statistics.median(times), 1),
        "relist_recovered": int(recovered and cluster.cluster.gone_answers > 0),
        "orphans_after_teardown": len(left),
    }


def _running() -> dict[str, Any]:
    return {"phase": "Running", "containerStatuses": [{"name": "rank", "state": {"running": {}}}]}


def _succeeded() -> dict[str, Any]:
    return {"phase": "Succeeded", "containerStatuses": [{"name": "rank", "state": {"terminated": {"exitCode": 0}}}]}


def _cache_matches(watch: Any, cluster: RunningCluster) -> bool:
    stored = {p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in cluster.cluster.objects("pods")}
    return watch.synced.is_set() and watch.versions() == stored


def _until(predicate: Any, what: str, timeout_s: float = 60, fail: bool = True) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    if fail:
        raise SystemExit(f"bench: {what} not reached in {timeout_s:.0f} s")
    return False


LIFE = "not (kill or killed or node or stop or relist or 410)"
RECOVERY = "kill or killed or node or stop or relist or 410"


def run_test_tiers() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/polychip")
    env.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/14")
    env.setdefault("CHANNEL_REDIS_URL", "redis://127.0.0.1:6379/15")
    env.setdefault("POLYCHIP_PASSWORD_HASHERS", "django.contrib.auth.hashers.MD5PasswordHasher")
    env.setdefault("POLYCHIP_VAR_DIR", str(ROOT / "var" / "test"))
    files = ["tests/integration/test_kubernetes_stack.py", "tests/runtime/test_kubernetes_backend.py"]
    figures = {}
    for name, selection in (("k8s_job_life_passed", LIFE), ("k8s_recovery_passed", RECOVERY)):
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", selection, *files],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        tail = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-300:]
        counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|error)", tail)}
        run = sum(counts.values())
        figures[name] = f"{counts.get('passed', 0)}/{run}"
        print(f"{name}: {figures[name]} ({tail})", flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer jobs and passes, no test runs")
    quick = parser.parse_args().quick
    figures: dict[str, Any] = {"quick": quick, "emulated": True}
    figures.update(manifests())
    figures["job_to_pods_ms_p50"] = job_to_pods(3 if quick else 8)
    figures.update(reconcile_and_teardown(5 if quick else 20))
    if quick:
        figures.update(k8s_job_life_passed=None, k8s_recovery_passed=None)
    else:
        figures.update(run_test_tiers())
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
