"""GPU feature discovery's sharing labels: read from the node (the stand-in API server, a test
double: tests/support/apiserver/), and what they do to the profiles and the pods' peaks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from profiler_app.core.kube import KubeConnection
from profiler_app.core.model import FB_USED, GPU_UTIL, SHARED_PER_POD, SeriesMatrix
from profiler_app.profiles.build import build_profiles
from profiler_app.profiles.pods import pod_usage
from profiler_app.sources.gfd import NodeSharing, gfd_sharing
from tests.support.apiserver.server import StandInApiServer, running_apiserver
from tests.support.clock import FakeClock

NODE = "node-a"
LABELS = {"nvidia.com/gpu.sharing-strategy": "mps", "nvidia.com/gpu.replicas": "4"}


@pytest.fixture
def apiserver() -> Iterator[StandInApiServer]:
    with running_apiserver() as server:
        server.add_node(NODE)

        def label(node: dict[str, Any]) -> None:
            node["metadata"]["labels"] = dict(LABELS)

        server.update_node(NODE, label)
        yield server


def test_the_labels_parse() -> None:
    assert gfd_sharing(LABELS) == ("mps", 4)
    assert gfd_sharing({"nvidia.com/gpu.sharing-strategy": "time-slicing"}) == (
        "time-slicing",
        None,
    )
    assert gfd_sharing(
        {"nvidia.com/gpu.sharing-strategy": "bogus", "nvidia.com/gpu.replicas": "x"}
    ) == (
        None,
        None,
    )
    assert gfd_sharing({}) == (None, None)


def test_the_node_is_read_once_per_refresh_and_a_failure_keeps_the_last_answer(
    apiserver: StandInApiServer, connection: KubeConnection
) -> None:
    clock = FakeClock()
    sharing = NodeSharing(connection, NODE, refresh_seconds=600, clock=clock)
    apiserver.clear_requests()
    assert sharing() == ("mps", 4)
    assert sharing() == ("mps", 4)
    assert len(apiserver.requests(path=f"/api/v1/nodes/{NODE}")) == 1
    missing = NodeSharing(connection, "no-such-node", clock=clock)
    assert missing() == (None, None)


def matrix(field: str, rows: list[tuple[dict[str, str], float]]) -> SeriesMatrix:
    timestamps = 10.0 * np.arange(60, dtype=np.float64)
    values = np.vstack([np.full(60, value) for _, value in rows])
    return SeriesMatrix(field, [labels for labels, _ in rows], timestamps, values, 10.0)


def test_the_labels_name_the_kind_and_a_single_pod_keeps_its_peaks() -> None:
    one = {"Hostname": NODE, "gpu": "0", "UUID": "GPU-0", "namespace": "ml", "pod": "alone"}
    # dcgm-exporter 4.5.3-4.8.2 with virtual GPUs (tests/support/dcgm.py): the device series of
    # GPU_UTIL and FB_USED names no pod; each pod's own series beside it carries its pod_uid.
    two = {"Hostname": NODE, "gpu": "1", "UUID": "GPU-1"}
    own = [two | {"namespace": "ml", "pod": pod, "pod_uid": f"uid-{pod}"} for pod in ("a", "b")]
    matrices = [
        matrix(GPU_UTIL, [(one, 60.0), (two, 70.0), (own[0], 50.0), (own[1], 20.0)]),
        matrix(FB_USED, [(one, 9000.0), (two, 12000.0), (own[0], 8000.0), (own[1], 4000.0)]),
    ]
    profiles = build_profiles(matrices, node_sharing=("mps", 4))
    assert [(p.sharing, p.replicas) for p in profiles] == [("mps", 4), ("mps", 4)]
    usage = {p.pod: p for p in pod_usage(profiles, [], {}, NODE)}
    # Alone on a GPU configured for sharing: its peaks are its own GPU's.
    assert (usage["alone"].gpu_util_max, usage["alone"].gpu_attribution) == (60.0, None)
    assert (usage["b"].gpu_util_max, usage["b"].gpu_attribution) == (20.0, SHARED_PER_POD)
    unlabelled = build_profiles(matrices)
    assert [p.sharing for p in unlabelled] == ["none", "time-slicing"]
