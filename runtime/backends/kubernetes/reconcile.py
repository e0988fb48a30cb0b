"""The pods of Polychip's runs in one namespace, kept current by list-then-watch (a reconciler's cache).

It lists the pods Polychip manages, takes the list's resourceVersion and watches from there with
bookmarks (which move the version on when nothing of ours changes, so a resumed watch is cheap).
When the apiserver says the version is gone (410 Gone: compacted, or too old after a long
disconnection), or a watch breaks for any reason, it lists again and carries on from the new list:
the cache is the cluster's state, never a replay of events, so an event missed or seen twice changes
nothing. What the pods *mean* is ``observe``'s to decide, and every transition the control plane makes
from it is a claim (``jobs.transitions``), so observing twice is harmless too.

One thread per namespace; ``pods_of`` is what the backend's ``observe`` reads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from runtime.backends.kubernetes.api import Api, ApiError
from runtime.backends.kubernetes.manifests import LABEL_MANAGED, LABEL_RUN, MANAGER

log = logging.getLogger(__name__)

MANAGED_PODS = f"{LABEL_MANAGED}={MANAGER}"


class PodWatch:
    def __init__(
        self,
        api: Api,
        namespace: str,
        *,
        watch_timeout_s: int = 60,
        backoff_s: float = 1.0,
        sleep: Callable[[float], Any] = time.sleep,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.watch_timeout_s = watch_timeout_s
        self.backoff_s = backoff_s
        self._sleep = sleep
        self._lock = threading.Lock()
        self._pods: dict[str, dict[str, Any]] = {}
        self._runs: dict[str, set[str]] = {}  # run -> its pods' names
        self.resource_version = ""
        self.synced = threading.Event()
        self.lists = 0
        self.events = 0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # -- reading -----------------------------------------------------------------------------------

    def pods_of(self, run: str) -> list[dict[str, Any]] | None:
        """The run's pods as last seen, or None while the cache is not in step with the cluster."""
        if not self.synced.is_set():
            return None
        with self._lock:
            return [self._pods[name] for name in self._runs.get(run, ())]

    @property
    def relists(self) -> int:
        """Lists after the first: each a recovery from a lost or expired watch."""
        return max(0, self.lists - 1)

    def versions(self) -> dict[str, str]:
        """Each cached pod's resourceVersion, by name: what to compare with the cluster's."""
        with self._lock:
            return {name: str(pod["metadata"].get("resourceVersion", "")) for name, pod in self._pods.items()}

    def pod_count(self) -> int:
        with self._lock:
            return len(self._pods)

    # -- keeping current ---------------------------------------------------------------------------

    def relist(self) -> None:
        """Replace the cache by a fresh list and remember its version."""
        listing = self.api.list("Pod", self.namespace, labels=MANAGED_PODS)
        pods = {pod["metadata"]["name"]: pod for pod in listing.items}
        if self._stopping.is_set():
            return  # a list that ends after stop() must not make a dead cache look current
        with self._lock:
            self._pods = pods
            self._runs = {}
            for name, pod in pods.items():
                self._index(name, pod)
            self.resource_version = listing.resource_version
        self.lists += 1
        self.synced.set()

    def pump(self) -> str:
        """One watch from the cache's version until the server ends it. Returns why it ended: "timeout"
        (the server's, resume from the version), or "gone" (410: the version was compacted; the cache was
        listed again)."""
        for event in self.api.watch(
            "Pod",
            self.namespace,
            labels=MANAGED_PODS,
            resource_version=self.resource_version,
            timeout_s=self.watch_timeout_s,
        ):
            if self._stopping.is_set():
                return "stopped"
            kind = event.get("type")
            obj = event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    log.info("pod watch in %s: resourceVersion gone (410), listing again", self.namespace)
                    self.synced.clear()
                    self.relist()
                    return "gone"
                raise ApiError(int(obj.get("code") or 0), str(obj.get("message", "watch error")))
            self.apply(kind or "", obj)
        return "timeout"

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        """One watch event into the cache."""
        meta = obj.get("metadata") or {}
        version = meta.get("resourceVersion")
        with self._lock:
            if kind in ("ADDED", "MODIFIED") and meta.get("name"):
                self._pods[meta["name"]] = obj
                self._index(meta["name"], obj)
                self.events += 1
            elif kind == "DELETED" and meta.get("name"):
                gone = self._pods.pop(meta["name"], None)
                run = ((gone or obj).get("metadata", {}).get("labels") or {}).get(LABEL_RUN)
                if run in self._runs:
                    self._runs[run].discard(meta["name"])
                    if not self._runs[run]:
                        del self._runs[run]
                self.events += 1
            if version:
                self.resource_version = str(version)  # BOOKMARKs carry only this

    def _index(self, name: str, pod: dict[str, Any]) -> None:
        run = (pod.get("metadata", {}).get("labels") or {}).get(LABEL_RUN)
        if run:
            self._runs.setdefault(run, set()).add(name)

    def run(self) -> None:
        """List, then watch and resume, until ``stop``; any failure is followed by a fresh list."""
        while not self._stopping.is_set():
            try:
                if not self.synced.is_set():
                    self.relist()
                self.pump()
            except (ApiError, ValueError, OSError) as exc:
                log.warning("pod watch in %s broke (%s); listing again", self.namespace, exc)
                self.synced.clear()
                self._sleep(self.backoff_s)
            except Exception:  # a bug must not silently freeze the cache: it is no longer trusted
                log.exception("pod watch in %s failed; listing again", self.namespace)
                self.synced.clear()
                self._sleep(self.backoff_s)
        self.synced.clear()  # nobody keeps it current any more

    def start(self) -> PodWatch:
        if self._thread is None:
            self._thread = threading.Thread(target=self.run, name=f"pod-watch-{self.namespace}", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop after the current watch ends (at most ``watch_timeout_s``); the cache stays readable."""
        self._stopping.set()
        self.synced.clear()
