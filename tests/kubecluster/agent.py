"""A test-only node agent: the emulated cluster's kubelets, running each pod's command as a local process.

It talks to the emulator over HTTP as a kubelet talks to the apiserver: it lists the pods, starts those
whose node exists, and writes back their status (``Running`` with a pod IP, then ``Succeeded`` or
``Failed`` with the container's exit code and reason) and their output (the log file the emulator's
``pods/log`` serves, one line per line, after its RFC 3339 time). A pod marked for deletion has its
process stopped (SIGTERM, then SIGKILL after the grace period) and is then removed.

What a node provides is emulated on this one host:

- images: only the Polychip worker image runs (as this checkout's Python); any other image waits
  with ``ErrImagePull``, an image name with spaces or capitals gets ``InvalidImageName``;
- pod networking and cluster DNS: each pod gets an address of its own in 127.0.0.0/8, its command
  binding ``0.0.0.0`` binds that address, and ``<hostname>.<subdomain>`` names of pods in the same
  namespace, in the command, the environment and the mounted files, are replaced by their addresses;
- volumes: a ConfigMap volume is written into a folder per pod (and rewritten when the ConfigMap
  changes, as the kubelet does, but at once), and the mount path in the command, the environment and
  the files is replaced by that folder; environment variables from a Secret are read from the Secret;
- devices: nothing checks the extended resources a pod asks for.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.backends.kubernetes.api import Api, ApiError
from tests.kubecluster.emulator import now_text

_ROOT = Path(__file__).resolve().parents[2]
_IMAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9._/:@-]*$")


@dataclass
class _Running:
    namespace: str
    name: str
    node: str
    process: subprocess.Popen[bytes]
    started_at: str
    mounts: dict[str, Path] = field(default_factory=dict)  # mount path -> local folder
    configmaps: dict[str, str] = field(default_factory=dict)  # local folder -> ConfigMap name
    container: str = "rank"
    reader: threading.Thread | None = None
    stopping: bool = False


class NodeAgent:
    def __init__(
        self,
        api: Api,
        root: Path,
        *,
        images: frozenset[str],
        logs_dir: Path,
        poll_s: float = 0.1,
        grace_s: float = 5.0,
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        self.api = api
        self.root = root
        self.logs_dir = logs_dir  # what the emulator serves as pods/log
        self.images = images
        self.poll_s = poll_s
        self.grace_s = grace_s
        self.extra_env = dict(extra_env or {})
        self.running: dict[tuple[str, str], _Running] = {}
        self.addresses: dict[tuple[str, str], str] = {}  # (namespace, pod) -> its 127.x address
        self._next_address = 0
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._thread = threading.Thread(target=self._loop, name="node-agent", daemon=True)
        self.errors: list[str] = []
        self.failed_nodes: set[str] = set()
        self._waiting_pods: set[tuple[str, str]] = set()  # told once why they wait

    def __enter__(self) -> NodeAgent:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for run in list(self.running.values()):
            self._kill(run, signal.SIGKILL)

    # -- what a test does to the nodes ---------------------------------------------------------------

    def pid_of(self, namespace: str, pod: str) -> int | None:
        run = self.running.get((namespace, pod))
        return run.process.pid if run is not None else None

    def fail_node(self, node: str) -> list[str]:
        """The node dies: its processes are killed, and its pods marked and deleted as the taint manager
        does (a ``DisruptionTarget`` condition, reason ``DeletionByTaintManager``). They stay, still
        "Running" and terminating, as pods of a node that cannot confirm their end stay. Returns the pods."""
        with self._lock:  # not while the loop looks at the same processes
            return self._fail_node(node)

    def _fail_node(self, node: str) -> list[str]:
        self.failed_nodes.add(node)
        gone = []
        for key, run in list(self.running.items()):
            if run.node != node:
                continue
            run.stopping = True
            self._kill(run, signal.SIGKILL)
            run.process.wait(timeout=10)
            # The taint manager marks the pod and deletes it; with no kubelet to confirm, it stays
            # "Running" and terminating until someone force-deletes it.
            condition = {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "DeletionByTaintManager",
                "message": "Taint manager: deleting due to NoExecute taint",
                "lastTransitionTime": now_text(),
            }
            self._status(key[0], key[1], {"conditions": [condition]})
            with contextlib.suppress(ApiError):
                self.api.request("DELETE", f"/api/v1/namespaces/{key[0]}/pods/{key[1]}", body={})
            self.running.pop(key, None)
            gone.append(key[1])
        return gone

    # -- the loop ------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                with self._lock:
                    self._sync()
            except Exception:
                self.errors.append(traceback.format_exc(limit=4))
            self._stop.wait(self.poll_s)

    def _sync(self) -> None:
        pods = self.api.request("GET", "/api/v1/pods").get("items") or []
        seen = set()
        configmaps: dict[tuple[str, str], dict[str, Any]] | None = None
        for pod in pods:
            meta = pod["metadata"]
            key = (meta["namespace"], meta["name"])
            seen.add(key)
            run = self.running.get(key)
            if meta.get("deletionTimestamp"):
                if run is not None and not run.stopping:
                    run.stopping = True
                    threading.Thread(target=self._terminate, args=(key, run), daemon=True).start()
                continue
            phase = pod.get("status", {}).get("phase")
            if run is None and phase == "Pending":
                self._start(pod)
            elif run is not None and not run.stopping:
                code = run.process.poll()
                if code is not None:
                    self._finish(key, run, code)
                elif run.configmaps:
                    if configmaps is None:
                        configmaps = {
                            (c["metadata"]["namespace"], c["metadata"]["name"]): c
                            for c in self.api.request("GET", "/api/v1/configmaps").get("items") or []
                        }
                    self._refresh_volumes(run, configmaps)
        for key, run in list(self.running.items()):
            if key not in seen:  # removed without the graceful path: stop it all the same
                self._kill(run, signal.SIGKILL)
                self.running.pop(key, None)

    # -- starting a pod ------------------------------------------------------------------------------

    def _node_of(self, pod: Mapping[str, Any]) -> str | None:
        spec = pod.get("spec", {})
        if spec.get("nodeName"):
            return str(spec["nodeName"])
        terms = (
            spec.get("affinity", {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", {})
        ).get("nodeSelectorTerms") or []
        for term in terms:
            for field_ in term.get("matchFields") or []:
                if field_.get("key") == "metadata.name" and field_.get("values"):
                    return str(field_["values"][0])
        return "emulated-node"  # no pin (the store): any node

    def _start(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        namespace, name = meta["namespace"], meta["name"]
        node = self._node_of(pod)
        if node is None or node in self.failed_nodes:
            return
        if node != "emulated-node" and self.api.get("Node", None, node) is None:
            return  # unschedulable: stays Pending, as the scheduler would leave it
        container = spec["containers"][0]
        image = container.get("image", "")
        if not _IMAGE_NAME.match(image):
            self._waiting(namespace, name, "InvalidImageName", f'Failed to apply default image tag "{image}"')
            return
        if image not in self.images:
            self._waiting(namespace, name, "ErrImagePull", f'failed to pull image "{image}": not found')
            return
        address = self._address((namespace, name))
        names = self._dns(namespace)
        pod_dir = self.root / "pods" / namespace / name
        pod_dir.mkdir(parents=True, exist_ok=True)
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        run_mounts, configmaps = self._mounts(container, volumes, pod_dir)
        if not self._run_init_containers(pod, volumes, pod_dir, names, address):
            return
        env = self._env(namespace, container, run_mounts, names)
        if env is None:
            self._waiting(namespace, name, "CreateContainerConfigError", "secret not found")
            return
        running = _Running(namespace, name, node, None, now_text(), run_mounts, configmaps, container["name"])  # type: ignore[arg-type]
        cms = {(namespace, cm): self.api.get("ConfigMap", namespace, cm) or {} for cm in set(configmaps.values())}
        self._refresh_volumes(running, cms, names=names)
        argv = [
            self._rewrite(part, run_mounts, names, address)
            for part in container.get("command", []) + container.get("args", [])
        ]
        if argv and argv[0] == "python":
            argv[0] = sys.executable  # the worker image's Python: this checkout's
        log_path = self.logs_dir / namespace / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        process = subprocess.Popen(
            argv,
            env=env,
            cwd=pod_dir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        running.process = process
        running.reader = threading.Thread(target=_copy_log, args=(process, log_path), daemon=True)
        running.reader.start()
        self.running[(namespace, name)] = running
        self._status(
            namespace,
            name,
            {
                "phase": "Running",
                "podIP": address,
                "hostIP": "127.0.0.1",
                "startTime": running.started_at,
                "containerStatuses": [
                    {
                        "name": container["name"],
                        "ready": True,
                        "restartCount": 0,
                        "image": image,
                        "state": {"running": {"startedAt": running.started_at}},
                    }
                ],
            },
        )

    def _mounts(
        self, container: Mapping[str, Any], volumes: Mapping[str, Any], pod_dir: Path
    ) -> tuple[dict[str, Path], dict[str, str]]:
        """mount path -> the volume's folder, and folder -> ConfigMap name for ConfigMap volumes."""
        mounts: dict[str, Path] = {}
        configmaps: dict[str, str] = {}
        for mount in container.get("volumeMounts") or []:
            volume = volumes.get(mount["name"], {})
            folder = pod_dir / "volumes" / mount["name"]
            folder.mkdir(parents=True, exist_ok=True)
            mounts[mount["mountPath"]] = folder
            if "configMap" in volume:
                configmaps[str(folder)] = volume["configMap"]["name"]
        return mounts, configmaps

    def _run_init_containers(
        self, pod: Mapping[str, Any], volumes: Mapping[str, Any], pod_dir: Path, names: Mapping[str, str], address: str
    ) -> bool:
        """Each init container to its end, in order (the pod stays Pending meanwhile); False when one
        failed, with the pod marked Failed and the init container's exit code, as the kubelet does under
        ``restartPolicy: Never``."""
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        for init in pod["spec"].get("initContainers") or []:
            mounts, _ = self._mounts(init, volumes, pod_dir)
            env = self._env(namespace, init, mounts, names)
            argv = [
                self._rewrite(part, mounts, names, address) for part in init.get("command", []) + init.get("args", [])
            ]
            if argv and argv[0] == "python":
                argv[0] = sys.executable
            started = now_text()
            done = subprocess.run(argv, env=env, cwd=pod_dir, capture_output=True, timeout=300, check=False)
            log = self.logs_dir / namespace / f"{name}.{init['name']}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_bytes(done.stdout + done.stderr)
            terminated = {
                "exitCode": done.returncode,
                "reason": "Completed" if done.returncode == 0 else "Error",
                "startedAt": started,
                "finishedAt": now_text(),
            }
            status = {
                "name": init["name"],
                "ready": done.returncode == 0,
                "restartCount": 0,
                "state": {"terminated": terminated},
            }
            if done.returncode != 0:
                self._waiting_pods.add((namespace, name))
                self._status(
                    namespace,
                    name,
                    {
                        "phase": "Failed",
                        "initContainerStatuses": [status],
                        "containerStatuses": [
                            {
                                "name": "rank",
                                "ready": False,
                                "restartCount": 0,
                                "state": {"waiting": {"reason": "PodInitializing"}},
                            }
                        ],
                    },
                )
                return False
        return True

    def _address(self, key: tuple[str, str]) -> str:
        if key not in self.addresses:
            self._next_address += 1
            n = self._next_address
            self.addresses[key] = f"127.{10 + n // 65536}.{(n // 256) % 256}.{n % 256 or 1}"
        return self.addresses[key]

    def _dns(self, namespace: str) -> dict[str, str]:
        """``<hostname>.<subdomain>`` of every pod in the namespace -> its address (given at first sight,
        as a pod's sandbox gets its IP before its containers start)."""
        names = {}
        for pod in self.api.request("GET", f"/api/v1/namespaces/{namespace}/pods").get("items") or []:
            spec = pod.get("spec", {})
            if spec.get("hostname") and spec.get("subdomain"):
                address = self._address((namespace, pod["metadata"]["name"]))
                names[f"{spec['hostname']}.{spec['subdomain']}"] = address
        return names

    def _env(
        self, namespace: str, container: Mapping[str, Any], mounts: Mapping[str, Path], names: Mapping[str, str]
    ) -> dict[str, str] | None:
        env = {
            "PATH": os.pathsep.join((str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin")),
            "HOME": "/tmp",
            "LANG": "C.UTF-8",
            "PYTHONPATH": str(_ROOT),  # the image's /app
            "GLOO_SOCKET_IFNAME": "lo",
            "OMP_NUM_THREADS": "1",
            **self.extra_env,
        }
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = self._rewrite(str(item["value"]), mounts, names, None)
            elif "secretKeyRef" in item.get("valueFrom", {}):
                ref = item["valueFrom"]["secretKeyRef"]
                secret = self.api.get("Secret", namespace, ref["name"])
                if secret is None or ref["key"] not in (secret.get("data") or {}):
                    return None
                env[item["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
        return env

    @staticmethod
    def _rewrite(text: str, mounts: Mapping[str, Path], names: Mapping[str, str], address: str | None) -> str:
        for mount, folder in mounts.items():
            text = text.replace(mount, str(folder))
        for name, ip in sorted(names.items(), key=lambda item: -len(item[0])):
            text = re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", ip, text)
        if address is not None and text == "0.0.0.0":  # noqa: S104
            return address
        return text

    def _refresh_volumes(
        self,
        run: _Running,
        configmaps: Mapping[tuple[str, str], Mapping[str, Any]],
        names: Mapping[str, str] | None = None,
    ) -> None:
        names = names if names is not None else self._dns(run.namespace)
        for folder, cm_name in run.configmaps.items():
            data = (configmaps.get((run.namespace, cm_name)) or {}).get("data") or {}
            for key, value in data.items():
                path = Path(folder) / key
                text = self._rewrite(str(value), run.mounts, names, None)
                if not path.exists() or path.read_text() != text:
                    tmp = path.with_suffix(path.suffix + ".tmp")
                    tmp.write_text(text)
                    tmp.replace(path)

    # -- ending a pod --------------------------------------------------------------------------------

    def _terminated(self, run: _Running, code: int, reason: str) -> dict[str, Any]:
        return {
            "name": run.container,
            "ready": False,
            "restartCount": 0,
            "state": {
                "terminated": {
                    "exitCode": code,
                    "reason": reason,
                    "startedAt": run.started_at,
                    "finishedAt": now_text(),
                }
            },
        }

    def _finish(self, key: tuple[str, str], run: _Running, returncode: int) -> None:
        if run.reader is not None:
            run.reader.join(timeout=5)
        code = 128 - returncode if returncode < 0 else returncode  # killed by signal N: 128 + N
        reason = "Completed" if code == 0 else "Error"
        self._status(
            key[0],
            key[1],
            {
                "phase": "Succeeded" if code == 0 else "Failed",
                "containerStatuses": [self._terminated(run, code, reason)],
            },
        )
        self.running.pop(key, None)

    def _terminate(self, key: tuple[str, str], run: _Running) -> None:
        self._kill(run, signal.SIGTERM)
        try:
            run.process.wait(timeout=self.grace_s)
        except subprocess.TimeoutExpired:
            self._kill(run, signal.SIGKILL)
            run.process.wait(timeout=10)
        with contextlib.suppress(ApiError):
            self.api.request("DELETE", f"/api/v1/namespaces/{key[0]}/pods/{key[1]}", body={"gracePeriodSeconds": 0})
        self.running.pop(key, None)

    @staticmethod
    def _kill(run: _Running, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(run.process.pid, signum)

    def _waiting(self, namespace: str, name: str, reason: str, message: str) -> None:
        if (namespace, name) in self._waiting_pods:
            return
        self._waiting_pods.add((namespace, name))
        self._status(
            namespace,
            name,
            {
                "phase": "Pending",
                "containerStatuses": [
                    {
                        "name": "rank",
                        "ready": False,
                        "restartCount": 0,
                        "state": {"waiting": {"reason": reason, "message": message}},
                    }
                ],
            },
        )

    def _status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        with contextlib.suppress(ApiError):  # deleted meanwhile
            self.api.request(
                "PATCH",
                f"/api/v1/namespaces/{namespace}/pods/{name}/status",
                body={"status": dict(status)},
                content_type="application/merge-patch+json",
            )


def _copy_log(process: subprocess.Popen[bytes], path: Path) -> None:
    """The container runtime's log: each line of the process's output after its time."""
    assert process.stdout is not None
    with path.open("a", encoding="utf-8") as out:
        for raw in iter(process.stdout.readline, b""):
            out.write(f"{now_text()} {raw.decode('utf-8', errors='replace').rstrip(chr(10))}\n")
            out.flush()
