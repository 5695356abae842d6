"""``karpenter.sh/do-not-disrupt`` on training pods (sinks/kubernetes/protection.py): the rules.
A training pod is read, then protected with the UID and resourceVersion read as preconditions,
and released with a JSON patch testing what was read; no request without a change; a person's
do-not-disrupt is never changed, and taking the marker away hands it over; a restarted profiler
adopts what an earlier run set; release mode removes the profiler's marks alone.

Against the stand-in API server through the real Kubernetes client: tests/support/protected_pods.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from profiler_app.core.kube import KubeConnection
from profiler_app.sinks.kubernetes.protection import TrainingProtector
from tests.support.apiserver.objects import pod_manifest
from tests.support.apiserver.patches import JSON_PATCH, STRATEGIC_MERGE_PATCH
from tests.support.apiserver.server import StandInApiServer
from tests.support.protected_pods import (
    DO_NOT_DISRUPT,
    DOMAIN,
    MARKER,
    NODE,
    PROTECTED,
    STARTED,
    TRAINER_PATH,
    annotations,
    cycle,
    methods,
    set_annotations,
    trainer_node,
    watched,
)


@pytest.fixture
def apiserver() -> Iterator[StandInApiServer]:
    with trainer_node() as server:
        yield server


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


# -- release mode ----------------------------------------------------------------------------------


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
