"""``karpenter.sh/do-not-disrupt`` on training pods (sinks/kubernetes/protection.py): failures.
A pod deleted meanwhile is skipped quietly; one pod's refusal, server error or timeout does not
stop the others, and that pod alone backs off (longer where the server asks with Retry-After).

Against the stand-in API server through the real Kubernetes client: tests/support/protected_pods.py.
Time for the back-off is the test's own clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler_app.core.kube import KubeConnection, connect
from profiler_app.sinks.kubernetes.protection import PodsUnprotectedError, TrainingProtector
from tests.support.apiserver.objects import pod_manifest, webhook_down
from tests.support.apiserver.server import StandInApiServer
from tests.support.protected_pods import (
    DOMAIN,
    NODE,
    PROTECTED,
    STARTED,
    TRAINER_PATH,
    annotations,
    cycle,
    trainer_node,
    watched,
)


@pytest.fixture
def apiserver() -> Iterator[StandInApiServer]:
    with trainer_node() as server:
        yield server


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
