"""A stand-in Kubernetes API server: a TEST DOUBLE for the calls the profiler makes.

No real kube-apiserver can run here, so this small HTTP server answers, over real HTTP on
127.0.0.1, the handful of requests ``profiler_app.kube``, ``sources.kube_pods`` and
``sinks.kubernetes`` send, shaped like the real API server's answers:

- ``GET/PATCH /api/v1/nodes/{name}`` and ``GET/PATCH /api/v1/namespaces/{ns}/pods/{name}``.
  PATCH takes a strategic merge or merge patch (a JSON object: maps merge, ``null`` deletes a
  key; lists are replaced, where the real strategic merge treats some specially, which the
  profiler never patches), a JSON patch (RFC 6902 ``add``, ``remove``, ``replace``, ``test``) or
  a server-side apply (``application/apply-patch+yaml``, which the real server accepts on pods
  and nodes: it needs ``fieldManager``, else 422 as kubernetes@v1.35.0
  staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/validation/validation.go
  ``ValidatePatchOptions`` answers; applied here as a merge of the applied
  configuration, without field ownership or removal of fields a manager stops applying);
  another Content-Type is 415, a malformed body 400. A patch that changes nothing stores
  nothing: no new ``resourceVersion``, no watch event (kubernetes@v1.35.0
  staging/src/k8s.io/apiserver/pkg/storage/etcd3/store.go ``GuaranteedUpdate`` skips the write
  when the object is unchanged). Then, as the real server's patch handler
  and registry do: a JSON patch that does not apply (a failed ``test`` too) is 422 with the
  generic "the server rejected our request" Status; a patched object whose
  ``metadata.resourceVersion`` differs from the stored one (the patch carried a stale one: a
  precondition) is 409 Conflict; a changed ``metadata.name`` 400; a changed ``metadata.uid``
  (the patch carried another object's: a UID precondition) 422 "field is immutable". Annotation
  values must be strings and keys qualified names (else 422), and the total annotation size is
  capped at 256 KiB, as the real server validates. Every stored change gets a new
  ``resourceVersion``; ``recreate_pod`` deletes a pod and creates one of the same name with a
  new UID, as a StatefulSet or a training operator does.
- ``GET /api/v1/pods?fieldSelector=spec.nodeName=X`` lists pods with a ``resourceVersion``;
  with ``watch=true`` it streams watch events as chunked JSON lines from that version on, ends
  after ``timeoutSeconds``, and answers an ERROR event with code 410 (Gone) when the version
  is older than the retained history (see ``expire_history`` / ``break_watches_with_gone``);
  BOOKMARK events on request (``send_bookmark``) to watches that allow them. A list with
  ``limit`` is paged: each page carries ``metadata.continue`` (and ``remainingItemCount``)
  until the last; every page comes from the snapshot the first one took, at its
  ``resourceVersion``, as etcd gives the real server. An unknown or expired token (see
  ``expire_list_tokens``) answers 410 Expired.
- Errors are ``Status`` objects (an injected 500 is the real ``InternalError``, see
  ``internal_error``). Bearer-token authentication (401 without the token).

Every request is recorded (``requests``, and the status of each answer in ``answers``) so
tests can count calls per cycle, and faults can be injected per method and path: an error status
N times or forever (``fail``), a hang longer than the client's timeout (``hang``), someone
else's change landing just before the request is answered (``before``), or a request carried
out whose answer never arrives (``lose_answers``). Not modelled: TLS,
label selectors, other resource kinds, admission, server-side apply's field ownership, and
JSON patch ``move`` and ``copy``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import re
import secrets
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import yaml

STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
PATCH_TYPES = (STRATEGIC_MERGE_PATCH, MERGE_PATCH, JSON_PATCH, APPLY_PATCH)
ANNOTATIONS_MAX_BYTES = 256 * 1024
GPU_RESOURCE = "nvidia.com/gpu"

_NODE_PATH = re.compile(r"^/api/v1/nodes/([^/]+)$")
_POD_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)$")
_PODS_PATH = "/api/v1/pods"
_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_KIND_NAMES = {"pods": "Pod", "nodes": "Node"}
_REFUSED = object()  # a request already answered with a refusal

Json = dict[str, Any]


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server received it."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str | None
    body: bytes
    authorization: str | None
    received_at: float = field(default_factory=time.time)  # Unix seconds

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class _Fault:
    method: str
    path: str
    status: int | None  # None: hang for hang_seconds, then answer normally
    remaining: int | None  # None: forever
    retry_after: int | None = None
    hang_seconds: float = 0.0
    action: Callable[[], None] | None = None  # run before answering normally (``before``)
    cause: str | None = None  # a 500's cause (``internal_error``)
    lose_answer: bool = False  # do the request, then close the connection unanswered


@dataclass
class _State:
    token: str
    lock: threading.Condition = field(default_factory=threading.Condition)
    stopping: threading.Event = field(default_factory=threading.Event)
    resource_version: int = 1
    nodes: dict[str, Json] = field(default_factory=dict)
    pods: dict[tuple[str, str], Json] = field(default_factory=dict)
    events: list[tuple[int, str, Json]] = field(default_factory=list)
    oldest_watchable: int = 0  # watches from an older version get 410 Gone
    gone_generation: int = 0  # bumped to end every open watch with 410 Gone
    open_watches: int = 0
    faults: list[_Fault] = field(default_factory=list)
    recorded: list[RecordedRequest] = field(default_factory=list)
    answered: list[tuple[RecordedRequest, int]] = field(default_factory=list)
    # Paged lists in progress: continue token -> (resourceVersion, the items still to send).
    list_snapshots: dict[str, tuple[str, list[Json]]] = field(default_factory=dict)


def status_object(code: int, reason: str, message: str) -> Json:
    """A ``Status`` object as the API server sends for failures."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def internal_error(cause: str) -> Json:
    """The 500 Status the real server sends for an internal error, as
    kubernetes/apimachinery@v0.35.7:pkg/api/errors/errors.go ``NewInternalError`` builds it
    (reason ``InternalError``, the cause in ``details.causes``). A fail-closed admission webhook
    that cannot be called answers this for every write it covers
    (kubernetes/apiserver@v0.35.7:pkg/admission/plugin/webhook/mutating/dispatcher.go, "failing
    closed"; the cause from pkg/util/webhook/error.go ``ErrCallingWebhook``)."""
    status = status_object(500, "InternalError", f"Internal error occurred: {cause}")
    status["details"] = {"causes": [{"message": cause}]}
    return status


def webhook_down(webhook: str, service: str) -> str:
    """The cause a fail-closed webhook's dead service gives (``ErrCallingWebhook.Error()``)."""
    return (
        f'failed calling webhook "{webhook}": failed to call webhook: Post '
        f'"https://{service}:443/mutate?timeout=10s": dial tcp 10.96.0.42:443: connect: '
        "connection refused"
    )


def pod_manifest(
    namespace: str,
    name: str,
    node: str,
    *,
    gpus: int = 0,
    gpu_resource: str = GPU_RESOURCE,
    phase: str = "Running",
    uid: str | None = None,
    start_time: datetime | None = None,
    annotations: dict[str, str] | None = None,
    owner: tuple[str, str] | None = None,
) -> Json:
    """A minimal but well-formed Pod, optionally requesting ``gpus`` of ``gpu_resource``
    (``nvidia.com/mig-3g.40gb``, say); ``owner`` is its controller's (kind, name)."""
    resources: Json = {}
    if gpus:
        resources = {"limits": {gpu_resource: str(gpus)}, "requests": {gpu_resource: str(gpus)}}
    started = start_time or datetime(2026, 1, 1, tzinfo=UTC)
    metadata: Json = {
        "name": name,
        "namespace": namespace,
        "uid": uid or str(uuid.uuid4()),
        "annotations": dict(annotations or {}),
    }
    if owner is not None:
        kind, owner_name = owner
        metadata["ownerReferences"] = [
            {
                "apiVersion": "batch/v1" if kind == "Job" else "kubeflow.org/v1",
                "kind": kind,
                "name": owner_name,
                "uid": str(uuid.uuid4()),
                "controller": True,
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "busybox", "resources": resources}],
        },
        "status": {"phase": phase, "startTime": started.strftime("%Y-%m-%dT%H:%M:%SZ")},
    }


def _merge_patch(target: Json, patch: Json) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
            if isinstance(value, dict):
                _drop_nulls(target[key])


def _drop_nulls(mapping: Json) -> None:
    for key in [key for key, value in mapping.items() if value is None]:
        del mapping[key]
    for value in mapping.values():
        if isinstance(value, dict):
            _drop_nulls(value)


class JsonPatchError(Exception):
    """A JSON patch that does not apply (422) or is malformed (``malformed``: 400)."""

    def __init__(self, message: str, *, malformed: bool = False) -> None:
        super().__init__(message)
        self.malformed = malformed


def patch_not_applied(message: str) -> Json:
    """The real server's answer to a JSON patch that does not apply (a failed ``test`` too):
    a generic 422 whose cause carries the patch library's message."""
    status = status_object(
        422, "Invalid", "the server rejected our request due to an error in our request"
    )
    status["details"] = {"causes": [{"reason": "UnexpectedServerResponse", "message": message}]}
    return status


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise JsonPatchError(f"invalid JSON pointer {path!r}", malformed=True)
    return [part.replace("~1", "/").replace("~0", "~") for part in path.split("/")[1:]]


def _parent(document: Any, parts: list[str], op: str, path: str) -> tuple[Any, str]:
    """The container holding the pointer's last part, and that part."""
    if not parts:
        raise JsonPatchError(f"{op} operation on the whole document is not supported here")
    container = document
    for part in parts[:-1]:
        if isinstance(container, dict) and part in container:
            container = container[part]
        elif isinstance(container, list) and part.isdigit() and int(part) < len(container):
            container = container[int(part)]
        else:
            raise JsonPatchError(f'{op} operation does not apply: doc is missing path: "{path}"')
    return container, parts[-1]


def apply_json_patch(document: Json, operations: list[Json]) -> Json:
    """RFC 6902 ``add``, ``remove``, ``replace`` and ``test`` on object members and list items,
    as the API server's patch library applies them. Its one departure from the RFC is kept:
    ``test`` with value null passes when the member is missing."""
    for operation in operations:
        op, path = operation.get("op"), operation.get("path")
        if op not in ("add", "remove", "replace", "test"):
            raise JsonPatchError(f"unsupported operation {op!r}", malformed=True)
        if op in ("add", "replace", "test") and "value" not in operation:
            raise JsonPatchError(f"{op} operation without a value", malformed=True)
        container, last = _parent(document, _pointer(path), op, str(path))
        if isinstance(container, list):
            index = len(container) if last == "-" else int(last) if last.isdigit() else -1
            present = 0 <= index < len(container)
            value = container[index] if present else None
        elif isinstance(container, dict):
            present = last in container
            value = container.get(last)
        else:
            raise JsonPatchError(f'{op} operation does not apply: doc is missing path: "{path}"')
        if op == "test":
            if value != operation["value"]:  # a missing member reads as null
                raise JsonPatchError(f"testing value {path} failed: test failed")
            continue
        if op in ("remove", "replace") and not present:
            raise JsonPatchError(f'{op} operation does not apply: doc is missing key: "{path}"')
        if isinstance(container, list):
            if op == "add" and 0 <= index <= len(container):
                container.insert(index, copy.deepcopy(operation["value"]))
            elif op == "add":
                raise JsonPatchError(f'add operation does not apply: index out of range: "{path}"')
            elif op == "remove":
                del container[index]
            else:
                container[index] = copy.deepcopy(operation["value"])
        elif op == "remove":
            del container[last]
        else:
            container[last] = copy.deepcopy(operation["value"])
    return document


def _annotation_problem(annotations: Any) -> str | None:
    """Why these annotations would be rejected by the real API server's validation, if so."""
    if not isinstance(annotations, dict):
        return "metadata.annotations: must be a map of strings"
    total = 0
    for key, value in annotations.items():
        if not isinstance(value, str):
            return f"metadata.annotations[{key}]: value must be a string"
        prefix, _, name = key.rpartition("/")
        if not _NAME_PART.match(name) or (
            prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix))
        ):
            return (
                f"metadata.annotations: Invalid value: {key!r}: name part must be a qualified name"
            )
        total += len(key) + len(value)
    if total > ANNOTATIONS_MAX_BYTES:
        return f"metadata.annotations: Too long: must have at most {ANNOTATIONS_MAX_BYTES} bytes"
    return None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # as Go servers do; avoids 40 ms delayed-ACK stalls
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: tests read ``requests`` instead."""

    @property
    def state(self) -> _State:
        return self.server.state

    def do_GET(self) -> None:
        self._dispatch()

    def do_PATCH(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    # -- plumbing ---------------------------------------------------------------------------

    def _dispatch(self) -> None:
        split = urlsplit(self.path)
        path = unquote(split.path)
        query = dict(parse_qsl(split.query, keep_blank_values=True))
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        request = RecordedRequest(
            method=self.command,
            path=path,
            query=query,
            content_type=self.headers.get("Content-Type"),
            body=body,
            authorization=self.headers.get("Authorization"),
        )
        with self.state.lock:
            self.state.recorded.append(request)
            fault = self._take_fault(request)
        if request.authorization != f"Bearer {self.state.token}":
            self._send_status(401, "Unauthorized", "Unauthorized")
            return
        self._request = request
        if fault is not None:
            if fault.lose_answer:
                self._lose_answer(request)
                return
            if fault.status is None:
                if self.state.stopping.wait(fault.hang_seconds):
                    return
                if fault.action is not None:
                    fault.action()
            else:
                headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after else {}
                if fault.status == 500:
                    self._send_json(500, internal_error(fault.cause or "injected"), headers)
                    return
                reason = HTTPStatus(fault.status).phrase.replace(" ", "")
                self._send_status(fault.status, reason, f"injected {fault.status}", headers)
                return
        try:
            self._route(request)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _lose_answer(self, request: RecordedRequest) -> None:
        """Carry the request out, then hang up without an answer: what a client sees when its
        timeout fires after the server committed (the change stands; the client cannot know)."""
        self._request = request
        real_send = self._send_json
        self._send_json = lambda *args, **kwargs: None  # type: ignore[method-assign]
        try:
            self._route(request)
        finally:
            self._send_json = real_send  # type: ignore[method-assign]
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(2)

    def _take_fault(self, request: RecordedRequest) -> _Fault | None:
        for fault in self.state.faults:
            if fault.method == request.method and fault.path == request.path:
                if fault.remaining is not None:
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        self.state.faults.remove(fault)
                return fault
        return None

    def _send_json(self, code: int, payload: Json, headers: dict[str, str] | None = None) -> None:
        request = getattr(self, "_request", None)
        if request is not None:
            with self.state.lock:
                self.state.answered.append((request, code))
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_status(
        self, code: int, reason: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        self._send_json(code, status_object(code, reason, message), headers)

    # -- resources --------------------------------------------------------------------------

    def _route(self, request: RecordedRequest) -> None:
        if node := _NODE_PATH.match(request.path):
            self._object(request, "nodes", node.group(1), None)
        elif pod := _POD_PATH.match(request.path):
            self._object(request, "pods", pod.group(2), pod.group(1))
        elif request.path == _PODS_PATH and request.method == "GET":
            self._pods_collection(request)
        else:
            self._send_status(404, "NotFound", "the server could not find the requested resource")

    def _object(
        self, request: RecordedRequest, kind: str, name: str, namespace: str | None
    ) -> None:
        state = self.state
        with state.lock:
            store: dict[Any, Json] = state.nodes if kind == "nodes" else state.pods
            key: Any = name if namespace is None else (namespace, name)
            current = store.get(key)
            if current is None:
                self._send_status(404, "NotFound", f'{kind} "{name}" not found')
                return
            if request.method == "GET":
                self._send_json(200, current)
                return
            if request.method != "PATCH":
                self._send_status(405, "MethodNotAllowed", f"{request.method} is not supported")
                return
            self._patch_object(request, kind, key, current)

    def _read_patch(self, request: RecordedRequest, content_type: str) -> Any:
        """The patch in the body, or ``_REFUSED`` with the real server's refusal sent: an
        unknown type (415), an apply without ``fieldManager`` (422), a malformed body (400)."""
        if content_type not in PATCH_TYPES:
            message = f"the body of the request was in an unknown format: {request.content_type}"
            self._send_status(415, "UnsupportedMediaType", message)
            return _REFUSED
        if content_type == APPLY_PATCH and not request.query.get("fieldManager"):
            message = (
                'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is '
                "required for apply patch"
            )
            self._send_status(422, "Invalid", message)
            return _REFUSED
        try:
            if content_type == APPLY_PATCH:
                return yaml.safe_load(request.body)
            return json.loads(request.body)
        except (ValueError, yaml.YAMLError) as error:
            self._send_status(400, "BadRequest", f"invalid patch: {error}")
            return _REFUSED

    def _patch_object(self, request: RecordedRequest, kind: str, key: Any, current: Json) -> None:
        """Validate and apply a strategic merge, merge or JSON patch (the caller holds the lock),
        then check what the patched object says against the stored one, in the real server's
        order: resourceVersion (409 Conflict), name (400), uid (422), annotations (422)."""
        name = current["metadata"]["name"]
        content_type = (request.content_type or "").split(";")[0].strip()
        patch = self._read_patch(request, content_type)
        if patch is _REFUSED:
            return
        patched = copy.deepcopy(current)
        if content_type == JSON_PATCH:
            if not isinstance(patch, list) or not all(isinstance(op, dict) for op in patch):
                self._send_status(400, "BadRequest", "a JSON patch must be a list of operations")
                return
            try:
                patched = apply_json_patch(patched, patch)
            except JsonPatchError as error:
                if error.malformed:
                    self._send_status(400, "BadRequest", str(error))
                else:
                    self._send_json(422, patch_not_applied(str(error)))
                return
        elif isinstance(patch, dict):
            _merge_patch(patched, patch)
        else:
            self._send_status(400, "BadRequest", "a merge patch must be an object")
            return
        if not self._patched_object_acceptable(kind, name, current, patched):
            return
        if patched == current:  # a no-op: no new resourceVersion, no watch event
            self._send_json(200, current)
            return
        self.server.commit(kind, key, patched)
        self._send_json(200, patched)

    def _patched_object_acceptable(
        self, kind: str, name: str, current: Json, patched: Json
    ) -> bool:
        """False, with the real server's answer sent, when the patched object cannot be stored."""
        meta, stored = patched.get("metadata") or {}, current["metadata"]
        if str(meta.get("resourceVersion", "")) != stored["resourceVersion"]:
            # A resourceVersion in the patch is a precondition (optimistic concurrency).
            message = (
                f'Operation cannot be fulfilled on {kind} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again"
            )
            self._send_status(409, "Conflict", message)
            return False
        if meta.get("name") != name:
            message = (
                f"the name of the object ({meta.get('name')}) does not match the name on the URL "
                f"({name})"
            )
            self._send_status(400, "BadRequest", message)
            return False
        if meta.get("uid", stored.get("uid")) != stored.get("uid"):
            # The uid is immutable: a patch carrying another pod's uid is refused.
            message = (
                f'{_KIND_NAMES[kind]} "{name}" is invalid: metadata.uid: Invalid value: '
                f'"{meta.get("uid")}": field is immutable'
            )
            self._send_status(422, "Invalid", message)
            return False
        problem = _annotation_problem(meta.get("annotations", {}))
        if problem:
            self._send_status(422, "Invalid", f'{kind} "{name}" is invalid: {problem}')
            return False
        return True

    def _pods_collection(self, request: RecordedRequest) -> None:
        selector = request.query.get("fieldSelector", "")
        match = re.fullmatch(r"spec\.nodeName==?(.*)", selector)
        if selector and not match:
            self._send_status(400, "BadRequest", f"unsupported field selector {selector!r}")
            return
        node = match.group(1) if match else None
        if request.query.get("watch", "").lower() in ("true", "1"):
            self._watch(request, node)
            return
        page = self._list_page(request, node)
        if page is None:
            self._send_status(410, "Expired", "The provided continue parameter is too old")
            return
        items, metadata = page
        payload = {"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": items}
        self._send_json(200, payload)

    def _list_page(
        self, request: RecordedRequest, node: str | None
    ) -> tuple[list[Json], Json] | None:
        """The items and list metadata of one page; None for an unknown continue token."""
        token = request.query.get("continue")
        limit = int(request.query.get("limit") or 0)
        with self.state.lock:
            if token:
                snapshot = self.state.list_snapshots.pop(token, None)
                if snapshot is None:
                    return None
                version, items = snapshot
            else:
                version = str(self.state.resource_version)
                items = [
                    copy.deepcopy(pod) for pod in self.state.pods.values() if _on_node(pod, node)
                ]
            metadata: Json = {"resourceVersion": version}
            if 0 < limit < len(items):
                items, rest = items[:limit], items[limit:]
                next_token = secrets.token_urlsafe(12)
                self.state.list_snapshots[next_token] = (version, rest)
                metadata.update({"continue": next_token, "remainingItemCount": len(rest)})
        return items, metadata

    def _watch(self, request: RecordedRequest, node: str | None) -> None:
        state = self.state
        timeout = float(request.query.get("timeoutSeconds") or 1800)
        deadline = time.monotonic() + timeout
        since = request.query.get("resourceVersion", "")
        bookmarks = request.query.get("allowWatchBookmarks", "").lower() in ("true", "1")
        if not since.isdigit() and since != "":
            self._send_status(400, "BadRequest", f"invalid resourceVersion {since!r}")
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        with state.lock:
            state.open_watches += 1
            generation = state.gone_generation
            if since in ("", "0"):
                # Like the real server: synthetic ADDED events for what exists, then changes.
                backlog = [("ADDED", pod) for pod in state.pods.values() if _on_node(pod, node)]
                cursor = state.resource_version
            elif int(since) < state.oldest_watchable:
                backlog, cursor = [], -1
            else:
                backlog, cursor = [], int(since)
        try:
            if cursor < 0:
                self._send_gone(since)
                return
            for kind, pod in backlog:
                self._write_event(kind, pod)
            while True:
                with state.lock:
                    state.lock.wait_for(
                        functools.partial(self._watch_should_wake, generation, cursor),
                        timeout=max(0.0, deadline - time.monotonic()),
                    )
                    if state.stopping.is_set() or time.monotonic() >= deadline:
                        break
                    gone = state.gone_generation != generation
                    fresh = [event for event in state.events if event[0] > cursor]
                    cursor = state.resource_version
                if gone:
                    self._send_gone(str(cursor))
                    return
                for _version, kind, pod in fresh:
                    if (kind == "BOOKMARK" and bookmarks) or (
                        kind != "BOOKMARK" and _on_node(pod, node)
                    ):
                        self._write_event(kind, pod)
            self._end_chunks()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            with state.lock:
                state.open_watches -= 1

    def _watch_should_wake(self, generation: int, cursor: int) -> bool:
        state = self.state
        return (
            state.stopping.is_set()
            or state.gone_generation != generation
            or state.resource_version > cursor
        )

    def _send_gone(self, version: str) -> None:
        message = f"too old resource version: {version}"
        self._write_event("ERROR", status_object(410, "Expired", message))
        self._end_chunks()

    def _write_event(self, kind: str, obj: Json) -> None:
        line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
        self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
        self.wfile.flush()

    def _end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def _on_node(pod: Json, node: str | None) -> bool:
    return node is None or pod.get("spec", {}).get("nodeName") == node


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, state: _State) -> None:
        self.state = state
        super().__init__(("127.0.0.1", 0), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients hanging up (timeouts, ``stop()``) are normal here; report anything else."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    def commit(self, kind: str, key: Any, obj: Json, event: str | None = "MODIFIED") -> None:
        """Store ``obj`` under a new resourceVersion (caller holds the lock)."""
        state = self.state
        state.resource_version += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(state.resource_version)
        if kind == "nodes":
            state.nodes[key] = obj
        else:
            if event == "DELETED":
                state.pods.pop(key, None)
            else:
                state.pods[key] = obj
            state.events.append((state.resource_version, event or "MODIFIED", copy.deepcopy(obj)))
        state.lock.notify_all()


class StandInApiServer:
    """Owns the server thread and offers the knobs tests turn. Use ``running_apiserver()``."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token or f"dummy-{secrets.token_hex(8)}"
        self._state = _State(token=self.token)
        self._server = _Server(self._state)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._state.stopping.set()
        with self._state.lock:
            self._state.lock.notify_all()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    # -- objects ----------------------------------------------------------------------------

    def add_node(self, name: str, annotations: dict[str, str] | None = None) -> Json:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "uid": str(uuid.uuid4()), "annotations": annotations or {}},
            "status": {"capacity": {GPU_RESOURCE: "8"}},
        }
        with self._state.lock:
            self._server.commit("nodes", name, node, event=None)
            return copy.deepcopy(node)

    def update_node(self, name: str, change: Callable[[Json], None]) -> Json:
        """Apply ``change`` to the stored node, as someone with kubectl might."""
        with self._state.lock:
            node = copy.deepcopy(self._state.nodes[name])
            change(node)
            self._server.commit("nodes", name, node, event=None)
            return copy.deepcopy(node)

    def remove_node(self, name: str) -> None:
        with self._state.lock:
            self._state.nodes.pop(name, None)

    def node(self, name: str) -> Json:
        with self._state.lock:
            return copy.deepcopy(self._state.nodes[name])

    def add_pod(self, manifest: Json) -> Json:
        """Create a pod (a watch sees ADDED); ``pod_manifest`` builds one."""
        key = (manifest["metadata"]["namespace"], manifest["metadata"]["name"])
        with self._state.lock:
            pod = copy.deepcopy(manifest)
            self._server.commit("pods", key, pod, event="ADDED")
            return copy.deepcopy(pod)

    def update_pod(self, namespace: str, name: str, change: Callable[[Json], None]) -> Json:
        """Apply ``change`` to the stored pod (a watch sees MODIFIED)."""
        with self._state.lock:
            pod = copy.deepcopy(self._state.pods[(namespace, name)])
            change(pod)
            self._server.commit("pods", (namespace, name), pod)
            return copy.deepcopy(pod)

    def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod (a watch sees DELETED)."""
        with self._state.lock:
            pod = self._state.pods[(namespace, name)]
            self._server.commit("pods", (namespace, name), pod, event="DELETED")

    def pod(self, namespace: str, name: str) -> Json:
        with self._state.lock:
            return copy.deepcopy(self._state.pods[(namespace, name)])

    def pods(self, node: str | None = None) -> list[Json]:
        """Every pod (on ``node``), as a list would return them."""
        with self._state.lock:
            return [copy.deepcopy(pod) for pod in self._state.pods.values() if _on_node(pod, node)]

    def recreate_pod(self, manifest: Json) -> Json:
        """Delete the pod of ``manifest``'s name, if any, then create ``manifest`` (give it a new
        ``uid``): a watch sees DELETED, then ADDED."""
        key = (manifest["metadata"]["namespace"], manifest["metadata"]["name"])
        with self._state.lock:
            if key in self._state.pods:
                self._server.commit("pods", key, self._state.pods[key], event="DELETED")
            pod = copy.deepcopy(manifest)
            self._server.commit("pods", key, pod, event="ADDED")
            return copy.deepcopy(pod)

    def delete_pod_quietly(self, namespace: str, name: str) -> None:
        """Remove a pod without a watch event, as if the event was missed during a 410 gap."""
        with self._state.lock:
            self._state.pods.pop((namespace, name), None)
            self._state.resource_version += 1

    # -- watch history ----------------------------------------------------------------------

    def expire_history(self) -> None:
        """Forget all watch history: a watch resuming from an older version gets 410 Gone."""
        with self._state.lock:
            self._state.oldest_watchable = self._state.resource_version + 1
            self._state.resource_version += 1
            self._state.events.clear()

    def expire_list_tokens(self) -> None:
        """Forget paged lists in progress: their next page answers 410 Expired."""
        with self._state.lock:
            self._state.list_snapshots.clear()

    def break_watches_with_gone(self) -> None:
        """End every open watch with an ERROR event, code 410, and expire the history."""
        self.expire_history()
        with self._state.lock:
            self._state.gone_generation += 1
            self._state.lock.notify_all()

    def send_bookmark(self) -> int:
        """Send a BOOKMARK at a new version to watches that allow them; returns the version."""
        with self._state.lock:
            self._state.resource_version += 1
            version = self._state.resource_version
            marker = {
                "kind": "Pod",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(version)},
            }
            self._state.events.append((version, "BOOKMARK", marker))
            self._state.lock.notify_all()
            return version

    @property
    def open_watches(self) -> int:
        with self._state.lock:
            return self._state.open_watches

    # -- faults -----------------------------------------------------------------------------

    def fail(
        self,
        method: str,
        path: str,
        status: int,
        *,
        times: int | None = None,
        retry_after: int | None = None,
        cause: str | None = None,
    ) -> None:
        """Answer ``method path`` with ``status`` (a Status body) ``times`` times, or forever;
        a 500 is the real server's internal error, with ``cause`` (``internal_error``)."""
        with self._state.lock:
            self._state.faults.append(_Fault(method, path, status, times, retry_after, cause=cause))

    def hang(self, method: str, path: str, seconds: float, *, times: int | None = None) -> None:
        """Sleep ``seconds`` before answering ``method path`` (past the client's timeout)."""
        with self._state.lock:
            self._state.faults.append(_Fault(method, path, None, times, hang_seconds=seconds))

    def before(
        self, method: str, path: str, action: Callable[[], None], *, times: int | None = 1
    ) -> None:
        """Run ``action`` (a change made by someone else) when ``method path`` arrives, before
        answering it: the change lands between the client's read and its write."""
        with self._state.lock:
            self._state.faults.append(_Fault(method, path, None, times, action=action))

    def lose_answers(self, method: str, path: str, *, times: int | None = 1) -> None:
        """Carry out ``method path`` but send no answer (the client times out or sees the
        connection close), as when a create commits and its answer is lost on the way."""
        with self._state.lock:
            self._state.faults.append(_Fault(method, path, None, times, lose_answer=True))

    def clear_faults(self) -> None:
        with self._state.lock:
            self._state.faults.clear()

    # -- recording --------------------------------------------------------------------------

    def requests(self, method: str | None = None, path: str | None = None) -> list[RecordedRequest]:
        """Recorded requests, optionally only those with this method and/or exact path."""
        with self._state.lock:
            return [
                request
                for request in self._state.recorded
                if (method is None or request.method == method)
                and (path is None or request.path == path)
            ]

    def answers(self, method: str | None = None, path: str | None = None) -> list[int]:
        """The status codes of the answers sent (not watch streams), in order."""
        with self._state.lock:
            return [
                code
                for request, code in self._state.answered
                if (method is None or request.method == method)
                and (path is None or request.path == path)
            ]

    def clear_requests(self) -> None:
        with self._state.lock:
            self._state.recorded.clear()
            self._state.answered.clear()

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig for this server: plain http, bearer token authentication."""
        document = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "stand-in", "cluster": {"server": self.url}}],
            "users": [{"name": "profiler", "user": {"token": self.token}}],
            "contexts": [
                {"name": "stand-in", "context": {"cluster": "stand-in", "user": "profiler"}}
            ],
            "current-context": "stand-in",
        }
        path.write_text(yaml.safe_dump(document))
        return path


@contextlib.contextmanager
def running_apiserver(token: str | None = None) -> Iterator[StandInApiServer]:
    """A started stand-in API server, stopped on exit. Wire it into a fixture with::

    @pytest.fixture
    def apiserver() -> Iterator[StandInApiServer]:
        with running_apiserver() as server:
            yield server
    """
    server = StandInApiServer(token)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def wait_until(condition: Callable[[], bool], timeout: float = 5.0, interval: float = 0.02) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` passes; returns its last value."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return condition()
        time.sleep(interval)
    return True
