"""The node and pods the training protector's tests protect, on the stand-in API server (a test
double, see tests/support/apiserver/: real HTTP, real pod objects with UIDs, nodeName and
resourceVersions; strategic-merge and JSON patches with the real server's preconditions).

Each cycle's ``node_pods`` is what a synced pod watcher shows: the stand-in's pods on the node,
parsed as the watcher parses them (``watched``), or an older view where a test needs the
watcher to lag behind the server."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta

from profiler_app.core.model import CycleResult, PodInfo
from profiler_app.sinks.kubernetes.protection import watched_annotations
from profiler_app.sources.kube_pods import pod_info
from tests.support.apiserver.objects import pod_manifest
from tests.support.apiserver.server import StandInApiServer, running_apiserver
from tests.support.cycles import AT, gpu_profile

NODE = "node-a"
DOMAIN = "ai.centaurus.io"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
MARKER = f"{DOMAIN}/do-not-disrupt"
TRAINER_PATH = "/api/v1/namespaces/ml/pods/trainer-0"
PROTECTED = {DO_NOT_DISRUPT: "true", MARKER: "training"}
WINDOW = 1800.0
STARTED = AT - timedelta(hours=2)  # longer ago than the window: the classifier has judged it


@contextlib.contextmanager
def trainer_node() -> Iterator[StandInApiServer]:
    """The stand-in API server with node-a and ml/trainer-0 on it, for a module's ``apiserver``."""
    with running_apiserver() as server:
        server.add_node(NODE)
        server.add_pod(pod_manifest("ml", "trainer-0", NODE, gpus=1, start_time=STARTED))
        yield server


def watched(apiserver: StandInApiServer, node: str = NODE) -> tuple[PodInfo, ...]:
    """The node's pods as a synced watcher has them now."""
    keys = watched_annotations(DOMAIN)
    return tuple(pod_info(pod, keys) for pod in apiserver.pods(node))


def cycle(
    apiserver: StandInApiServer,
    training: tuple[str, ...] = ("trainer-0",),
    *,
    view: tuple[PodInfo, ...] | None = None,
    at_offset: float = 0.0,
) -> CycleResult:
    """A cycle in which the pods named in ``training`` (namespace ml) are on training GPUs and
    every other pod of the node on an idle one."""
    pods = watched(apiserver) if view is None else view
    names = sorted({pod.name for pod in pods} | set(training))
    gpus = [
        gpu_profile(
            str(index),
            "training" if name in training else "idle",
            namespace="ml",
            pod=name,
        )
        for index, name in enumerate(names)
    ]
    return CycleResult(
        node=NODE,
        at=AT + timedelta(seconds=at_offset),
        window_seconds=WINDOW,
        gpus=gpus,
        node_pods=pods,
    )


def annotations(apiserver: StandInApiServer, pod: str = "trainer-0") -> dict[str, str]:
    return dict(apiserver.pod("ml", pod)["metadata"].get("annotations") or {})


def set_annotations(
    apiserver: StandInApiServer, changes: dict[str, str | None], pod: str = "trainer-0"
) -> None:
    def change(manifest: dict[str, object]) -> None:
        current = manifest["metadata"]["annotations"]  # type: ignore[index]
        for key, value in changes.items():
            if value is None:
                current.pop(key, None)
            else:
                current[key] = value

    apiserver.update_pod("ml", pod, change)


def methods(apiserver: StandInApiServer, path: str = TRAINER_PATH) -> list[str]:
    return [request.method for request in apiserver.requests(path=path)]
