"""The Kubernetes API as the backend uses it: plain JSON over the official client's connection.

The official client (``kubernetes``) brings the connection: kubeconfig or in-cluster credentials,
TLS, tokens, retries. Its typed models do not come along: the backend reads and writes the
apiserver's JSON as it is (``observe`` reads pods as ``kubectl get -o json`` prints them), which
also spares deserializing a thousand pods into objects on every list.

Only the kinds the backend makes are known (``KINDS``); each call raises ``ApiError`` with the
apiserver's status code and message.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

# kind -> (API path prefix, plural, namespaced)
KINDS: Mapping[str, tuple[str, str, bool]] = {
    "Namespace": ("/api/v1", "namespaces", False),
    "Node": ("/api/v1", "nodes", False),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Secret": ("/api/v1", "secrets", True),
    "Service": ("/api/v1", "services", True),
    "Pod": ("/api/v1", "pods", True),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "ResourceQuota": ("/api/v1", "resourcequotas", True),
    "LimitRange": ("/api/v1", "limitranges", True),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
}


class ApiError(Exception):
    """The apiserver refused or failed a request: ``status`` its HTTP code (0: it was not reached)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Listing:
    items: list[dict[str, Any]]
    resource_version: str


def connect(kubeconfig: str = "") -> k8s_client.ApiClient:
    """A client for the cluster: the kubeconfig file given, else the pod's own service account."""
    configuration = k8s_client.Configuration()
    if kubeconfig:
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return k8s_client.ApiClient(configuration)


def collection_path(kind: str, namespace: str | None) -> str:
    prefix, plural, namespaced = KINDS[kind]
    if namespaced:
        if not namespace:
            raise ValueError(f"{kind} is namespaced: give its namespace")
        return f"{prefix}/namespaces/{namespace}/{plural}"
    return f"{prefix}/{plural}"


def object_path(kind: str, namespace: str | None, name: str) -> str:
    return f"{collection_path(kind, namespace)}/{name}"


class Api:
    """Raw JSON calls over one ``ApiClient``; thread-safe as the client's connection pool is."""

    def __init__(self, api_client: k8s_client.ApiClient, *, timeout_s: float = 30.0) -> None:
        self.client = api_client
        self.timeout_s = timeout_s

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        stream: bool = False,
        timeout_s: float | None = None,
    ) -> Any:
        """The answer's JSON (``stream``: the open response, for ``lines``); ``ApiError`` for a refusal."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        params = [(key, value) for key, value in (query or {}).items() if value is not None]
        try:
            method_, url, headers_, body_, _ = self.client.param_serialize(
                method=method,
                resource_path=path,
                query_params=params,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            answer = self.client.call_api(
                method_, url, header_params=headers_, body=body_, _request_timeout=timeout_s or self.timeout_s
            )
        except ApiException as exc:
            raise ApiError(exc.status or 0, str(exc.reason)) from None
        except (OSError, urllib3.exceptions.HTTPError) as exc:  # refused, reset, timed out, retries spent
            raise ApiError(0, f"the apiserver could not be reached: {exc}") from None
        response = answer.response
        if not 200 <= answer.status < 300:
            raw = response.data
            response.release_conn()
            raise ApiError(answer.status, _message(raw))
        if stream:
            return response
        return json.loads(answer.read() or b"null")  # type: ignore[no-untyped-call]

    # -- objects -----------------------------------------------------------------------------------

    def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        namespace = obj.get("metadata", {}).get("namespace")
        created: dict[str, Any] = self.request("POST", collection_path(obj["kind"], namespace), body=dict(obj))
        return created

    def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object, or None when there is none."""
        try:
            found: dict[str, Any] = self.request("GET", object_path(kind, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return found

    def replace(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """PUT: the object becomes exactly this (what the body leaves out is removed)."""
        meta = obj.get("metadata", {})
        replaced: dict[str, Any] = self.request(
            "PUT", object_path(obj["kind"], meta.get("namespace"), meta["name"]), body=dict(obj)
        )
        return replaced

    def patch(self, kind: str, namespace: str | None, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386): keys given replace, ``None`` removes."""
        patched: dict[str, Any] = self.request(
            "PATCH", object_path(kind, namespace, name), body=dict(patch), content_type="application/merge-patch+json"
        )
        return patched

    def delete(self, kind: str, namespace: str | None, name: str, *, grace_period_s: int | None = None) -> bool:
        """Delete it and, through the garbage collector, what it owns; False when it was already gone.
        ``grace_period_s=0`` removes a pod at once, without its kubelet's word (``kubectl delete --force``)."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if grace_period_s is not None:
            body["gracePeriodSeconds"] = grace_period_s
        try:
            self.request("DELETE", object_path(kind, namespace, name), body=body)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def list(self, kind: str, namespace: str | None, *, labels: str = "") -> Listing:
        answer = self.request("GET", collection_path(kind, namespace), query={"labelSelector": labels or None})
        items = answer.get("items") or []
        return Listing(items=list(items), resource_version=str(answer.get("metadata", {}).get("resourceVersion", "")))

    def watch(
        self, kind: str, namespace: str | None, *, labels: str, resource_version: str, timeout_s: int
    ) -> Iterator[dict[str, Any]]:
        """The events after ``resource_version`` (BOOKMARK ones included), until the server ends the
        watch after ``timeout_s``; an ERROR event passes through as it came (410: the version is gone)."""
        response = self.request(
            "GET",
            collection_path(kind, namespace),
            query={
                "watch": "true",
                "labelSelector": labels or None,
                "resourceVersion": resource_version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": timeout_s,
            },
            stream=True,
            timeout_s=timeout_s + 10,
        )
        try:
            buffer = b""
            for chunk in response.stream(amt=None, decode_content=False):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
        except (OSError, urllib3.exceptions.HTTPError) as exc:
            raise ApiError(0, f"the watch broke: {exc}") from None
        finally:
            response.release_conn()

    def log(self, namespace: str, pod: str, *, tail_lines: int | None = None) -> str:
        """The pod's output as the kubelet keeps it, each line after its RFC 3339 time."""
        response = self.request(
            "GET",
            f"{object_path('Pod', namespace, pod)}/log",
            query={"timestamps": "true", "tailLines": tail_lines},
            stream=True,
        )
        try:
            data: bytes = response.data
        except (OSError, urllib3.exceptions.HTTPError) as exc:
            raise ApiError(0, f"the log could not be read: {exc}") from None
        finally:
            response.release_conn()
        return data.decode("utf-8", errors="replace")


def _message(raw: bytes | None) -> str:
    try:
        status = json.loads(raw or b"{}")
    except ValueError:
        return (raw or b"").decode("utf-8", errors="replace")[:300]
    if isinstance(status, dict):
        return str(status.get("message") or status.get("reason") or status)[:300]
    return str(status)[:300]
