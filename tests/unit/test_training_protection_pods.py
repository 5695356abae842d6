"""``karpenter.sh/do-not-disrupt`` on training pods (sinks/kubernetes/protection.py): which pods.
Pods are addressed by UID on this node only (recreated, or of the same name on another node),
nothing is done before the watcher's first list; a training workload's pod is protected by its
owner before the classifier has judged it; without the GPU series marks stay, owners protect
and finished pods are released; pods on every GPU resource are protected, others not.

Against the stand-in API server through the real Kubernetes client: tests/support/protected_pods.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import timedelta

import pytest

from profiler_app.core.model import CycleResult
from profiler_app.sinks.kubernetes.protection import TrainingProtector
from tests.support.apiserver.objects import pod_manifest
from tests.support.apiserver.patches import JSON_PATCH
from tests.support.apiserver.server import StandInApiServer
from tests.support.cycles import AT
from tests.support.protected_pods import (
    DO_NOT_DISRUPT,
    MARKER,
    NODE,
    PROTECTED,
    STARTED,
    TRAINER_PATH,
    WINDOW,
    annotations,
    cycle,
    methods,
    trainer_node,
    watched,
)


@pytest.fixture
def apiserver() -> Iterator[StandInApiServer]:
    with trainer_node() as server:
        yield server


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
