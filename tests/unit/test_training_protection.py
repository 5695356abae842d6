"""``karpenter.sh/do-not-disrupt`` on training pods (sinks/kubernetes/protection.py), through
KubernetesSink with ``protect_training``, against the stand-in API server (a test double, see
tests/support/apiserver.py: real HTTP, strategic-merge PATCH with null deleting a key) through the
real Kubernetes client. Time for back-off is a fake clock."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from profiler_app.kube import KubeConnection, KubernetesError
from profiler_app.model import CycleResult, PodUsage
from profiler_app.sinks.kubernetes import KubernetesSink
from tests.support.apiserver import StandInApiServer, pod_manifest, running_apiserver
from tests.support.clock import FakeClock
from tests.support.cycles import AT, gpu_profile, sample_cycle

NODE = "node-a"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
MARKER = "ai.centaurus.io/do-not-disrupt"
TRAINER_PATH = "/api/v1/namespaces/ml/pods/trainer-0"
PROTECTED = {DO_NOT_DISRUPT: "true", MARKER: "training"}


@pytest.fixture
def apiserver() -> Iterator[StandInApiServer]:
    with running_apiserver() as server:
        server.add_node(NODE)
        server.add_pod(pod_manifest("ml", "trainer-0", NODE, gpus=1, start_time=AT))
        yield server


def make_sink(
    connection: KubeConnection, clock: FakeClock, *, protect: bool = True
) -> KubernetesSink:
    return KubernetesSink(connection, NODE, clock=clock, protect_training=protect)


@pytest.fixture
def sink(connection: KubeConnection, clock: FakeClock) -> KubernetesSink:
    return make_sink(connection, clock)


def trainer_as(job_type: str) -> CycleResult:
    """The sample cycle with trainer-0's GPU classified as ``job_type`` (the pod still on it)."""
    result = sample_cycle(NODE)
    gpu0 = gpu_profile("0", job_type, namespace="ml", pod="trainer-0")
    return dataclasses.replace(result, gpus=[gpu0, result.gpus[1]])


def with_pod(result: CycleResult, usage: PodUsage, *, job_type: str = "training") -> CycleResult:
    """``result`` plus ``usage``'s pod, current on a GPU 2 classified as ``job_type``."""
    gpu = gpu_profile("2", job_type, namespace=usage.namespace, pod=usage.pod)
    return dataclasses.replace(result, gpus=[*result.gpus, gpu], pods=[*result.pods, usage])


def annotations(apiserver: StandInApiServer, namespace: str, pod: str) -> dict[str, str]:
    return dict(apiserver.pod(namespace, pod)["metadata"].get("annotations") or {})


def patches(apiserver: StandInApiServer, path: str = TRAINER_PATH) -> list[dict[str, object]]:
    """The annotation patches sent to ``path`` that touch do-not-disrupt."""
    sent = [
        request.json()["metadata"]["annotations"] for request in apiserver.requests("PATCH", path)
    ]
    return [patch for patch in sent if DO_NOT_DISRUPT in patch]


def test_training_pod_gets_do_not_disrupt_with_the_profilers_marker(
    apiserver: StandInApiServer, sink: KubernetesSink
) -> None:
    sink.publish(trainer_as("training"))

    on_pod = annotations(apiserver, "ml", "trainer-0")
    assert {key: on_pod.get(key) for key in PROTECTED} == PROTECTED
    assert patches(apiserver) == [PROTECTED]
    # The usage annotations are written as without the flag.
    assert on_pod["ai.centaurus.io/gpu-util-max"] == "90"


def test_protection_is_removed_when_the_job_stops_training(
    apiserver: StandInApiServer, sink: KubernetesSink
) -> None:
    sink.publish(trainer_as("training"))
    apiserver.clear_requests()

    sink.publish(trainer_as("idle"))  # allocated but idle: the job has stopped

    on_pod = annotations(apiserver, "ml", "trainer-0")
    assert DO_NOT_DISRUPT not in on_pod
    assert MARKER not in on_pod
    assert patches(apiserver) == [{DO_NOT_DISRUPT: None, MARKER: None}]
    # Read once before removing: whoever took the marker away took the annotation over.
    assert [r.method for r in apiserver.requests(path=TRAINER_PATH)] == ["GET", "PATCH"]


def test_protection_is_removed_when_the_pod_leaves_the_gpus(
    apiserver: StandInApiServer, sink: KubernetesSink
) -> None:
    sink.publish(trainer_as("training"))

    sink.publish(dataclasses.replace(trainer_as("idle"), gpus=[], pods=[]))

    assert DO_NOT_DISRUPT not in annotations(apiserver, "ml", "trainer-0")


@pytest.mark.parametrize("job_type", ["idle", "inference", "bursty"])
def test_gpus_that_do_not_train_get_no_protection(
    apiserver: StandInApiServer, sink: KubernetesSink, job_type: str
) -> None:
    sink.publish(trainer_as(job_type))
    sink.publish(trainer_as(job_type))

    assert DO_NOT_DISRUPT not in annotations(apiserver, "ml", "trainer-0")
    assert patches(apiserver) == []
    # One read, the first time the pod is seen (it might carry an earlier run's protection).
    assert [r.method for r in apiserver.requests("GET", TRAINER_PATH)] == ["GET"]


def test_pods_without_gpus_are_never_touched(
    apiserver: StandInApiServer, sink: KubernetesSink
) -> None:
    apiserver.add_pod(pod_manifest("web", "frontend", NODE))
    cpu_only = PodUsage("web", "frontend", NODE, AT, gpus=(), cpu_util_max=50.0)

    sink.publish(with_pod(trainer_as("training"), cpu_only))
    sink.publish(with_pod(trainer_as("idle"), cpu_only))

    assert apiserver.requests(path="/api/v1/namespaces/web/pods/frontend") == []
    assert annotations(apiserver, "web", "frontend") == {}


def test_unchanged_cycles_send_no_patch(apiserver: StandInApiServer, sink: KubernetesSink) -> None:
    sink.publish(trainer_as("training"))
    apiserver.clear_requests()

    for _ in range(3):
        sink.publish(trainer_as("training"))

    assert apiserver.requests(path=TRAINER_PATH) == []
    assert apiserver.requests("PATCH") == []


def test_a_do_not_disrupt_someone_else_set_is_left_alone(
    apiserver: StandInApiServer, sink: KubernetesSink
) -> None:
    apiserver.update_pod(
        "ml",
        "trainer-0",
        lambda pod: pod["metadata"]["annotations"].update({DO_NOT_DISRUPT: "true"}),
    )

    sink.publish(trainer_as("training"))
    sink.publish(trainer_as("idle"))
    sink.publish(dataclasses.replace(trainer_as("idle"), gpus=[], pods=[]))

    on_pod = annotations(apiserver, "ml", "trainer-0")
    assert on_pod[DO_NOT_DISRUPT] == "true"
    assert MARKER not in on_pod
    assert patches(apiserver) == []


def test_taking_the_marker_away_takes_the_annotation_over(
    apiserver: StandInApiServer, sink: KubernetesSink
) -> None:
    sink.publish(trainer_as("training"))
    apiserver.update_pod("ml", "trainer-0", lambda pod: pod["metadata"]["annotations"].pop(MARKER))

    sink.publish(trainer_as("idle"))

    assert annotations(apiserver, "ml", "trainer-0")[DO_NOT_DISRUPT] == "true"
    assert patches(apiserver) == [PROTECTED]  # only the first cycle's


def test_a_restarted_profiler_adopts_and_clears_what_an_earlier_run_set(
    apiserver: StandInApiServer, connection: KubeConnection, clock: FakeClock
) -> None:
    make_sink(connection, clock).publish(trainer_as("training"))
    apiserver.clear_requests()

    restarted = make_sink(connection, clock)
    restarted.publish(trainer_as("training"))
    assert patches(apiserver) == []  # still training: adopted as it is

    restarted.publish(trainer_as("inference"))
    assert DO_NOT_DISRUPT not in annotations(apiserver, "ml", "trainer-0")


def test_without_the_flag_do_not_disrupt_is_never_written_or_read(
    apiserver: StandInApiServer, connection: KubeConnection, clock: FakeClock
) -> None:
    sink = make_sink(connection, clock, protect=False)
    sink.publish(trainer_as("training"))

    assert DO_NOT_DISRUPT not in annotations(apiserver, "ml", "trainer-0")
    assert apiserver.requests("GET", TRAINER_PATH) == []


def test_a_pod_deleted_meanwhile_is_forgotten_quietly(
    apiserver: StandInApiServer, sink: KubernetesSink
) -> None:
    sink.publish(trainer_as("training"))
    apiserver.delete_pod("ml", "trainer-0")

    sink.publish(trainer_as("idle"))  # the GET before removing answers 404
    sink.publish(trainer_as("idle"))

    assert len(apiserver.requests("GET", TRAINER_PATH)) == 2  # first sight, then once more


def test_api_failure_backs_off_then_protects(
    apiserver: StandInApiServer, sink: KubernetesSink, clock: FakeClock
) -> None:
    apiserver.fail("GET", TRAINER_PATH, 503, times=1)

    with pytest.raises(KubernetesError, match="503"):
        sink.publish(trainer_as("training"))
    assert DO_NOT_DISRUPT not in annotations(apiserver, "ml", "trainer-0")

    clock.now += 10
    sink.publish(trainer_as("training"))
    assert annotations(apiserver, "ml", "trainer-0")[DO_NOT_DISRUPT] == "true"
