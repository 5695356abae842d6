"""The node the Kubernetes sink's tests annotate, on the stand-in API server (a test double, see
tests/support/apiserver/): node-a with an annotation of someone else's, and its training pod
ml/trainer-0; the cycles published to it and its annotations read back."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from datetime import timedelta

from profiler_app.core.model import CycleResult
from profiler_app.sinks.kubernetes import KubernetesSink
from tests.support.apiserver.objects import pod_manifest
from tests.support.apiserver.server import StandInApiServer, running_apiserver
from tests.support.cycles import AT, sample_cycle

D = "ai.centaurus.io"
NODE = "node-a"
NODE_PATH = f"/api/v1/nodes/{NODE}"
POD_PATH = "/api/v1/namespaces/ml/pods/trainer-0"


@contextlib.contextmanager
def node_with_trainer() -> Iterator[StandInApiServer]:
    """The stand-in API server with node-a and ml/trainer-0 on it, for a module's ``apiserver``."""
    with running_apiserver() as server:
        server.add_node(NODE, annotations={"foreign.example.com/keep": "me"})
        server.add_pod(pod_manifest("ml", "trainer-0", NODE, gpus=1, start_time=AT))
        yield server


def at_offset(result: CycleResult, seconds: float) -> CycleResult:
    return dataclasses.replace(result, at=result.at + timedelta(seconds=seconds))


def published_baseline(sink: KubernetesSink, apiserver: StandInApiServer) -> CycleResult:
    """The sample cycle, published; the requests it cost are cleared."""
    result = sample_cycle(NODE)
    sink.publish(result)
    apiserver.clear_requests()
    return result


def on_node(apiserver: StandInApiServer) -> dict[str, str]:
    return dict(apiserver.node(NODE)["metadata"]["annotations"])
