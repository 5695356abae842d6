"""The stand-in API server's request handler: real HTTP/1.1 on 127.0.0.1, shaped like the real
API server's answers.

- Bearer-token authentication (401 without the token); every request is recorded, and answered
  as the faults injected for its method and path say, if any (see ``server``).
- ``GET/PATCH /api/v1/nodes/{name}`` and ``GET/PATCH /api/v1/namespaces/{ns}/pods/{name}``;
  PATCH as ``patches`` applies and refuses it. A patch that changes nothing stores nothing.
- ``GET /api/v1/pods?fieldSelector=spec.nodeName=X`` lists pods with a ``resourceVersion``;
  with ``watch=true`` it streams watch events as chunked JSON lines from that version on, ends
  after ``timeoutSeconds``, and answers an ERROR event with code 410 (Gone) when the version
  is older than the retained history; BOOKMARK events to watches that allow them. A list with
  ``limit`` is paged: each page carries ``metadata.continue`` (and ``remainingItemCount``)
  until the last; every page comes from the snapshot the first one took, at its
  ``resourceVersion``, as etcd gives the real server. An unknown or expired token answers 410
  Expired.
- Errors are ``Status`` objects; anything else is 404.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import re
import secrets
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlsplit

from tests.support.apiserver.objects import Json, internal_error, status_object
from tests.support.apiserver.patches import RefusedPatchError, patched_object
from tests.support.apiserver.state import RecordedRequest, State, on_node

if TYPE_CHECKING:
    from tests.support.apiserver.server import Server

_NODE_PATH = re.compile(r"^/api/v1/nodes/([^/]+)$")
_POD_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)$")
_PODS_PATH = "/api/v1/pods"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # as Go servers do; avoids 40 ms delayed-ACK stalls
    server: Server

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: tests read ``requests`` instead."""

    @property
    def state(self) -> State:
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
            fault = self.state.take_fault(request)
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

    def _patch_object(self, request: RecordedRequest, kind: str, key: Any, current: Json) -> None:
        """Store ``current`` patched as ``request`` says (the caller holds the lock), unless the
        real server would refuse it (see ``patches``) or the patch changes nothing."""
        try:
            patched = patched_object(request, kind, current)
        except RefusedPatchError as refusal:
            self._send_json(refusal.code, refusal.status)
            return
        if patched == current:
            # A no-op: no new resourceVersion, no watch event (kubernetes@v1.35.0
            # staging/src/k8s.io/apiserver/pkg/storage/etcd3/store.go ``GuaranteedUpdate``
            # skips the write when the object is unchanged).
            self._send_json(200, current)
            return
        self.state.commit(kind, key, patched)
        self._send_json(200, patched)

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
                    copy.deepcopy(pod) for pod in self.state.pods.values() if on_node(pod, node)
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
                backlog = [("ADDED", pod) for pod in state.pods.values() if on_node(pod, node)]
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
                        kind != "BOOKMARK" and on_node(pod, node)
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
