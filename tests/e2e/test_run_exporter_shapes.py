"""``gpu-profiler run --once --protect-training`` against a real Prometheus in every dcgm-exporter
shape (tests/support/dcgm.py, ``EXPORTER_SHAPES``, read from NVIDIA/dcgm-exporter's source) and
the stand-in Kubernetes API server (a test double, see tests/support/apiserver/).

Each shape's node is the mixed node: GPU 0 time-sliced by two pods, GPU 1 whole to a
PyTorchJob's pod, GPU 2 empty. The daemon must protect the training pod, list the shared pods
(with their own peaks where the exporter measured them, "not attributable" otherwise) and store
no per-pod zero as a peak.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from profiler_app.core.model import SHARED_NOT_ATTRIBUTABLE, SHARED_PER_POD
from tests.e2e.conftest import DaemonProcess
from tests.e2e.test_run_e2e import stored
from tests.support.apiserver.objects import pod_manifest
from tests.support.apiserver.server import StandInApiServer
from tests.support.dcgm import (
    EXPORTER_SHAPES,
    SHARED_PODS,
    TRAINER,
    ExporterShape,
    OpenMetricsBuilder,
    mixed_node,
    sample_times,
)
from tests.support.prometheus import PrometheusServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
MARKER = "ai.centaurus.io/do-not-disrupt"


def node_of(shape: ExporterShape) -> str:
    return f"node-{shape.name}"


@pytest.fixture(scope="module")
def prometheus() -> Iterator[PrometheusServer]:
    times = sample_times(360, 10.0)
    builder = OpenMetricsBuilder()
    for shape in EXPORTER_SHAPES:
        for field, labels, values in mixed_node(shape, node_of(shape), times):
            builder.add(field, labels, values, times)
    with PrometheusServer(builder.text()) as server:
        yield server


@pytest.mark.parametrize("shape", EXPORTER_SHAPES, ids=[shape.name for shape in EXPORTER_SHAPES])
def test_the_daemon_protects_the_trainer_and_lists_the_shared_pods(
    shape: ExporterShape,
    prometheus: PrometheusServer,
    apiserver: StandInApiServer,
    daemons: Callable[..., DaemonProcess],
    tmp_path: Path,
) -> None:
    node = node_of(shape)
    apiserver.add_node(node)
    apiserver.add_pod(pod_manifest("ml", TRAINER, node, gpus=1, owner=("PyTorchJob", "trainer")))
    for pod, *_ in SHARED_PODS:
        apiserver.add_pod(pod_manifest("ml", pod, node, gpus=1))
    database = tmp_path / "profiler.db"
    daemon = daemons(
        *("--prometheus-url", prometheus.url, "--node", node, "--window", "30m"),
        *("--kubeconfig", str(apiserver.write_kubeconfig(tmp_path / "kubeconfig"))),
        *("--store-url", f"sqlite:///{database}", "--once", "--protect-training"),
        metrics=False,
    )
    assert daemon.process.wait(timeout=90) == 0, daemon.log()
    assert "Traceback" not in daemon.log()

    def protection(pod: str) -> tuple[str | None, str | None]:
        annotations = apiserver.pod("ml", pod)["metadata"]["annotations"]
        return annotations.get(DO_NOT_DISRUPT), annotations.get(MARKER)

    assert protection(TRAINER) == ("true", "training")
    for pod, *_ in SHARED_PODS:
        assert protection(pod) == (None, None)

    gpus = dict(stored(database, "select gpu, pod from gpu_window"))
    assert gpus["1"] == TRAINER
    rows = stored(
        database,
        "select pod, gpus, gpu_util_max, fb_used_max_mib, gpu_attribution, owner_kind"
        " from pod_usage",
    )
    by_pod = {row[0]: row[1:] for row in rows}
    assert set(by_pod) == {TRAINER, *(pod for pod, *_ in SHARED_PODS)}
    trainer = by_pod[TRAINER]
    assert (trainer[2], trainer[4]) == (30_000.0, "PyTorchJob")
    assert trainer[1] > 90
    for _, _, util, fb, _, _ in rows:
        assert util != 0.0
        assert fb != 0.0
    if not shape.virtual_gpus:
        return  # the exporter names one pod per GPU (tests/support/dcgm.py, node_series)
    own = shape.per_process and shape.pod_uid
    for pod, _, util, fb in SHARED_PODS:
        expected = (util, fb, SHARED_PER_POD) if own else (None, None, SHARED_NOT_ATTRIBUTABLE)
        assert by_pod[pod][1:4] == expected, pod
