"""``gpu-profiler run --protect-training`` end to end: the daemon (a subprocess) classifies a real
Prometheus's dcgm-exporter data (the session fixture: on gpu-node-1 one training, one inference,
one bursty and one idle GPU) and keeps ``karpenter.sh/do-not-disrupt`` on the training pod only,
in the stand-in Kubernetes API server (a test double, see tests/support/apiserver.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import DaemonProcess
from tests.e2e.test_run_e2e import NODE, prepare_cluster, run_args
from tests.support.apiserver import StandInApiServer, pod_manifest
from tests.support.prometheus import LoadedPrometheus

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
MARKER = "ai.centaurus.io/do-not-disrupt"


def pod_of(prometheus: LoadedPrometheus, job_type: str) -> str:
    """The pod dcgm-exporter names on the GPU of gpu-node-1 that does ``job_type``."""
    (pod,) = [
        gpu.pod
        for gpu in prometheus.dataset.gpus
        if gpu.hostname == NODE
        and gpu.pod is not None
        and prometheus.expected[NODE, str(gpu.index)][0] == job_type
    ]
    return pod


def set_annotations(apiserver: StandInApiServer, pod: str, annotations: dict[str, str]) -> None:
    apiserver.update_pod("ml", pod, lambda obj: obj["metadata"]["annotations"].update(annotations))


def annotations(apiserver: StandInApiServer, pod: str) -> dict[str, str]:
    return dict(apiserver.pod("ml", pod)["metadata"]["annotations"])


def test_daemon_protects_the_training_pod_only_and_keeps_quiet_after(
    daemons: Callable[..., DaemonProcess],
    prometheus: LoadedPrometheus,
    apiserver: StandInApiServer,
    tmp_path: Path,
) -> None:
    prepare_cluster(apiserver, prometheus)
    training, inference, bursty = (
        pod_of(prometheus, job_type) for job_type in ("training", "inference", "bursty")
    )
    # An earlier run protected the inference pod while it trained; a user protected the bursty
    # one; a pod that holds a GPU it does not use is allocated but idle.
    set_annotations(apiserver, inference, {DO_NOT_DISRUPT: "true", MARKER: "training"})
    set_annotations(apiserver, bursty, {DO_NOT_DISRUPT: "true"})
    apiserver.add_pod(pod_manifest("ml", "holder", NODE, gpus=1))
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    args = run_args(prometheus, kubeconfig, tmp_path / "profiler.db")
    daemon = daemons(*args, "--protect-training", "--interval", "1s")

    def cycles() -> float:
        return daemon.value("gpu_profiler_cycle_duration_seconds_count") or 0

    daemon.wait_for(lambda: cycles() >= 2, timeout=60, what="two cycles")

    assert {key: annotations(apiserver, training).get(key) for key in (DO_NOT_DISRUPT, MARKER)} == {
        DO_NOT_DISRUPT: "true",
        MARKER: "training",
    }
    assert DO_NOT_DISRUPT not in annotations(apiserver, inference)
    assert MARKER not in annotations(apiserver, inference)
    assert annotations(apiserver, bursty) == {DO_NOT_DISRUPT: "true", **_usage(apiserver, bursty)}
    assert DO_NOT_DISRUPT not in annotations(apiserver, "holder")
    assert apiserver.requests(path="/api/v1/namespaces/ml/pods/elsewhere") == []
    assert "set karpenter.sh/do-not-disrupt on pod ml/" + training in daemon.log()

    # Nothing changes between cycles: no request about any pod after the first cycles.
    pod_requests = len(apiserver.requests(path="/api/v1/namespaces/ml/pods/" + training))
    patches = len(apiserver.requests("PATCH"))
    seen = cycles()
    daemon.wait_for(lambda: cycles() >= seen + 2, timeout=30, what="two more cycles")
    assert len(apiserver.requests("PATCH")) == patches
    assert len(apiserver.requests(path="/api/v1/namespaces/ml/pods/" + training)) == pod_requests
    status, _ = daemon.terminate()
    assert status == 0, daemon.log()
    assert "Traceback" not in daemon.log()


def _usage(apiserver: StandInApiServer, pod: str) -> dict[str, str]:
    """The profiler's usage annotations on ``pod`` (its domain, not the marker)."""
    return {
        key: value
        for key, value in annotations(apiserver, pod).items()
        if key.startswith("ai.centaurus.io/") and key != MARKER
    }
