"""The Kubernetes calls trials make, through the profiler's authenticated client (``kube.py``).

Everything a run creates lives in the trial namespace, owned by the run's anchor ConfigMap:
deleting the anchor with ``propagationPolicy: Background`` lets the garbage collector remove
every trial object and, through them, their pods. Trials are also deleted one by one, in the
foreground of the run, so that GPUs are freed at once.

Transport failures and 5xx answers raise ``UnavailableError`` (the caller retries); 4xx answers
raise ``ApiError`` with the status and the server's message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from profiler_app.core.kube import TRANSPORT_ERRORS, KubeConnection, describe, error_status
from profiler_app.trial.manifests import API_VERSIONS, JOB, PYTORCH_JOB

Json = dict[str, Any]
RESOURCES = {
    JOB: "/apis/batch/v1/namespaces/{namespace}/jobs",
    PYTORCH_JOB: "/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs",
    "Pod": "/api/v1/namespaces/{namespace}/pods",
    "ConfigMap": "/api/v1/namespaces/{namespace}/configmaps",
    "ResourceQuota": "/api/v1/namespaces/{namespace}/resourcequotas",
    "Lease": "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases",
}
NAMESPACES = "/api/v1/namespaces"
PRIORITY_CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"
NODES = "/api/v1/nodes"
LOG_TIMEOUT = (3.0, 30.0)


class UnavailableError(Exception):
    """The API server could not be reached or failed (5xx, 429): worth a retry."""


class ApiError(Exception):
    """The API server refused the request (4xx)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


def _message(error: ApiException) -> str:
    try:
        body = json.loads(error.body or "{}")
    except ValueError:
        body = {}
    return str(body.get("message") or error.reason or "")


_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def _forbidden(method: str, path: str, message: str) -> str:
    """A 403 as one line naming the permission that is missing: verb, resource, namespace."""
    parts = path.strip("/").split("/")
    namespace = parts[parts.index("namespaces") + 1] if "namespaces" in parts[:-1] else None
    group = parts[1] if parts[0] == "apis" else ""
    after = parts[parts.index(namespace) + 1 :] if namespace else parts[(3 if group else 2) :]
    resource = after[0] if after else parts[-1]
    if len(after) > 2:
        resource = f"{resource}/{after[2]}"  # a subresource (pods/log)
    verb = _VERBS.get(method) or ("get" if len(after) >= 2 else "list")
    where = f" in namespace {namespace}" if namespace else ""
    named = f"{resource}.{group}" if group else resource
    return f"no permission to {verb} {named}{where} ({message})"


class TrialCluster:
    """Typed calls for the resources trials use."""

    def __init__(self, connection: KubeConnection) -> None:
        self.connection = connection

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        query: Mapping[str, str | int | bool | None] | None = None,
        raw: bool = False,
        timeout: tuple[float, float] | None = None,
    ) -> Any:
        try:
            response = self.connection.request(
                method,
                path,
                query=query,
                body=body,
                content_type="application/json" if body is not None else None,
                timeout=timeout,
            )
        except ApiException as error:
            status = error_status(error)
            if status is None or status >= 500 or status == 429:
                raise UnavailableError(describe(error)) from None
            if status == 403:
                raise ApiError(403, _forbidden(method, path, _message(error))) from None
            raise ApiError(status, _message(error)) from None
        except TRANSPORT_ERRORS as error:
            raise UnavailableError(describe(error)) from None
        try:
            data = response.data
        finally:
            response.release_conn()
        if raw:
            return data.decode("utf-8", errors="replace")
        try:
            return json.loads(data) if data else {}
        except ValueError:
            raise UnavailableError(f"the answer to {method} {path} is not JSON") from None

    # -- generic ---------------------------------------------------------------------------

    def create(self, kind: str, namespace: str, manifest: Json) -> Json:
        result: Json = self._call(
            "POST", RESOURCES[kind].format(namespace=namespace), body=manifest
        )
        return result

    def update(self, kind: str, namespace: str, manifest: Json) -> Json:
        """Replace (PUT); the manifest's resourceVersion makes it 409 if changed meanwhile."""
        name = manifest["metadata"]["name"]
        result: Json = self._call(
            "PUT", f"{RESOURCES[kind].format(namespace=namespace)}/{name}", body=manifest
        )
        return result

    def get(self, kind: str, namespace: str, name: str) -> Json | None:
        try:
            result: Json = self._call(
                "GET", f"{RESOURCES[kind].format(namespace=namespace)}/{name}"
            )
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        return result

    def list_of(self, kind: str, namespace: str, labels: Mapping[str, str]) -> list[Json]:
        selector = ",".join(f"{key}={value}" for key, value in labels.items())
        result = self._call(
            "GET", RESOURCES[kind].format(namespace=namespace), query={"labelSelector": selector}
        )
        return list(result.get("items") or [])

    def delete(
        self, kind: str, namespace: str, name: str, *, grace_seconds: int | None = None
    ) -> bool:
        """Delete with its dependents (garbage collector, in the background), and with
        ``grace_seconds`` the pod's grace period instead of its own; False if gone."""
        options: Json = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "propagationPolicy": "Background",
        }
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        try:
            self._call(
                "DELETE", f"{RESOURCES[kind].format(namespace=namespace)}/{name}", body=options
            )
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        return True

    # -- specific --------------------------------------------------------------------------

    def events_of(self, namespace: str, name: str) -> list[Json]:
        """The Events about the object ``name`` (its controller's FailedCreate, say)."""
        result = self._call(
            "GET",
            f"/api/v1/namespaces/{namespace}/events",
            query={"fieldSelector": f"involvedObject.name={name}"},
        )
        return [
            e
            for e in result.get("items") or ()
            if (e.get("involvedObject") or {}).get("name") == name
        ]

    def nodes(self) -> list[Json]:
        return list(self._call("GET", NODES).get("items") or [])

    def workload(self, namespace: str, kind: str, name: str) -> Json:
        found = self.get(kind, namespace, name)
        if found is None:
            raise ApiError(404, f"{kind} {namespace}/{name} not found")
        found.setdefault("apiVersion", API_VERSIONS[kind])
        found.setdefault("kind", kind)
        return found

    def ensure_namespace(self, name: str) -> None:
        try:
            self._call(
                "POST",
                NAMESPACES,
                body={
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {
                        "name": name,
                        "labels": {"app.kubernetes.io/managed-by": "gpu-profiler-trial"},
                    },
                },
            )
        except ApiError as error:
            if error.status != 409:
                raise

    def priority_class(self, name: str) -> Json | None:
        try:
            result: Json = self._call("GET", f"{PRIORITY_CLASSES}/{name}")
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        return result

    def create_priority_class(self, manifest: Json) -> None:
        try:
            self._call("POST", PRIORITY_CLASSES, body=manifest)
        except ApiError as error:
            if error.status != 409:
                raise

    def pod_log(self, namespace: str, pod: str, container: str | None, since: str | None) -> str:
        query: dict[str, str | int | bool | None] = {
            "timestamps": "true",
            "container": container,
            "sinceTime": since,
        }
        text: str = self._call(
            "GET",
            f"{RESOURCES['Pod'].format(namespace=namespace)}/{pod}/log",
            query=query,
            raw=True,
            timeout=LOG_TIMEOUT,
        )
        return text
