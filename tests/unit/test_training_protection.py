"""``karpenter.sh/do-not-disrupt`` on training pods (sinks/kubernetes/protection.py), against the
stand-in API server (a test double, see tests/support/apiserver/: real HTTP, real pod objects
with UIDs, nodeName and resourceVersions; strategic-merge and JSON patches with the real
server's preconditions) through the real Kubernetes client.

Each cycle's ``node_pods`` is what a synced pod watcher shows: the stand-in's pods on the node,
parsed as the watcher parses them (``watched``), or an older view where a test needs the
watcher to lag behind the server."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from profiler_app.kube import KubeConnection, connect
from profiler_app.model import CycleResult, PodInfo
from profiler_app.sinks.kubernetes.protection import (
    PodsUnprotectedError,
    TrainingProtector,
    watched_annotations,
)
from profiler_app.sources.kube_pods import pod_info
from tests.support.apiserver.objects import pod_manifest, webhook_down
from tests.support.apiserver.patches import JSON_PATCH, STRATEGIC_MERGE_PATCH
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


@pytest.fixture
def apiserver() -> Iterator[StandInApiServer]:
    with running_apiserver() as server:
        server.add_node(NODE)
        server.add_pod(pod_manifest("ml", "trainer-0", NODE, gpus=1, start_time=STARTED))
        yield server


@pytest.fixture
def protector(connection: KubeConnection) -> TrainingProtector:
    return TrainingProtector(connection, NODE, domain=DOMAIN)


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


# -- the rules ---------------------------------------------------------------------------------


def test_a_training_pod_is_read_then_protected_with_uid_and_version_preconditions(
    apiserver: StandInApiServer, protector: TrainingProtector
) -> None:
    pod = apiserver.pod("ml", "trainer-0")

    protector.publish(cycle(apiserver))

    assert annotations(apiserver) == PROTECTED
    get, patch = apiserver.requests(path=TRAINER_PATH)
    assert (get.method, patch.method, patch.content_type) == ("GET", "PATCH", STRATEGIC_MERGE_PATCH)
    assert patch.json() == {
        "metadata": {
            "uid": pod["metadata"]["uid"],
            "resourceVersion": pod["metadata"]["resourceVersion"],
            "annotations": PROTECTED,
        }
    }


def test_protection_is_removed_with_a_json_patch_that_tests_what_was_read(
    apiserver: StandInApiServer, protector: TrainingProtector
) -> None:
    protector.publish(cycle(apiserver))
    apiserver.clear_requests()

    protector.publish(cycle(apiserver, training=()))  # allocated but idle: the job stopped

    assert annotations(apiserver) == {}
    get, patch = apiserver.requests(path=TRAINER_PATH)
    assert (get.method, patch.content_type) == ("GET", JSON_PATCH)
    uid = apiserver.pod("ml", "trainer-0")["metadata"]["uid"]
    assert patch.json() == [
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {
            "op": "test",
            "path": "/metadata/annotations/ai.centaurus.io~1do-not-disrupt",
            "value": "training",
        },
        {
            "op": "test",
            "path": "/metadata/annotations/karpenter.sh~1do-not-disrupt",
            "value": "true",
        },
        {"op": "remove", "path": "/metadata/annotations/karpenter.sh~1do-not-disrupt"},
        {"op": "remove", "path": "/metadata/annotations/ai.centaurus.io~1do-not-disrupt"},
    ]


@pytest.mark.parametrize("job_type", ["idle", "inference", "bursty"])
def test_gpus_that_do_not_train_cost_no_request(
    apiserver: StandInApiServer, protector: TrainingProtector, job_type: str
) -> None:
    result = cycle(apiserver, training=())
    result = dataclasses.replace(
        result, gpus=[dataclasses.replace(gpu, job_type=job_type) for gpu in result.gpus]
    )
    protector.publish(result)
    protector.publish(result)

    assert annotations(apiserver) == {}
    assert apiserver.requests(path=TRAINER_PATH) == []  # the watcher's view says it all


def test_unchanged_cycles_send_nothing(
    apiserver: StandInApiServer, protector: TrainingProtector
) -> None:
    protector.publish(cycle(apiserver))
    apiserver.clear_requests()
    for _ in range(3):
        protector.publish(cycle(apiserver))
    assert apiserver.requests() == []


def test_pods_without_gpus_and_finished_pods_are_not_protected(
    apiserver: StandInApiServer, protector: TrainingProtector
) -> None:
    apiserver.add_pod(pod_manifest("ml", "frontend", NODE, start_time=STARTED))
    apiserver.add_pod(
        pod_manifest("ml", "done", NODE, gpus=1, phase="Succeeded", start_time=STARTED)
    )
    protector.publish(cycle(apiserver, training=("trainer-0", "frontend", "done")))

    assert annotations(apiserver, "frontend") == {}
    assert annotations(apiserver, "done") == {}
    assert apiserver.requests(path="/api/v1/namespaces/ml/pods/frontend") == []


def test_a_pod_that_finished_is_released(
    apiserver: StandInApiServer, protector: TrainingProtector
) -> None:
    protector.publish(cycle(apiserver))
    apiserver.update_pod("ml", "trainer-0", lambda pod: pod["status"].update(phase="Succeeded"))

    protector.publish(cycle(apiserver))  # its GPU's last samples still say training

    assert annotations(apiserver) == {}


@pytest.mark.parametrize("value", ["true", "false"])
def test_a_do_not_disrupt_someone_else_set_is_never_changed(
    apiserver: StandInApiServer, protector: TrainingProtector, value: str
) -> None:
    set_annotations(apiserver, {DO_NOT_DISRUPT: value})

    protector.publish(cycle(apiserver))
    protector.publish(cycle(apiserver, training=()))
    protector.publish(cycle(apiserver))

    assert annotations(apiserver) == {DO_NOT_DISRUPT: value}
    assert apiserver.requests("PATCH") == []


def test_a_persons_annotation_the_watcher_has_not_seen_yet_is_read_and_left_alone(
    apiserver: StandInApiServer, protector: TrainingProtector
) -> None:
    """The first sight was not training; a person set do-not-disrupt; the watcher still shows
    the pod without it when training starts: the read before the write finds it."""
    protector.publish(cycle(apiserver, training=()))
    stale = watched(apiserver)
    set_annotations(apiserver, {DO_NOT_DISRUPT: "true"})

    protector.publish(cycle(apiserver, view=stale))
    protector.publish(cycle(apiserver, training=()))

    assert annotations(apiserver) == {DO_NOT_DISRUPT: "true"}
    assert apiserver.requests("PATCH") == []
    assert methods(apiserver) == ["GET"]


def test_a_change_between_the_read_and_the_write_fails_the_patch_with_409(
    apiserver: StandInApiServer, protector: TrainingProtector
) -> None:
    """A person's annotation lands after the protector read the pod: the strategic merge
    carrying the read resourceVersion is refused (409), the pod is read again, and the person's
    annotation stays."""
    apiserver.before(
        "PATCH", TRAINER_PATH, lambda: set_annotations(apiserver, {DO_NOT_DISRUPT: "false"})
    )

    protector.publish(cycle(apiserver))

    assert apiserver.answers(path=TRAINER_PATH) == [200, 409, 200]
    assert methods(apiserver) == ["GET", "PATCH", "GET"]
    assert annotations(apiserver) == {DO_NOT_DISRUPT: "false"}


def test_taking_the_marker_away_takes_the_annotation_over(
    apiserver: StandInApiServer, protector: TrainingProtector
) -> None:
    protector.publish(cycle(apiserver))
    set_annotations(apiserver, {MARKER: None})

    protector.publish(cycle(apiserver, training=()))

    assert annotations(apiserver) == {DO_NOT_DISRUPT: "true"}


def test_a_marker_beside_someone_elses_value_is_removed_alone(
    apiserver: StandInApiServer, protector: TrainingProtector
) -> None:
    protector.publish(cycle(apiserver))
    set_annotations(apiserver, {DO_NOT_DISRUPT: "false"})  # a person said otherwise

    protector.publish(cycle(apiserver))

    assert annotations(apiserver) == {DO_NOT_DISRUPT: "false"}


def test_protection_taken_away_while_training_comes_back(
    apiserver: StandInApiServer, protector: TrainingProtector
) -> None:
    protector.publish(cycle(apiserver))
    set_annotations(apiserver, {DO_NOT_DISRUPT: None, MARKER: None})

    protector.publish(cycle(apiserver))

    assert annotations(apiserver) == PROTECTED


def test_a_restarted_profiler_adopts_then_clears_what_an_earlier_run_set(
    apiserver: StandInApiServer, protector: TrainingProtector, connection: KubeConnection
) -> None:
    protector.publish(cycle(apiserver))
    apiserver.clear_requests()

    restarted = TrainingProtector(connection, NODE, domain=DOMAIN)
    restarted.publish(cycle(apiserver))
    assert apiserver.requests() == []  # still training: adopted as it is

    restarted.publish(cycle(apiserver, training=()))
    assert annotations(apiserver) == {}


# -- pods are addressed by UID, on this node only ----------------------------------------------


def test_a_pod_recreated_under_the_same_name_is_protected_on_its_own(
    apiserver: StandInApiServer, protector: TrainingProtector
) -> None:
    protector.publish(cycle(apiserver))
    old_view = watched(apiserver)
    later = STARTED + timedelta(minutes=5)
    apiserver.recreate_pod(pod_manifest("ml", "trainer-0", NODE, gpus=1, start_time=later))
    apiserver.clear_requests()

    protector.publish(cycle(apiserver, view=old_view, training=()))  # the watcher lags
    assert annotations(apiserver) == {}  # the new pod was not touched for the old one
    assert apiserver.requests("PATCH") == []

    protector.publish(cycle(apiserver))
    assert annotations(apiserver) == PROTECTED


def test_a_pod_recreated_between_the_read_and_the_write_is_not_released(
    apiserver: StandInApiServer, protector: TrainingProtector
) -> None:
    """The JSON patch tests the UID read: a pod of the same name created in between (and
    protected by someone) makes it fail with 422, and the read after finds another pod."""
    protector.publish(cycle(apiserver))
    successor = pod_manifest("ml", "trainer-0", NODE, gpus=1, start_time=AT)
    successor["metadata"]["annotations"] = dict(PROTECTED)
    apiserver.before("PATCH", TRAINER_PATH, lambda: apiserver.recreate_pod(successor))

    protector.publish(cycle(apiserver, training=()))

    assert apiserver.answers("PATCH", TRAINER_PATH)[-1] == 422
    assert annotations(apiserver) == PROTECTED
    assert apiserver.pod("ml", "trainer-0")["metadata"]["uid"] == successor["metadata"]["uid"]


def test_a_pod_of_the_same_name_on_another_node_is_never_read_or_written(
    apiserver: StandInApiServer, protector: TrainingProtector
) -> None:
    protector.publish(cycle(apiserver))
    old_view = watched(apiserver)
    moved = pod_manifest("ml", "trainer-0", "node-b", gpus=1, start_time=AT)
    moved["metadata"]["annotations"] = dict(PROTECTED)  # node-b's profiler protects it
    apiserver.recreate_pod(moved)
    apiserver.clear_requests()

    protector.publish(cycle(apiserver, view=old_view, training=()))  # a lagging watcher
    protector.publish(cycle(apiserver, training=()))  # it no longer lists the pod

    assert annotations(apiserver) == PROTECTED
    assert apiserver.requests("PATCH") == []
    assert methods(apiserver) == ["GET"]  # the lagging view's one read, which found node-b


def test_nothing_is_done_before_the_watchers_first_list(
    apiserver: StandInApiServer, protector: TrainingProtector
) -> None:
    protector.publish(dataclasses.replace(cycle(apiserver), node_pods=None))
    assert apiserver.requests() == []


# -- protecting early, by the owner ------------------------------------------------------------


def owned_pod(apiserver: StandInApiServer, kind: str, started: float) -> None:
    apiserver.add_pod(
        pod_manifest(
            "ml",
            "worker-0",
            NODE,
            gpus=1,
            start_time=AT - timedelta(seconds=started),
            owner=(kind, "llama"),
        )
    )


@pytest.mark.parametrize("kind", ["PyTorchJob", "Job"])
def test_a_training_workloads_pod_is_protected_from_its_first_cycle(
    apiserver: StandInApiServer, protector: TrainingProtector, kind: str
) -> None:
    owned_pod(apiserver, kind, started=60)  # a minute old, still loading its data

    protector.publish(cycle(apiserver, training=()))
    assert annotations(apiserver, "worker-0") == {DO_NOT_DISRUPT: "true", MARKER: "owner"}

    protector.publish(cycle(apiserver, training=("worker-0",)))  # the classifier confirms
    assert annotations(apiserver, "worker-0") == {DO_NOT_DISRUPT: "true", MARKER: "training"}
    patch = apiserver.requests("PATCH", "/api/v1/namespaces/ml/pods/worker-0")[-1]
    assert patch.content_type == JSON_PATCH
    assert patch.json()[-1] == {
        "op": "replace",
        "path": "/metadata/annotations/ai.centaurus.io~1do-not-disrupt",
        "value": "training",
    }


def test_owner_based_protection_ends_when_a_whole_window_did_not_train(
    apiserver: StandInApiServer, protector: TrainingProtector
) -> None:
    owned_pod(apiserver, "PyTorchJob", started=WINDOW - 60)
    protector.publish(cycle(apiserver, training=()))
    assert annotations(apiserver, "worker-0")[MARKER] == "owner"

    protector.publish(cycle(apiserver, training=(), at_offset=120))  # judged: it idles

    assert annotations(apiserver, "worker-0") == {}


def test_serving_workloads_are_not_protected_early(
    apiserver: StandInApiServer, protector: TrainingProtector
) -> None:
    owned_pod(apiserver, "ReplicaSet", started=60)
    protector.publish(cycle(apiserver, training=()))
    assert annotations(apiserver, "worker-0") == {}


# -- release mode, failures ---------------------------------------------------------------------


def test_release_mode_removes_the_profilers_marks_and_sets_none(
    apiserver: StandInApiServer, protector: TrainingProtector, connection: KubeConnection
) -> None:
    protector.publish(cycle(apiserver))
    apiserver.add_pod(pod_manifest("ml", "person", NODE, gpus=1, start_time=STARTED))
    set_annotations(apiserver, {DO_NOT_DISRUPT: "true"}, pod="person")

    TrainingProtector(connection, NODE, domain=DOMAIN, release_only=True).publish(
        cycle(apiserver, training=("trainer-0", "person"))
    )

    assert annotations(apiserver) == {}
    assert annotations(apiserver, "person") == {DO_NOT_DISRUPT: "true"}


def test_a_pod_deleted_meanwhile_is_skipped_quietly(
    apiserver: StandInApiServer, protector: TrainingProtector
) -> None:
    view = watched(apiserver)
    apiserver.delete_pod("ml", "trainer-0")
    protector.publish(cycle(apiserver, view=view))  # the GET answers 404
    assert apiserver.requests("PATCH") == []


class Clock:
    """Monotonic seconds the test moves on."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def timed(connection: KubeConnection, clock: Clock) -> TrainingProtector:
    """A protector on a 30 s interval and the test's clock."""
    return TrainingProtector(connection, NODE, domain=DOMAIN, interval_seconds=30.0, clock=clock)


def test_one_pods_refusal_does_not_stop_the_others(
    apiserver: StandInApiServer, timed: TrainingProtector
) -> None:
    apiserver.add_pod(pod_manifest("ml", "trainer-1", NODE, gpus=1, start_time=STARTED))
    apiserver.fail("PATCH", TRAINER_PATH, 403)

    with pytest.raises(PodsUnprotectedError, match=r"trainer-0.*403") as raised:
        timed.publish(cycle(apiserver, training=("trainer-0", "trainer-1")))

    assert annotations(apiserver, "trainer-1") == PROTECTED
    assert list(raised.value.failing) == ["ml/trainer-0"]
    assert raised.value.attempts == 1


@pytest.mark.parametrize(
    ("method", "status"), [("PATCH", 500), ("PATCH", 503), ("PATCH", 429), ("GET", 500)]
)
def test_a_pod_that_answers_a_server_error_does_not_stop_the_pods_after_it(
    apiserver: StandInApiServer, timed: TrainingProtector, clock: Clock, method: str, status: int
) -> None:
    """aaa/old (first in the order, idle, with a stale mark of the profiler's) sits behind a
    fail-closed webhook that is down: ml/trainer-0 is protected all the same, and aaa/old is
    tried again once its own back-off is over, not every cycle."""
    old = pod_manifest("aaa", "old", NODE, gpus=1, start_time=STARTED, annotations=PROTECTED)
    apiserver.add_pod(old)
    old_path = "/api/v1/namespaces/aaa/pods/old"
    apiserver.fail(
        method, old_path, status, cause=webhook_down("guard.example.com", "guard.aaa.svc")
    )

    with pytest.raises(PodsUnprotectedError, match=rf"aaa/old \(HTTP {status}") as raised:
        timed.publish(cycle(apiserver))
    assert annotations(apiserver) == PROTECTED
    assert raised.value.attempts == 1

    tried = len(apiserver.requests(method, old_path))
    clock.now += 29  # within aaa/old's back-off: not tried, still reported
    with pytest.raises(PodsUnprotectedError) as raised:
        timed.publish(cycle(apiserver))
    assert len(apiserver.requests(method, old_path)) == tried
    assert raised.value.attempts == 0
    assert raised.value.failing == {"aaa/old": f"HTTP {status} {_reason(status)}, 1 in a row"}

    apiserver.clear_faults()
    clock.now += 2
    timed.publish(cycle(apiserver))  # tried again, released: nothing fails any more
    assert apiserver.pod("aaa", "old")["metadata"]["annotations"] == {}


def _reason(status: int) -> str:
    return {500: "Internal Server Error", 503: "Service Unavailable", 429: "Too Many Requests"}[
        status
    ]


def test_a_pod_whose_patch_times_out_waits_alone(
    apiserver: StandInApiServer, clock: Clock, tmp_path: Path
) -> None:
    fast = connect(str(apiserver.write_kubeconfig(tmp_path / "kc")), request_timeout=(1.0, 0.3))
    assert fast is not None
    protector = TrainingProtector(fast, NODE, domain=DOMAIN, clock=clock)
    apiserver.add_pod(pod_manifest("ml", "a-slow", NODE, gpus=1, start_time=STARTED))
    apiserver.hang("PATCH", "/api/v1/namespaces/ml/pods/a-slow", seconds=1.0, times=1)
    try:
        with pytest.raises(PodsUnprotectedError, match="ml/a-slow"):
            protector.publish(cycle(apiserver, training=("a-slow", "trainer-0")))
    finally:
        fast.close()
    assert annotations(apiserver) == PROTECTED


def test_the_server_asks_for_longer_retry_after_and_is_obeyed_for_that_pod(
    apiserver: StandInApiServer, timed: TrainingProtector, clock: Clock
) -> None:
    apiserver.fail("GET", TRAINER_PATH, 503, times=1, retry_after=70)

    with pytest.raises(PodsUnprotectedError, match="503"):
        timed.publish(cycle(apiserver))
    assert annotations(apiserver) == {}

    clock.now += 60
    with pytest.raises(PodsUnprotectedError):
        timed.publish(cycle(apiserver))
    assert annotations(apiserver) == {}
    clock.now += 11
    timed.publish(cycle(apiserver))
    assert annotations(apiserver) == PROTECTED


# -- without the GPU series (the metrics source failed) ------------------------------------------


def blind(apiserver: StandInApiServer) -> CycleResult:
    """A cycle whose GPU series could not be read: the pods alone."""
    return dataclasses.replace(cycle(apiserver, training=()), gpus=[], gpus_read=False)


def test_without_metrics_marks_stay_owner_pods_are_protected_and_finished_ones_released(
    apiserver: StandInApiServer, protector: TrainingProtector
) -> None:
    protector.publish(cycle(apiserver))  # trainer-0 trains
    owned_pod(apiserver, "PyTorchJob", started=60)
    apiserver.add_pod(pod_manifest("ml", "done", NODE, gpus=1, annotations=PROTECTED))
    apiserver.update_pod("ml", "done", lambda pod: pod["status"].update(phase="Succeeded"))

    protector.publish(blind(apiserver))

    assert annotations(apiserver) == PROTECTED  # no verdict: kept
    assert annotations(apiserver, "worker-0") == {DO_NOT_DISRUPT: "true", MARKER: "owner"}
    assert annotations(apiserver, "done") == {}


@pytest.mark.parametrize(
    "resource",
    [
        "nvidia.com/gpu",
        "nvidia.com/gpu.shared",
        "nvidia.com/mig-3g.40gb",
        "nvidia.com/mig-1g.10gb.shared",
    ],
)
def test_pods_on_every_gpu_resource_are_protected(
    apiserver: StandInApiServer, protector: TrainingProtector, resource: str
) -> None:
    apiserver.add_pod(
        pod_manifest("ml", "sliced", NODE, gpus=1, gpu_resource=resource, start_time=STARTED)
    )
    protector.publish(cycle(apiserver, training=("sliced",)))
    assert annotations(apiserver, "sliced") == PROTECTED


def test_a_pod_requesting_no_gpu_resource_is_not_protected(
    apiserver: StandInApiServer, protector: TrainingProtector
) -> None:
    apiserver.add_pod(
        pod_manifest("ml", "fpga", NODE, gpus=1, gpu_resource="xilinx.com/fpga", start_time=STARTED)
    )
    protector.publish(cycle(apiserver, training=("fpga",)))
    assert annotations(apiserver, "fpga") == {}
