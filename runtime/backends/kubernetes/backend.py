"""The Kubernetes backend: each attempt of a job is a parent ConfigMap and the pods and objects it owns.

- ``sync_tenant``: the tenant's namespace and its guards (``manifests.tenant_objects``), created when
  missing and brought back to what they should be when changed: safe to call at every provision.
- ``provision``: the parent first, then its children with the parent's uid as their owner; a second
  call finds the parent (409) and makes only what is missing, so provisioning is idempotent per run.
- ``observe``: the run's pods from the namespace's reconciler cache (``reconcile.PodWatch``); when the
  cache lacks a pod of the run it does not guess: a fresh list and a read of the parent decide
  (a pod created a moment ago, or one that is really gone). ``observe.observation_of`` says what they mean.
- ``teardown``: one delete of the parent (the garbage collector takes the rest), after keeping, in the
  run's folder under ``runs_dir`` (shared by the control plane's processes), each rank's output (the
  pods' logs go with the pods) and the run's last observation; then it waits for the pods to be gone,
  so that the next attempt never runs beside this one. A run torn down is observed as it ended, as on
  the local backend: a second observer racing the one that tore it down sees the same news.
- ``request_stop``: a ``control.json`` key in the parent, which the kubelet writes into every rank's
  mounted config folder; the ranks look for it every step (on a real cluster the kubelet refreshes
  ConfigMap volumes every minute or so: a stop takes that long to arrive).
- ``logs``: through the pods' log API (``timestamps=true``), numbered per rank from the first line the
  kubelet still holds; after teardown from the kept copy.

Handles: ``{"backend": "kubernetes", "namespace", "run", "world_size", "container"}``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import threading
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from runtime.backends.base import (
    BackendUnavailable,
    Failure,
    LaunchRequest,
    LogLine,
    LogPage,
    Observation,
    Phase,
    RankState,
)
from runtime.backends.kubernetes.api import Api, ApiError
from runtime.backends.kubernetes.inventory import ClusterInventory, read_inventory
from runtime.backends.kubernetes.manifests import (
    CODE_DIR,
    CONFIG_DIR,
    LABEL_ROLE,
    LABEL_RUN,
    ClusterConfig,
    run_children,
    run_parent,
    tenant_namespace,
    tenant_objects,
)
from runtime.backends.kubernetes.observe import observation_of, rank_of
from runtime.backends.kubernetes.reconcile import PodWatch
from runtime.backends.launch import check_request, worker_configs
from runtime.comm.link import LinkEmulation
from runtime.inventory import Pool

CONTROL_KEY = "control.json"
TENANT_SYNC_S = 300.0  # a tenant synced this recently, to the same objects, is not read again
RBAC_SETTLE_S = 10.0  # how long a 403 right after a namespace's RoleBinding is made may last
FINAL_FILE = "final.json"
# Service names are DNS-1035 labels (63 at most), and pods add "-store" or "-r<rank>" to the run's name.
_RUN_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,48}[a-z0-9])?$")


class KubernetesBackend:
    name = "kubernetes"
    # How long a preempted run gets to checkpoint and stop before it is torn down: the kubelet writes the
    # stop into the ranks' ConfigMap volume within its sync period and cache TTL (up to about 2 minutes).
    stop_window_s = 150.0

    def __init__(
        self,
        api: Api,
        config: ClusterConfig,
        runs_dir: str | Path,
        *,
        telemetry_base: str | None = None,
        collective_timeout_s: float = 30.0,
        force_after_s: float = 45.0,
        watch: bool = True,
        watch_timeout_s: int = 60,
    ) -> None:
        """``telemetry_base``: the control plane's address as the ranks reach it inside the cluster (the
        web Service, ``http://polychip-web.<namespace>.svc``), which replaces the scheme and host
        of the request's public telemetry URL; None keeps that URL. ``force_after_s``: how long teardown
        waits for the run's pods to end before it force-deletes those left (pods of a node that died stay
        terminating for ever: no kubelet confirms their end). ``runs_dir``: where each run's output
        and last observation are kept at teardown. ``watch``: keep a reconciler cache
        per namespace (a thread each); off, every ``observe`` lists."""
        self.api = api
        self.config = config
        self.runs_dir = Path(runs_dir)
        self.telemetry_base = telemetry_base
        self.collective_timeout_s = collective_timeout_s
        self.force_after_s = force_after_s
        self.watch = watch
        self.watch_timeout_s = watch_timeout_s
        self._watches: dict[str, PodWatch] = {}
        self._tenants: dict[str, tuple[str, float]] = {}  # slug -> (what was synced, when)
        self._lock = threading.Lock()

    # -- tenants -----------------------------------------------------------------------------------

    def sync_tenant(self, tenant_slug: str, flavor_limits: Mapping[str, int]) -> str:
        """Make the tenant's namespace and its guards what they should be; returns the namespace.
        ``flavor_limits``: the most devices of each flavor its pods may hold at once, summed here over the
        flavors that share an extended resource (its ResourceQuota); flavors the cluster lacks are left out.

        Each object is read, made when missing, and patched only in the fields Polychip sets when they
        differ (others' additions, such as an image pull secret on the service account or a Pod
        Security label on the namespace, stay). The same sync within ``TENANT_SYNC_S`` is skipped."""
        device_limits: dict[str, int] = {}
        for flavor, most in sorted(flavor_limits.items()):
            if (resource := self.config.resources.get(flavor)) is not None:
                device_limits[resource] = device_limits.get(resource, 0) + most
        objects = tenant_objects(self.config, tenant_slug, device_limits)
        namespace = str(objects[0]["metadata"]["name"])
        digest = json.dumps(objects, sort_keys=True)
        with self._lock:
            done = self._tenants.get(tenant_slug)
        if done is not None and done[0] == digest and time.monotonic() - done[1] < TENANT_SYNC_S:
            return namespace
        try:
            for obj in objects:
                self._ensure(obj)
        except ApiError as exc:
            if _transient(exc):
                raise BackendUnavailable(f"the cluster's apiserver: {exc}") from None
            raise
        with self._lock:
            self._tenants[tenant_slug] = (digest, time.monotonic())
        return namespace

    def _ensure(self, obj: Mapping[str, Any]) -> None:
        meta = obj["metadata"]
        current = self.api.get(obj["kind"], meta.get("namespace"), meta["name"])
        if current is None:
            deadline = time.monotonic() + RBAC_SETTLE_S
            while True:
                try:
                    self.api.create(obj)
                    return
                except ApiError as exc:
                    # Right after the namespace's RoleBinding is made, the authorizer may not know it yet.
                    if exc.status != 403 or not meta.get("namespace") or time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
        patch = _patch_towards(obj, current)
        if patch:
            self.api.patch(obj["kind"], meta.get("namespace"), meta["name"], patch)

    # -- inventory ---------------------------------------------------------------------------------

    def read_inventory(self, pool: Pool) -> ClusterInventory:
        """The pool file's flavors with the cluster's nodes as they are now (``inventory.read_inventory``)."""
        return read_inventory(self.api.list("Node", None).items, pool)

    # -- provision ---------------------------------------------------------------------------------

    def provision(self, request: LaunchRequest) -> dict[str, Any]:
        check_request(request)
        run = request.job_id
        if not _RUN_NAME.match(run):
            raise ValueError(
                f"job_id {run!r}: on Kubernetes a run's name must be a DNS label of at most 50 characters "
                "(lowercase letters, digits and dashes, starting with a letter)"
            )
        namespace = tenant_namespace(self.config, request.tenant or "default")
        code_dir = CODE_DIR if request.workload.kind in ("python", "torchrun") else None
        configs = worker_configs(
            request,
            master_addr=f"store.{run}",  # the store pod's name under the run's headless Service
            master_port=self.config.store_port,
            link=LinkEmulation(),  # a cluster's links are real: nothing to emulate
            collective_timeout_s=self.collective_timeout_s,
            telemetry_url=self._telemetry_url(request.telemetry_url),
            files=lambda rank: {"control_file": f"{CONFIG_DIR}/{CONTROL_KEY}", "code_dir": code_dir},
        )
        parent = run_parent(request, namespace, configs)
        bundle_url = self._telemetry_url(request.bundle_url)
        try:
            self._make_run(request, namespace, parent, bundle_url)
        except ApiError as exc:
            # Nothing half-made stays behind: the parent's delete takes whatever children were made.
            with contextlib.suppress(ApiError):
                self.api.delete("ConfigMap", namespace, run)
            if _transient(exc):
                raise BackendUnavailable(f"the cluster's apiserver: {exc}") from None
            raise
        return {
            "backend": self.name,
            "namespace": namespace,
            "run": run,
            "world_size": len(request.placements),
            "container": request.workload.kind == "container",
        }

    def _make_run(self, request: LaunchRequest, namespace: str, parent: dict[str, Any], bundle_url: str | None) -> None:
        """The parent, then its children with its uid; what an earlier call made (409) is kept."""
        run = request.job_id
        try:
            made = self.api.create(parent)
        except ApiError as exc:
            if exc.status != 409:
                raise
            found = self.api.get("ConfigMap", namespace, run)
            if found is None:  # deleted between the two calls: a teardown won
                raise RuntimeError(f"run {run} was torn down while it was being provisioned") from None
            made = found
        for child in run_children(self.config, request, namespace, made["metadata"]["uid"], bundle_url=bundle_url):
            try:
                self.api.create(child)
            except ApiError as exc:
                if exc.status != 409:  # made by an earlier call for the same run
                    raise

    def _telemetry_url(self, url: str | None) -> str | None:
        if url is None or not self.telemetry_base:
            return url
        base = urlsplit(self.telemetry_base)
        public = urlsplit(url)
        return urlunsplit((base.scheme, base.netloc, public.path, public.query, ""))

    # -- observe -----------------------------------------------------------------------------------

    def watch_for(self, namespace: str) -> PodWatch:
        with self._lock:
            found = self._watches.get(namespace)
            if found is None:
                found = PodWatch(self.api, namespace, watch_timeout_s=self.watch_timeout_s)
                self._watches[namespace] = found
                if self.watch:
                    found.start()
            return found

    def observe(self, handle: dict[str, Any]) -> Observation:
        namespace, run, world_size = self._parts(handle)
        pods = self.watch_for(namespace).pods_of(run) if self.watch else None
        parent_exists = True
        if pods is None or not _complete(pods, world_size):
            # Not in the cache: made a moment ago, or really gone. A fresh read decides.
            pods = self._run_pods(namespace, run)
            parent_exists = self.api.get("ConfigMap", namespace, run) is not None
            if not parent_exists and (kept := self._final(run)) is not None:
                return kept
        return observation_of(
            pods,
            world_size,
            now=time.time(),
            parent_exists=parent_exists,
            polychip_exit_codes=not handle.get("container", False),
        )

    # -- stop and teardown -------------------------------------------------------------------------

    def request_stop(self, handle: dict[str, Any], reason: str) -> None:
        namespace, run, _ = self._parts(handle)
        order = {"action": "stop", "reason": reason, "at": time.time()}
        try:
            self.api.patch("ConfigMap", namespace, run, {"data": {CONTROL_KEY: json.dumps(order)}})
        except ApiError as exc:
            if exc.status != 404:  # a run already gone has nothing to stop
                raise

    def teardown(self, handle: dict[str, Any]) -> None:
        namespace, run, world_size = self._parts(handle)
        pods = self._run_pods(namespace, run)
        parent_exists = self.api.get("ConfigMap", namespace, run) is not None
        if parent_exists:
            self._keep_logs(run, namespace, pods)
            last = observation_of(
                pods, world_size, now=time.time(), polychip_exit_codes=not handle.get("container", False)
            )
            if last.phase not in (Phase.SUCCEEDED, Phase.FAILED, Phase.STOPPED):
                # Ended by this teardown (a failure seen while the rest still ran keeps its cause).
                last = dataclasses.replace(
                    last, phase=Phase.FAILED, reason=last.reason if last.failure else "torn down"
                )
            self._keep_final(run, last)
            self.api.delete("ConfigMap", namespace, run)
        pods = self._wait_gone(namespace, run, pods, self.force_after_s)
        if pods:
            # What is left runs nowhere any more, or will be killed by its kubelet all the same.
            for pod in pods:
                self.api.delete("Pod", namespace, pod["metadata"]["name"], grace_period_s=0)
            pods = self._wait_gone(namespace, run, pods, 10.0)
        if pods:
            names = ", ".join(sorted(p["metadata"]["name"] for p in pods))
            raise RuntimeError(f"run {run}: pods still there after a forced delete: {names}")

    def _run_pods(self, namespace: str, run: str) -> list[dict[str, Any]]:
        return self.api.list("Pod", namespace, labels=f"{LABEL_RUN}={run}").items

    def _wait_gone(self, namespace: str, run: str, pods: list[dict[str, Any]], wait_s: float) -> list[dict[str, Any]]:
        """The run's pods still there after waiting up to ``wait_s`` for none (polled with a backoff)."""
        deadline = time.monotonic() + wait_s
        pause = 0.1
        while pods and time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(pause * 2, 2.0)
            pods = self._run_pods(namespace, run)
        return pods

    def _keep_logs(self, run: str, namespace: str, pods: list[dict[str, Any]]) -> None:
        folder = self.runs_dir / run
        for pod in pods:
            rank = rank_of(pod)
            if rank is None:
                continue
            try:
                text = self.api.log(namespace, pod["metadata"]["name"])
            except ApiError:
                continue  # a pod that never ran has no log
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"rank{rank}.log").write_text(text)

    def _keep_final(self, run: str, observation: Observation) -> None:
        folder = self.runs_dir / run
        folder.mkdir(parents=True, exist_ok=True)
        data = {
            "phase": observation.phase.value,
            "reason": observation.reason,
            "ranks": [dataclasses.asdict(r) for r in observation.ranks],
            "failures": [dataclasses.asdict(f) for f in observation.failures],
        }
        tmp = folder / f".{FINAL_FILE}.tmp"
        tmp.write_text(json.dumps(data))
        tmp.replace(folder / FINAL_FILE)

    def _final(self, run: str) -> Observation | None:
        """The run's last observation, kept at its teardown."""
        try:
            data = json.loads((self.runs_dir / run / FINAL_FILE).read_text())
            failures = tuple(Failure(**f) for f in data["failures"])
            return Observation(
                phase=Phase(data["phase"]),
                ranks=tuple(RankState(**r) for r in data["ranks"]),
                reason=str(data["reason"]),
                failure=failures[0] if failures else None,
                failures=failures,
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    # -- logs --------------------------------------------------------------------------------------

    def logs(
        self,
        handle: dict[str, Any],
        *,
        rank: int | None = None,
        since: str | float | None = None,
        limit: int = 1000,
        tail: int | None = None,
    ) -> LogPage:
        if limit < 1 or (tail is not None and tail < 0):
            raise ValueError("limit must be >= 1 and tail >= 0")
        namespace, run, world_size = self._parts(handle)
        positions = _decode_cursor(since) if isinstance(since, str) else {}
        since_time = float(since) if isinstance(since, int | float) else None
        ranks = [rank] if rank is not None else list(range(world_size))
        texts = self._log_texts(namespace, run, ranks)
        lines: list[LogLine] = []
        ends: dict[int, int] = {}
        for r, text in texts.items():
            numbered = _parse_log(r, text)
            ends[r] = len(numbered)
            start = positions.get(r, 0)
            lines.extend(line for line in numbered[start:] if since_time is None or line.time >= since_time)
        lines.sort(key=lambda line: (line.time, line.rank, line.number))
        if tail is not None:
            taken = lines[max(0, len(lines) - tail) :] if tail else []
            return LogPage(tuple(taken), _encode_cursor({**positions, **ends}))
        taken = lines[:limit]
        cursor = dict(positions)
        for line in taken:
            cursor[line.rank] = line.number + 1
        return LogPage(tuple(taken), _encode_cursor(cursor), more=len(lines) > limit)

    def _log_texts(self, namespace: str, run: str, ranks: list[int]) -> dict[int, str]:
        texts: dict[int, str] = {}
        kept = self.runs_dir / run
        for r in ranks:
            try:
                texts[r] = self.api.log(namespace, f"{run}-r{r}")
                continue
            except ApiError as exc:
                if exc.status not in (400, 404):  # 400: the container has not started yet
                    raise
            path = kept / f"rank{r}.log"
            texts[r] = path.read_text() if path.exists() else ""
        return texts

    # -- helpers -----------------------------------------------------------------------------------

    def _parts(self, handle: dict[str, Any]) -> tuple[str, str, int]:
        if handle.get("backend") != self.name or not all(
            isinstance(handle.get(key), str) for key in ("namespace", "run")
        ):
            raise ValueError(f"not a kubernetes backend handle: {handle!r}")
        return handle["namespace"], handle["run"], int(handle.get("world_size", 0))

    def close(self) -> None:
        for watch in self._watches.values():
            watch.stop()


def _transient(exc: ApiError) -> bool:
    """Not reached, overloaded, or failing on its side: worth trying again later."""
    return exc.status == 0 or exc.status == 429 or exc.status >= 500


def _patch_towards(desired: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """A merge patch that makes ``current`` hold ``desired``'s fields (the labels given, and each other
    top-level field whole); empty when it already does. Fields only ``current`` has are left alone."""
    patch: dict[str, Any] = {}
    labels = {
        key: value
        for key, value in (desired.get("metadata", {}).get("labels") or {}).items()
        if (current.get("metadata", {}).get("labels") or {}).get(key) != value
    }
    if labels:
        patch["metadata"] = {"labels": labels}
    for key, value in desired.items():
        if key in ("apiVersion", "kind", "metadata", "status") or current.get(key) == value:
            continue
        patch[key] = _replacing(value, current.get(key))
    return patch


def _replacing(desired: Any, current: Any) -> Any:
    """``desired`` as a merge patch over ``current``: keys only ``current`` has are removed (null)."""
    if isinstance(desired, dict) and isinstance(current, dict):
        merged = {key: _replacing(value, current.get(key)) for key, value in desired.items()}
        merged.update({key: None for key in current if key not in desired})
        return merged
    return desired


def _complete(pods: list[dict[str, Any]], world_size: int) -> bool:
    """Whether the cache holds every pod of the run: its store and each rank."""
    roles = [(p.get("metadata", {}).get("labels") or {}).get(LABEL_ROLE) for p in pods]
    return roles.count("store") == 1 and roles.count("rank") == world_size


def _parse_log(rank: int, text: str) -> list[LogLine]:
    """The kubelet's ``timestamps=true`` output: each line after its RFC 3339 time and a space."""
    lines = []
    for number, raw in enumerate(text.splitlines()):
        stamp, _, rest = raw.partition(" ")
        try:
            at = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        except ValueError:  # not the kubelet's format: keep the line whole, untimed
            at, rest = 0.0, raw
        lines.append(LogLine(rank=rank, number=number, time=at, stream="out", text=rest))
    return lines


def _encode_cursor(positions: Mapping[int, int]) -> str:
    return "k" + "_".join(f"{rank}.{number}" for rank, number in sorted(positions.items()))


def _decode_cursor(cursor: str) -> dict[int, int]:
    if not cursor.startswith("k"):
        raise ValueError("not a log cursor (use the cursor a previous read returned)")
    positions = {}
    for part in filter(None, cursor[1:].split("_")):
        rank, _, number = part.partition(".")
        if not rank.isdigit() or not number.isdigit():
            raise ValueError(f"not a log cursor: {part!r} (use the cursor a previous read returned)")
        positions[int(rank)] = int(number)
    return positions
