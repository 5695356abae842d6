"""The pods scheduled on this node, kept current by a Kubernetes list + watch in a thread.

The watcher lists pods with ``fieldSelector=spec.nodeName=<node>``, in pages of
``LIST_PAGE_SIZE`` (``limit`` + ``continue``; a list that repeats a continue token or runs past
``MAX_LIST_PAGES`` pages fails and backs off), then watches from the list's resourceVersion,
applying ADDED/MODIFIED/DELETED events and following BOOKMARKs. A watch that ends
(``timeout_seconds``) resumes from the last version seen; 410 Gone (history compacted, or a
continue token expired) means a fresh list; any other failure waits out the one back-off policy
(``profiler_app.core.backoff``, honouring Retry-After) and retries. ``snapshot()`` never blocks
on the network; ``listed()`` is None until the first list has completed. ``list_pods`` is the
paged list alone (``gpu-profiler unprotect`` lists every node's pods with it). Pods are parsed
from raw JSON: the typed models would cost far more per event and this needs a few fields.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Collection, Iterator, Mapping
from datetime import datetime
from typing import Any

import urllib3

from profiler_app.core.backoff import Backoff
from profiler_app.core.gpu_resources import DEFAULT_GPU_RESOURCES, GpuResources
from profiler_app.core.kube import (
    TRANSPORT_ERRORS,
    KubeConnection,
    describe,
    error_status,
    response_lines,
    retry_after_seconds,
)
from profiler_app.core.model import Identity, PodInfo
from profiler_app.profiles.engines import ContainerSpec, identify_pod
from profiler_app.profiles.workloads import WORKLOAD_LABEL_KEYS

log = logging.getLogger(__name__)

PODS_PATH = "/api/v1/pods"  # all namespaces; the field selector keeps this node's
# Pods per list page: a node holds a few hundred pods at most (kubelet's default maxPods is 110),
# so one page is the rule; paging bounds the answer should a selector ever match more.
LIST_PAGE_SIZE = 500
# An API server that keeps answering with a continue token (the same one again, or pages without
# end) would hold the list forever: past this many pages the list fails and backs off instead.
MAX_LIST_PAGES = 100


class WatchExpiredError(Exception):
    """The API server no longer has the history the watch resumes from (410 Gone)."""


class ListExpiredError(Exception):
    """A paged list's continue token expired (410) before its last page: list again."""


class ListPagingError(Exception):
    """A paged list did not end: a continue token came back twice, or pages ran past the bound."""


def _container_gpus(
    container: Mapping[str, Any], section: str, gpus: GpuResources = DEFAULT_GPU_RESOURCES
) -> int:
    """GPU devices of one container, whatever GPU resource it names (``gpu_resources``)."""
    return gpus.count((container.get("resources") or {}).get(section))


def _gpu_count(spec: Mapping[str, Any], section: str, gpus: GpuResources) -> int:
    """GPUs the pod reserves: app containers add up, init containers run one at a time."""

    def per_container(containers: Any) -> list[int]:
        return [_container_gpus(c, section, gpus) for c in containers or []]

    return max(
        sum(per_container(spec.get("containers"))), *per_container(spec.get("initContainers")), 0
    )


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _controller(metadata: Mapping[str, Any]) -> tuple[str, str]:
    """Kind and name of the pod's controller (the ownerReference marked ``controller``, else
    the first), or ("", "")."""
    owners = [owner for owner in metadata.get("ownerReferences") or [] if isinstance(owner, dict)]
    owner = next((o for o in owners if o.get("controller")), owners[0] if owners else {})
    return str(owner.get("kind") or ""), str(owner.get("name") or "")


def _words(value: Any) -> tuple[str, ...]:
    return tuple(str(word) for word in value) if isinstance(value, list) else ()


def _identity(spec: Mapping[str, Any], gpus: GpuResources) -> Identity | None:
    """What the pod's app containers run, by image and command (``engines``)."""
    containers = [c for c in spec.get("containers") or [] if isinstance(c, dict)]
    return identify_pod(
        [
            ContainerSpec(
                image=str(container.get("image") or ""),
                command=_words(container.get("command")),
                args=_words(container.get("args")),
                gpus=max(
                    _container_gpus(container, "requests", gpus),
                    _container_gpus(container, "limits", gpus),
                ),
            )
            for container in containers
        ]
    )


def pod_info(
    manifest: Mapping[str, Any],
    annotation_keys: Collection[str] = (),
    gpus: GpuResources = DEFAULT_GPU_RESOURCES,
) -> PodInfo:
    """Reduce a Pod's JSON to a PodInfo, keeping only ``annotation_keys`` of its annotations;
    ``gpus`` says which resources are GPUs. Raises KeyError when it has no uid or name."""
    metadata = manifest.get("metadata") or {}
    spec = manifest.get("spec") or {}
    status = manifest.get("status") or {}
    container_ids = {}
    for container in (status.get("containerStatuses") or []) + (
        status.get("initContainerStatuses") or []
    ):
        runtime_id = str(container.get("containerID") or "")
        if runtime_id:
            container_ids[runtime_id.rpartition("://")[2]] = str(container.get("name", ""))
    owner_kind, owner_name = _controller(metadata)
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    return PodInfo(
        uid=str(metadata["uid"]),
        namespace=str(metadata.get("namespace", "")),
        name=str(metadata["name"]),
        node=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or "Unknown"),
        start_time=_parse_time(status.get("startTime")),
        gpu_requests=_gpu_count(spec, "requests", gpus) or _gpu_count(spec, "limits", gpus),
        gpu_limits=_gpu_count(spec, "limits", gpus),
        container_ids=container_ids,
        owner_kind=owner_kind,
        owner_name=owner_name,
        labels={key: str(value) for key, value in labels.items() if key in WORKLOAD_LABEL_KEYS},
        annotations={
            key: str(annotations[key])
            for key in annotation_keys
            if annotations.get(key) is not None
        },
        identity=_identity(spec, gpus),
        host_network=spec.get("hostNetwork") is True,
    )


def _parse_or_skip(
    manifest: Mapping[str, Any],
    annotation_keys: Collection[str] = (),
    gpus: GpuResources = DEFAULT_GPU_RESOURCES,
) -> PodInfo | None:
    try:
        return pod_info(manifest, annotation_keys, gpus)
    except KeyError as missing:
        log.warning("ignoring a pod without %s in the API answer", missing)
        return None


def list_pods(
    connection: KubeConnection,
    *,
    field_selector: str | None = None,
    annotation_keys: Collection[str] = (),
    page_size: int = LIST_PAGE_SIZE,
    max_pages: int = MAX_LIST_PAGES,
    gpus: GpuResources = DEFAULT_GPU_RESOURCES,
) -> tuple[dict[str, PodInfo], str]:
    """The pods (all namespaces, ``field_selector`` applied) by uid and the list's
    resourceVersion, page by page: the pages are one snapshot, at the version the first one
    gives. Raises ListExpiredError when a continue token expires (410) between pages, and
    ListPagingError for a list that does not end."""
    pods = {}
    token: str | None = None
    seen: set[str] = set()
    for _ in range(max_pages):
        query: dict[str, str | int | None] = {
            "fieldSelector": field_selector,
            "limit": page_size,
            "continue": token,
        }
        try:
            document = connection.get_json(PODS_PATH, query=query)
        except TRANSPORT_ERRORS as error:
            if token is not None and error_status(error) == 410:
                raise ListExpiredError from None  # the continue token is too old
            raise
        for item in document.get("items") or []:
            if info := _parse_or_skip(item, annotation_keys, gpus):
                pods[info.uid] = info
        metadata = document.get("metadata") or {}
        token = metadata.get("continue") or None
        if token is None:
            return pods, str(metadata["resourceVersion"])
        if token in seen:
            raise ListPagingError(f"the pod list repeated a continue token on page {len(seen) + 1}")
        seen.add(token)
    raise ListPagingError(f"the pod list did not end after {max_pages} pages of {page_size}")


class PodWatcher:
    """Keeps the pods on ``node`` in memory: ``start()``, ``snapshot()`` any time, ``stop()``."""

    def __init__(
        self,
        connection: KubeConnection,
        node: str,
        *,
        watch_timeout_seconds: int = 30,
        backoff_initial: float = 1.0,
        backoff_max: float = 60.0,
        page_size: int = LIST_PAGE_SIZE,
        max_pages: int = MAX_LIST_PAGES,
        annotation_keys: Collection[str] = (),
        gpus: GpuResources = DEFAULT_GPU_RESOURCES,
    ) -> None:
        """``annotation_keys``: the annotations each pod's PodInfo keeps (no others); ``gpus``:
        which resources are GPUs."""
        self._connection = connection
        self._annotation_keys = frozenset(annotation_keys)
        self._gpus = gpus
        self.node = node
        self._selector = f"spec.nodeName={node}"
        self._watch_timeout = watch_timeout_seconds
        self._backoff = Backoff(backoff_initial, backoff_max)
        self._page_size = page_size
        self._max_pages = max_pages
        self._pods: dict[str, PodInfo] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._synced = threading.Event()
        self._response: urllib3.BaseHTTPResponse | None = None
        self._resource_version: str | None = None
        self._thread = threading.Thread(target=self._run, name="pod-watcher", daemon=True)
        self.relists = 0  # how often the full list ran; tests and debug logs read it

    # -- public ------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Ask the thread to end and interrupt a blocked watch read; waits at most ``timeout``."""
        self._stopping.set()
        with self._lock:
            response = self._response
        if response is not None:
            # Unblocks a read waiting on the socket in the watcher thread (urllib3 >= 2.3).
            response.shutdown()
        self._thread.join(timeout)

    def wait_until_synced(self, timeout: float) -> bool:
        """True once the first list has completed."""
        return self._synced.wait(timeout)

    def snapshot(self) -> list[PodInfo]:
        """The pods currently on the node, sorted by namespace and name."""
        with self._lock:
            pods = list(self._pods.values())
        return sorted(pods, key=lambda pod: (pod.namespace, pod.name))

    def listed(self) -> list[PodInfo] | None:
        """``snapshot()`` once the first list has completed; None before: nothing is known
        about the node's pods yet, not even that there are none."""
        return self.snapshot() if self._synced.is_set() else None

    # -- thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                if self._resource_version is None:
                    self._relist()
                self._watch()
                self._backoff.succeeded()
            except WatchExpiredError:
                log.info("pod watch on %s expired (410 Gone); listing again", self.node)
                self._resource_version = None
            except Exception as error:  # the thread must outlive any fault; it backs off instead
                if self._stopping.is_set():
                    break
                if error_status(error) == 410 and self._resource_version is not None:
                    self._resource_version = None  # some servers answer a stale watch with 410
                    continue
                delay = self._backoff.failed(retry_after_seconds(error))
                log.warning(
                    "pod watch on %s failed (%s); retrying in %.1fs",
                    self.node,
                    describe(error),
                    delay,
                )
                self._stopping.wait(delay)

    def _relist(self) -> None:
        try:
            pods, version = self._list()
        except ListExpiredError:
            log.info("pod list on %s expired between pages; listing again", self.node)
            pods, version = self._list()
        with self._lock:
            self._pods = pods
        self._resource_version = version
        self.relists += 1
        self._synced.set()
        log.debug(
            "listed %d pods on %s at version %s", len(pods), self.node, self._resource_version
        )

    def _list(self) -> tuple[dict[str, PodInfo], str]:
        return list_pods(
            self._connection,
            field_selector=self._selector,
            annotation_keys=self._annotation_keys,
            page_size=self._page_size,
            max_pages=self._max_pages,
            gpus=self._gpus,
        )

    def _watch(self) -> None:
        connect_timeout = self._connection.request_timeout[0]
        # The server ends the stream after timeout_seconds; reading longer only guards a hang.
        read_timeout = self._watch_timeout + self._connection.request_timeout[1]
        response = self._connection.request(
            "GET",
            PODS_PATH,
            query={
                "fieldSelector": self._selector,
                "watch": True,
                "allowWatchBookmarks": True,
                "resourceVersion": self._resource_version,
                "timeoutSeconds": self._watch_timeout,
            },
            timeout=(connect_timeout, read_timeout),
        )
        with self._lock:
            self._response = response
        try:
            if self._stopping.is_set():
                return
            for event in self._events(response):
                self._apply(event)
        finally:
            with self._lock:
                self._response = None
            response.release_conn()

    def _events(self, response: urllib3.BaseHTTPResponse) -> Iterator[Mapping[str, Any]]:
        for line in response_lines(response):
            if self._stopping.is_set():
                return
            event = json.loads(line)
            if not isinstance(event, dict):
                raise ValueError(f"watch event is not an object: {line[:80]!r}")
            yield event

    def _apply(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise WatchExpiredError
            raise ValueError(f"watch error {obj.get('code')}: {obj.get('message')}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        watched = kind in ("ADDED", "MODIFIED", "DELETED")
        info = _parse_or_skip(obj, self._annotation_keys, self._gpus) if watched else None
        if info is not None:
            with self._lock:
                if kind == "DELETED":
                    self._pods.pop(info.uid, None)
                else:
                    self._pods[info.uid] = info
        if version:
            self._resource_version = str(version)
