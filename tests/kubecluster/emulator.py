"""An emulated Kubernetes apiserver over real HTTP, for the Kubernetes backend's tests and bench.

No cluster can run here, so the backend meets an emulator: kmock 0.8's ``KubernetesScaffold`` serves
HTTP (aiohttp), parses each request into Kubernetes terms (resource, namespace, name, subresource,
action) and renders errors as ``Status`` objects; the object store is this module's, because kmock's
own emulator lacks what the backend depends on. Each gap, and what stands in for it here:

- created objects get no ``metadata.uid``, ``resourceVersion`` or ``creationTimestamp``: given here, with
  one resourceVersion counter for the whole store, as etcd's revision is;
- list answers ``resourceVersion: "..."`` and watches replay every object from the start, ignoring the
  version asked for: lists carry the store's version, watches send what changed after it, and a version
  older than the last compaction gets ``410 Gone`` (``compact`` injects one, as etcd's compaction does);
- no bookmarks: a ``BOOKMARK`` every ``bookmark_s`` on watches that ask for them;
- ``labelSelector`` is ignored: equality, inequality and existence selectors are applied;
- namespace creation answers 500, ``PUT`` answers 404, objects are created without their namespace from
  the URL, and nothing checks that the namespace exists: all done here as the apiserver does;
- no garbage collector: deleting an object deletes what names it in ``ownerReferences`` (background
  propagation), and deleting a namespace deletes what is in it;
- pods are deleted at once: here a pod that a node agent runs is only marked (``deletionTimestamp``),
  and is removed when the agent has stopped its process and deletes it with ``gracePeriodSeconds: 0``;
- Secrets' ``stringData`` is not folded into ``data``: it is, base64 as the apiserver does;
- ``pods/log`` answers the pod object: here it serves what the node agent wrote (``timestamps``,
  ``tailLines``).

- no authorization: RBAC is enforced here for the control plane's token (``kubeconfig``) with the
  ClusterRoles and bindings of ``deploy/kubernetes/base/rbac.yaml`` and the RoleBindings in the store,
  as the RBAC authorizer does (verbs from the method, subresources, resourceNames, the "bind" check on
  RoleBindings); the admin token (``admin_kubeconfig``: the node agent's) may do anything.

What stays unemulated: admission (quotas, limit ranges, network policies are stored, not enforced),
scheduling (pods say their node; the agent runs them), Roles (only ClusterRoles are bound here),
aggregated roles, strategic merge patch (merge patch only), and field selectors.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import logging
import re
import threading
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import yaml
from kmock import KubernetesScaffold, Server
from kmock._internal.k8s import KubernetesError, KubernetesObjectConflictError, KubernetesObjectNotFoundError

RBAC_FILE = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "base" / "rbac.yaml"

# A line per request would drown what the tests print.
logging.getLogger("aiohttp.access").setLevel(logging.WARNING)

# plural -> (kind, namespaced), for what the backend and the agent use
RESOURCES = {
    "namespaces": ("Namespace", False),
    "nodes": ("Node", False),
    "configmaps": ("ConfigMap", True),
    "secrets": ("Secret", True),
    "services": ("Service", True),
    "pods": ("Pod", True),
    "serviceaccounts": ("ServiceAccount", True),
    "resourcequotas": ("ResourceQuota", True),
    "limitranges": ("LimitRange", True),
    "networkpolicies": ("NetworkPolicy", True),
    "rolebindings": ("RoleBinding", True),
    "clusterroles": ("ClusterRole", False),
    "clusterrolebindings": ("ClusterRoleBinding", False),
}

Key = tuple[str, str, str]  # (plural, namespace or "", name)
GROUPS = {
    "networkpolicies": "networking.k8s.io",
    "rolebindings": "rbac.authorization.k8s.io",
    "clusterroles": "rbac.authorization.k8s.io",
    "clusterrolebindings": "rbac.authorization.k8s.io",
}
ADMIN_TOKEN = "emulated-admin"  # the node agent's and the tests' own: every right
CONTROL_PLANE_TOKEN = "emulated-control-plane"  # the control plane's service account, as deploy/ binds it
CONTROL_PLANE_ACCOUNT = ("polychip", "polychip-control-plane")


def now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def selector_matches(selector: str, labels: Mapping[str, str]) -> bool:
    """Equality (``a=b``, ``a==b``), inequality (``a!=b``) and existence (``a``, ``!a``) terms, all to hold."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class GoneError(KubernetesError):
    pass


@attrs.define(kw_only=True)
class EmulatedCluster(KubernetesScaffold):
    logs_dir: Path = attrs.field(factory=lambda: Path("."))
    bookmark_s: float = 1.0
    # Pods deleted while running are only marked, for a node agent to stop and remove (off: removed at once).
    graceful_pods: bool = True

    _store: dict[Key, dict[str, Any]] = attrs.field(factory=dict, init=False)
    _events: list[tuple[int, Key, dict[str, Any]]] = attrs.field(factory=list, init=False)
    _version: int = attrs.field(default=0, init=False)
    _compacted: int = attrs.field(default=0, init=False)
    _drops: int = attrs.field(default=0, init=False)  # bumped to end every open watch
    _mutex: threading.RLock = attrs.field(factory=threading.RLock, init=False)
    _changed: asyncio.Event | None = attrs.field(default=None, init=False)
    _loop: asyncio.AbstractEventLoop | None = attrs.field(default=None, init=False)
    # Every pod ever created, as created (the bench reads creation times after the pods are gone).
    pods_made: list[dict[str, Any]] = attrs.field(factory=list, init=False)
    # Requests are authorized as the apiserver's RBAC authorizer does, with the ClusterRoles, bindings
    # and RoleBindings in the store (the tests load deploy/kubernetes/base/rbac.yaml); off: anyone may.
    rbac: bool = False
    denied: list[str] = attrs.field(factory=list, init=False)
    watches_served: int = attrs.field(default=0, init=False)
    gone_answers: int = attrs.field(default=0, init=False)

    # -- the store, callable from any thread ---------------------------------------------------------

    def objects(self, plural: str | None = None, namespace: str | None = None) -> list[dict[str, Any]]:
        with self._mutex:
            return [
                copy.deepcopy(obj)
                for (p, ns, _), obj in self._store.items()
                if (plural is None or p == plural) and (namespace is None or ns == namespace)
            ]

    def put(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create an object as a client would (``add_node`` and the tests' own setup)."""
        with self._mutex:
            return self._create(plural, obj.get("metadata", {}).get("namespace") or "", obj)

    def set_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        """What a kubelet's status update does (merged into the pod's status)."""
        with self._mutex:
            return self._update(("pods", namespace, name), {"status": status}, replace=False, subresource="status")

    def set_node_conditions(self, name: str, conditions: list[dict[str, Any]]) -> dict[str, Any]:
        """What the node's kubelet (or the node controller, for a silent node) reports."""
        with self._mutex:
            return self._update(
                ("nodes", "", name), {"status": {"conditions": conditions}}, replace=False, subresource="status"
            )

    def compact(self, *, drop_watches: bool = True) -> int:
        """etcd's compaction: every version so far is gone, so a watch resumed from any of them gets 410;
        ``drop_watches`` also ends the open watches, as an apiserver restart does."""
        with self._mutex:
            self._compacted = self._version + 1
            self._events.clear()
            if drop_watches:
                self._drops += 1
            self._wake()
            return self._compacted

    @property
    def version(self) -> int:
        return self._version

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    def _record(self, key: Key, kind: str, obj: dict[str, Any]) -> None:
        self._events.append((self._version, key, {"type": kind, "object": copy.deepcopy(obj)}))
        self._wake()

    def _wake(self) -> None:
        loop, changed = self._loop, self._changed
        if loop is not None and changed is not None:
            loop.call_soon_threadsafe(changed.set)

    def _create(self, plural: str, namespace: str, body: Any) -> dict[str, Any]:
        if plural not in RESOURCES or not isinstance(body, dict):
            raise KubernetesError(status=400, reason="BadRequest", message=f"cannot create {plural}")
        kind, namespaced = RESOURCES[plural]
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise KubernetesError(status=422, reason="Invalid", message="metadata.name: Required value")
        if namespaced:
            namespace = namespace or meta.get("namespace") or ""
            if ("namespaces", "", namespace) not in self._store:
                raise KubernetesError(status=404, reason="NotFound", message=f'namespaces "{namespace}" not found')
            meta["namespace"] = namespace
        else:
            namespace = ""
        key = (plural, namespace, name)
        if key in self._store:
            raise KubernetesObjectConflictError(reason="AlreadyExists", message=f'{plural} "{name}" already exists')
        obj.setdefault("apiVersion", "v1")
        obj["kind"] = kind
        meta.update(
            {"uid": str(uuid.uuid4()), "creationTimestamp": now_text(), "resourceVersion": self._next_version()}
        )
        if kind == "Secret" and isinstance(obj.get("stringData"), dict):
            data = obj.setdefault("data", {})
            for k, v in obj.pop("stringData").items():
                data[k] = base64.b64encode(str(v).encode()).decode()
        if kind == "Pod":
            obj.setdefault("status", {"phase": "Pending"})
        if kind == "Namespace":
            obj["status"] = {"phase": "Active"}
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = name
        self._store[key] = obj
        if kind == "Pod":
            self.pods_made.append(copy.deepcopy(obj))
        self._record(key, "ADDED", obj)
        return copy.deepcopy(obj)

    def _update(self, key: Key, body: Any, *, replace: bool, subresource: str | None) -> dict[str, Any]:
        current = self._store.get(key)
        if current is None:
            raise KubernetesObjectNotFoundError(reason="NotFound", message=f'{key[0]} "{key[2]}" not found')
        if not isinstance(body, dict):
            raise KubernetesError(status=400, reason="BadRequest", message="the body is not an object")
        if subresource == "status":
            updated = merge_patch(current, {"status": body.get("status")}) if "status" in body else current
        elif replace:
            updated = {**copy.deepcopy(body), "metadata": {**body.get("metadata", {}), **_system_meta(current)}}
        else:
            updated = merge_patch(current, body)
            updated["metadata"] = {**updated.get("metadata", {}), **_system_meta(current)}
        updated["metadata"]["resourceVersion"] = self._next_version()
        self._store[key] = updated
        self._record(key, "MODIFIED", updated)
        return copy.deepcopy(updated)

    def delete(self, key: Key, *, grace_period_s: int | None = None) -> dict[str, Any]:
        """Delete the object and, as the garbage collector does in the background, what it owns."""
        with self._mutex:
            obj = self._store.get(key)
            if obj is None:
                raise KubernetesObjectNotFoundError(reason="NotFound", message=f'{key[0]} "{key[2]}" not found')
            plural = key[0]
            running = plural == "pods" and obj.get("status", {}).get("phase") in ("Running",)
            if running and self.graceful_pods and grace_period_s != 0:
                if not obj["metadata"].get("deletionTimestamp"):
                    obj["metadata"]["deletionTimestamp"] = now_text()
                    obj["metadata"]["deletionGracePeriodSeconds"] = 30 if grace_period_s is None else grace_period_s
                    obj["metadata"]["resourceVersion"] = self._next_version()
                    self._record(key, "MODIFIED", obj)
                return copy.deepcopy(obj)
            del self._store[key]
            obj["metadata"]["resourceVersion"] = self._next_version()
            self._record(key, "DELETED", obj)
            uid = obj["metadata"].get("uid")
            owned = [
                k
                for k, o in self._store.items()
                if any(ref.get("uid") == uid for ref in o.get("metadata", {}).get("ownerReferences") or [])
                or (plural == "namespaces" and k[1] == key[2])
            ]
            for k in owned:
                if k in self._store:
                    self.delete(k)
            return copy.deepcopy(obj)

    def _list(self, plural: str, namespace: str | None, selector: str) -> dict[str, Any]:
        items = [
            copy.deepcopy(obj)
            for (p, ns, _), obj in sorted(self._store.items())
            if p == plural
            and (namespace is None or ns == namespace)
            and selector_matches(selector, obj.get("metadata", {}).get("labels") or {})
        ]
        kind = RESOURCES.get(plural, ("", False))[0]
        return {
            "apiVersion": "v1",
            "kind": f"{kind}List",
            "metadata": {"resourceVersion": str(self._version)},
            "items": items,
        }

    def _changes_after(
        self, version: int, plural: str, namespace: str | None, selector: str
    ) -> Iterator[tuple[int, dict[str, Any]]]:
        for at, (p, ns, _), event in self._events:
            if at <= version or p != plural or (namespace is not None and ns != namespace):
                continue
            if selector_matches(selector, event["object"].get("metadata", {}).get("labels") or {}):
                yield at, event

    # -- HTTP ------------------------------------------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        # kmock's URL parser fails on /api/v1/namespaces (an IndexError, answered 500) and reads
        # /api/v1/namespaces/NAME as a namespace, not a Namespace object: those paths are served here.
        match = re.fullmatch(r"/api/v1/namespaces(?:/([^/]+))?/?", raw_request.path)
        if match is None:
            return await super().__call__(raw_request)
        body = await raw_request.read()
        try:
            data = json.loads(body) if body else None
            return await self._serve(
                raw_request.method.upper(),
                "namespaces",
                None,
                match.group(1),
                None,
                dict(raw_request.query),
                data,
                raw_request,
                raw_request.headers.get("Authorization", ""),
            )
        except KubernetesError as exc:
            return await self._render_error(exc)

    async def _handle(self, request: Any) -> aiohttp.web.StreamResponse:
        resource = request.resource
        plural = getattr(resource, "plural", None)
        if resource is None or plural not in RESOURCES:
            return await super()._handle(request)
        method = str(getattr(request.method, "value", request.method)).upper()
        return await self._serve(
            method,
            plural,
            request.namespace,
            request.name,
            request.subresource,
            dict(request.params),
            request.data,
            request._raw_request,
            dict(request.headers).get("Authorization", ""),
        )

    async def _serve(
        self,
        method: str,
        plural: str,
        namespace: str | None,
        name: str | None,
        subresource: str | None,
        params: dict[str, str],
        data: Any,
        raw_request: aiohttp.web.BaseRequest,
        authorization: str = "",
    ) -> aiohttp.web.StreamResponse:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._changed = asyncio.Event()
        if self.rbac:
            with self._mutex:
                self._authorize(authorization, method, plural, namespace, name, subresource, params, data)
        if method == "GET" and params.get("watch") in ("true", "1"):
            return await self._watch(raw_request, plural, namespace, params)
        with self._mutex:
            if method == "POST":
                return _json(self._create(plural, namespace or "", data), 201)
            if name is None:
                if method == "GET":
                    return _json(self._list(plural, namespace, params.get("labelSelector", "")))
                raise KubernetesError(status=405, reason="MethodNotAllowed", message=f"{method} on a collection")
            key: Key = (plural, namespace or "", name)
            if method == "GET":
                if subresource == "log":
                    return self._log(key, params)
                obj = self._store.get(key)
                if obj is None:
                    raise KubernetesObjectNotFoundError(reason="NotFound", message=f'{plural} "{name}" not found')
                return _json(copy.deepcopy(obj))
            if method in ("PATCH", "PUT"):
                return _json(self._update(key, data, replace=method == "PUT", subresource=subresource))
            if method == "DELETE":
                options = data if isinstance(data, dict) else {}
                grace = options.get("gracePeriodSeconds", params.get("gracePeriodSeconds"))
                return _json(self.delete(key, grace_period_s=None if grace is None else int(grace)))
        raise KubernetesError(status=405, reason="MethodNotAllowed", message=method)

    # -- RBAC --------------------------------------------------------------------------------------------

    def _authorize(
        self,
        authorization: str,
        method: str,
        plural: str,
        namespace: str | None,
        name: str | None,
        subresource: str | None,
        params: Mapping[str, str],
        data: Any,
    ) -> None:
        token = authorization.removeprefix("Bearer ").strip()
        if token == ADMIN_TOKEN:
            return
        if token != CONTROL_PLANE_TOKEN:
            raise KubernetesError(status=401, reason="Unauthorized", message="Unauthorized")
        if method == "GET":
            verb = "watch" if params.get("watch") in ("true", "1") else ("get" if name else "list")
        else:
            verb = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}.get(method, method.lower())
        if plural == "namespaces" and verb == "create":
            name = None
        resource = f"{plural}/{subresource}" if subresource else plural
        group = GROUPS.get(plural, "")
        rules = self._rules(CONTROL_PLANE_ACCOUNT, namespace if plural != "namespaces" else None)
        allowed = _allows(rules, verb, group, resource, name)
        if allowed and plural == "rolebindings" and verb in ("create", "update", "patch") and isinstance(data, dict):
            # Escalation check: binding a role needs "bind" on it (or every right it grants).
            role = (data.get("roleRef") or {}).get("name")
            allowed = _allows(rules, "bind", "rbac.authorization.k8s.io", "clusterroles", role)
        if not allowed:
            user = f"system:serviceaccount:{CONTROL_PLANE_ACCOUNT[0]}:{CONTROL_PLANE_ACCOUNT[1]}"
            where = (
                f' in the namespace "{namespace}"' if namespace and plural != "namespaces" else " at the cluster scope"
            )
            message = (
                f'{resource} is forbidden: User "{user}" cannot {verb} resource "{resource}" '
                f'in API group "{group}"{where}'
            )
            self.denied.append(message)
            raise KubernetesError(status=403, reason="Forbidden", message=message)

    def _rules(self, account: tuple[str, str], namespace: str | None) -> list[Mapping[str, Any]]:
        """The rules that hold for the account: its ClusterRoleBindings' everywhere, and in ``namespace``
        its RoleBindings' there."""

        def binds(binding: Mapping[str, Any]) -> bool:
            return any(
                s.get("kind") == "ServiceAccount" and (s.get("namespace"), s.get("name")) == account
                for s in binding.get("subjects") or []
            )

        def role_rules(ref: Mapping[str, Any], ns: str) -> list[Mapping[str, Any]]:
            kind = "clusterroles" if ref.get("kind") == "ClusterRole" else "roles"
            role = self._store.get((kind, "" if kind == "clusterroles" else ns, str(ref.get("name"))))
            return list((role or {}).get("rules") or [])

        rules: list[Mapping[str, Any]] = []
        for (plural, ns, _), obj in self._store.items():
            if plural == "clusterrolebindings" and binds(obj):
                rules += role_rules(obj.get("roleRef") or {}, "")
            elif plural == "rolebindings" and namespace is not None and ns == namespace and binds(obj):
                rules += role_rules(obj.get("roleRef") or {}, ns)
        return rules

    def _log(self, key: Key, params: Mapping[str, str]) -> aiohttp.web.StreamResponse:
        if key not in self._store:
            raise KubernetesObjectNotFoundError(reason="NotFound", message=f'pods "{key[2]}" not found')
        path = self.logs_dir / key[1] / f"{key[2]}.log"
        if not path.exists():
            raise KubernetesError(
                status=400, reason="BadRequest", message=f'container "rank" in pod "{key[2]}" is waiting to start'
            )
        lines = path.read_text().splitlines()
        if params.get("tailLines"):
            lines = lines[len(lines) - int(params["tailLines"]) :]
        if params.get("timestamps") not in ("true", "1"):
            lines = [line.partition(" ")[2] for line in lines]
        return aiohttp.web.Response(text="".join(f"{line}\n" for line in lines), content_type="text/plain")

    async def _watch(
        self, raw_request: aiohttp.web.BaseRequest, plural: str, namespace: str | None, params: Mapping[str, str]
    ) -> aiohttp.web.StreamResponse:
        selector = params.get("labelSelector", "")
        bookmarks = params.get("allowWatchBookmarks") in ("true", "1")
        timeout = float(params.get("timeoutSeconds") or 1800)
        asked = params.get("resourceVersion") or ""
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(raw_request)
        self.watches_served += 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        with self._mutex:
            drops = self._drops
            if asked in ("", "0"):  # from now, the current objects first as ADDED
                version = self._version
                pending = [
                    {"type": "ADDED", "object": copy.deepcopy(o)}
                    for o in self._list(plural, namespace, selector)["items"]
                ]
            else:
                version = int(asked)
                pending = []
                if version < self._compacted:
                    self.gone_answers += 1
                    gone = {
                        "type": "ERROR",
                        "object": {
                            "kind": "Status",
                            "apiVersion": "v1",
                            "status": "Failure",
                            "reason": "Expired",
                            "code": 410,
                            "message": f"too old resource version: {version} ({self._compacted})",
                        },
                    }
                    await response.write(json.dumps(gone).encode() + b"\n")
                    await response.write_eof()
                    return response
        next_bookmark = loop.time() + self.bookmark_s
        for event in pending:
            await response.write(json.dumps(event).encode() + b"\n")
        try:
            while loop.time() < deadline:
                assert self._changed is not None
                changed = self._changed
                with self._mutex:
                    if self._drops != drops:
                        break
                    changes = list(self._changes_after(version, plural, namespace, selector))
                    current = self._version
                for at, event in changes:
                    await response.write(json.dumps(event).encode() + b"\n")
                    version = at
                if bookmarks and loop.time() >= next_bookmark:
                    version = max(version, current)
                    mark = {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": RESOURCES[plural][0],
                            "apiVersion": "v1",
                            "metadata": {"resourceVersion": str(version)},
                        },
                    }
                    await response.write(json.dumps(mark).encode() + b"\n")
                    next_bookmark = loop.time() + self.bookmark_s
                wait = min(deadline, next_bookmark) - loop.time()
                if wait > 0:
                    changed.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), timeout=wait)
        except (ConnectionResetError, asyncio.CancelledError):
            return response
        await response.write_eof()
        return response


def _allows(rules: list[Mapping[str, Any]], verb: str, group: str, resource: str, name: str | None) -> bool:
    for rule in rules:
        if not ({"*", group} & set(rule.get("apiGroups") or [])):
            continue
        if not ({"*", resource} & set(rule.get("resources") or [])):
            continue
        if not ({"*", verb} & set(rule.get("verbs") or [])):
            continue
        names = rule.get("resourceNames") or []
        if names and name not in names:
            continue
        return True
    return False


def _system_meta(current: Mapping[str, Any]) -> dict[str, Any]:
    meta = current.get("metadata", {})
    keep = ("uid", "creationTimestamp", "namespace", "name", "deletionTimestamp", "deletionGracePeriodSeconds")
    return {k: meta[k] for k in keep if k in meta}


def _json(data: Any, status: int = 200) -> aiohttp.web.Response:
    return aiohttp.web.json_response(data, status=status)


class RunningCluster:
    """The emulator served on a loopback port from a thread of its own: ``url``, ``cluster`` (the store),
    ``kubeconfig`` (a file for ``POLYCHIP_K8S_KUBECONFIG``)."""

    def __init__(self, root: Path, *, bookmark_s: float = 1.0, rbac: Path | None = RBAC_FILE) -> None:
        """``rbac``: the manifests whose ClusterRoles and bindings authorize the control plane (``kubeconfig``);
        None: no authorization. ``admin_kubeconfig`` holds every right (the node agent's)."""
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.cluster = EmulatedCluster(logs_dir=root / "logs", bookmark_s=bookmark_s, rbac=rbac is not None)
        self._rbac_file = rbac
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.url = ""
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="kube-emulator", daemon=True)

    def __enter__(self) -> RunningCluster:
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            raise RuntimeError(f"the Kubernetes emulator did not start: {self._error!r}")
        self.kubeconfig = self._kubeconfig("kubeconfig", CONTROL_PLANE_TOKEN)
        self.admin_kubeconfig = self._kubeconfig("admin-kubeconfig", ADMIN_TOKEN)
        if self._rbac_file is not None:
            self.cluster.put("namespaces", {"metadata": {"name": CONTROL_PLANE_ACCOUNT[0]}})
            for doc in yaml.safe_load_all(self._rbac_file.read_text()):
                plural = {"ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings"}.get(doc["kind"])
                if plural is not None:
                    self.cluster.put(plural, doc)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    def _kubeconfig(self, name: str, token: str) -> Path:
        path = self.root / name
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulated", "cluster": {"server": self.url}}],
            "users": [{"name": "user", "user": {"token": token}}],
            "contexts": [{"name": "emulated", "context": {"cluster": "emulated", "user": "user"}}],
            "current-context": "emulated",
        }
        path.write_text(json.dumps(config))
        return path

    def _serve(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            async with self.cluster, Server(self.cluster) as server:
                self.url = str(server.url).rstrip("/")
                self._ready.set()
                await self._stop.wait()

        try:
            asyncio.run(main())
        except BaseException as exc:  # reported by __enter__
            self._error = exc
            self._ready.set()

    def add_node(self, name: str, *, labels: Mapping[str, str], resources: Mapping[str, int]) -> dict[str, Any]:
        return self.cluster.put(
            "nodes",
            {
                "metadata": {"name": name, "labels": dict(labels)},
                "spec": {},
                "status": {
                    "allocatable": {k: str(v) for k, v in resources.items()},
                    "capacity": {k: str(v) for k, v in resources.items()},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            },
        )

    def objects_of_run(self, run: str) -> list[tuple[str, str]]:
        """(kind, name) of everything left in the store that belongs to the run."""
        left = []
        for obj in self.cluster.objects():
            meta = obj.get("metadata", {})
            if (meta.get("labels") or {}).get("polychip.io/run") == run or meta.get("name") == run:
                left.append((obj["kind"], meta["name"]))
        return sorted(left)
