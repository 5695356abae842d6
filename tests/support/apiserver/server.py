"""``StandInApiServer``: owns the stand-in API server's thread and offers the knobs tests turn.

Objects: nodes and pods are added, changed and deleted as someone with kubectl or a controller
would (a watch sees each change); ``recreate_pod`` deletes a pod and creates one of the same
name with a new UID, as a StatefulSet or a training operator does. Watch history can be
expired (``expire_history``, ``break_watches_with_gone``), paged lists forgotten
(``expire_list_tokens``), and BOOKMARKs sent (``send_bookmark``).

Every request is recorded (``requests``, and the status of each answer in ``answers``) so
tests can count calls per cycle, and faults can be injected per method and path: an error status
N times or forever (``fail``; a 500 is the real ``InternalError``, see ``internal_error``), a
hang longer than the client's timeout (``hang``), someone else's change landing just before the
request is answered (``before``), or a request carried out whose answer never arrives
(``lose_answers``).
"""

from __future__ import annotations

import contextlib
import copy
import secrets
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from tests.support.apiserver.handler import Handler
from tests.support.apiserver.objects import GPU_RESOURCE, Json
from tests.support.apiserver.state import Fault, RecordedRequest, State, on_node


class Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, state: State) -> None:
        self.state = state
        super().__init__(("127.0.0.1", 0), Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients hanging up (timeouts, ``stop()``) are normal here; report anything else."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class StandInApiServer:
    """Owns the server thread and offers the knobs tests turn. Use ``running_apiserver()``."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token or f"dummy-{secrets.token_hex(8)}"
        self._state = State(token=self.token)
        self._server = Server(self._state)
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
            self._state.commit("nodes", name, node, event=None)
            return copy.deepcopy(node)

    def update_node(self, name: str, change: Callable[[Json], None]) -> Json:
        """Apply ``change`` to the stored node, as someone with kubectl might."""
        with self._state.lock:
            node = copy.deepcopy(self._state.nodes[name])
            change(node)
            self._state.commit("nodes", name, node, event=None)
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
            self._state.commit("pods", key, pod, event="ADDED")
            return copy.deepcopy(pod)

    def update_pod(self, namespace: str, name: str, change: Callable[[Json], None]) -> Json:
        """Apply ``change`` to the stored pod (a watch sees MODIFIED)."""
        with self._state.lock:
            pod = copy.deepcopy(self._state.pods[(namespace, name)])
            change(pod)
            self._state.commit("pods", (namespace, name), pod)
            return copy.deepcopy(pod)

    def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod (a watch sees DELETED)."""
        with self._state.lock:
            pod = self._state.pods[(namespace, name)]
            self._state.commit("pods", (namespace, name), pod, event="DELETED")

    def pod(self, namespace: str, name: str) -> Json:
        with self._state.lock:
            return copy.deepcopy(self._state.pods[(namespace, name)])

    def pods(self, node: str | None = None) -> list[Json]:
        """Every pod (on ``node``), as a list would return them."""
        with self._state.lock:
            return [copy.deepcopy(pod) for pod in self._state.pods.values() if on_node(pod, node)]

    def recreate_pod(self, manifest: Json) -> Json:
        """Delete the pod of ``manifest``'s name, if any, then create ``manifest`` (give it a new
        ``uid``): a watch sees DELETED, then ADDED."""
        key = (manifest["metadata"]["namespace"], manifest["metadata"]["name"])
        with self._state.lock:
            if key in self._state.pods:
                self._state.commit("pods", key, self._state.pods[key], event="DELETED")
            pod = copy.deepcopy(manifest)
            self._state.commit("pods", key, pod, event="ADDED")
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
            self._state.faults.append(Fault(method, path, status, times, retry_after, cause=cause))

    def hang(self, method: str, path: str, seconds: float, *, times: int | None = None) -> None:
        """Sleep ``seconds`` before answering ``method path`` (past the client's timeout)."""
        with self._state.lock:
            self._state.faults.append(Fault(method, path, None, times, hang_seconds=seconds))

    def before(
        self, method: str, path: str, action: Callable[[], None], *, times: int | None = 1
    ) -> None:
        """Run ``action`` (a change made by someone else) when ``method path`` arrives, before
        answering it: the change lands between the client's read and its write."""
        with self._state.lock:
            self._state.faults.append(Fault(method, path, None, times, action=action))

    def lose_answers(self, method: str, path: str, *, times: int | None = 1) -> None:
        """Carry out ``method path`` but send no answer (the client times out or sees the
        connection close), as when a create commits and its answer is lost on the way."""
        with self._state.lock:
            self._state.faults.append(Fault(method, path, None, times, lose_answer=True))

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
