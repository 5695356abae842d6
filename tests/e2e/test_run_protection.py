"""``gpu-profiler run --protect-training`` end to end: the daemon (a subprocess) classifies a real
Prometheus's dcgm-exporter data (the session fixture: on gpu-node-1 one training, one inference,
one bursty and one idle GPU) and keeps ``karpenter.sh/do-not-disrupt`` on the training pod only,
in the stand-in Kubernetes API server (a test double, see tests/support/apiserver/)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests

from tests.e2e.conftest import DaemonProcess
from tests.e2e.test_run_e2e import NODE, prepare_cluster, run_args, stored
from tests.support.apiserver.objects import pod_manifest, webhook_down
from tests.support.apiserver.server import StandInApiServer
from tests.support.ports import free_port
from tests.support.prometheus import LoadedPrometheus, StandInPrometheus
from tests.support.scripted_dcgm import ScriptedDcgm

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
MARKER = "ai.centaurus.io/do-not-disrupt"
PROTECTED = {DO_NOT_DISRUPT: "true", MARKER: "training"}
STARTED = datetime(2026, 11, 26, 8, 0, tzinfo=UTC)


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


# -- The daemon against a scripted dcgm-exporter: each verdict is the test's to flip ------------

SCRIPTED_NODE = "node-a"
OTHER_NODE = "node-b"


@pytest.fixture
def dcgm() -> Iterator[ScriptedDcgm]:
    scripted = ScriptedDcgm(SCRIPTED_NODE)
    with StandInPrometheus(scripted.responder) as server:
        scripted.url = server.url  # type: ignore[attr-defined]
        yield scripted


class ProtectingDaemon:
    """``gpu-profiler run --protect-training`` on node-a every 0.5 s, and what it left."""

    def __init__(
        self,
        daemons: Callable[..., DaemonProcess],
        dcgm: ScriptedDcgm,
        apiserver: StandInApiServer,
        tmp_path: Path,
    ) -> None:
        self.apiserver = apiserver
        self.database = tmp_path / "profiler.db"
        kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
        self.process = daemons(
            *("--prometheus-url", dcgm.url, "--node", SCRIPTED_NODE),  # type: ignore[attr-defined]
            *("--kubeconfig", str(kubeconfig), "--store-url", f"sqlite:///{self.database}"),
            *("--window", "10m", "--step", "10s", "--interval", "0.5s", "--protect-training"),
        )

    def cycles(self) -> float:
        return self.process.value("gpu_profiler_cycle_duration_seconds_count") or 0

    def wait_cycles(self, count: int = 3) -> None:
        target = self.cycles() + count
        self.process.wait_for(lambda: self.cycles() >= target, timeout=60, what=f"{count} cycles")

    def annotations(self, pod: str) -> dict[str, str]:
        return {
            key: value
            for key, value in annotations(self.apiserver, pod).items()
            if key in (DO_NOT_DISRUPT, MARKER)
        }


@pytest.fixture
def protecting(
    daemons: Callable[..., DaemonProcess],
    dcgm: ScriptedDcgm,
    apiserver: StandInApiServer,
    tmp_path: Path,
) -> Callable[[], ProtectingDaemon]:
    apiserver.add_node(SCRIPTED_NODE)
    apiserver.add_node(OTHER_NODE)
    return lambda: ProtectingDaemon(daemons, dcgm, apiserver, tmp_path)


def test_a_persons_do_not_disrupt_set_while_the_pod_idled_is_never_taken_over(
    protecting: Callable[[], ProtectingDaemon], dcgm: ScriptedDcgm, apiserver: StandInApiServer
) -> None:
    """The first sight of a pod that does not train, then a person's annotation, then training:
    the write must follow a fresh read, and stopping must not remove what the person set."""
    apiserver.add_pod(pod_manifest("ml", "trainer-0", SCRIPTED_NODE, gpus=1))
    dcgm.set_gpu("0", "idle", "ml", "trainer-0")
    daemon = protecting()
    daemon.wait_cycles()

    set_annotations(apiserver, "trainer-0", {DO_NOT_DISRUPT: "true"})
    dcgm.set_gpu("0", "training", "ml", "trainer-0")
    daemon.wait_cycles()
    assert daemon.annotations("trainer-0") == {DO_NOT_DISRUPT: "true"}

    dcgm.set_gpu("0", "idle", "ml", "trainer-0")
    daemon.wait_cycles()
    assert daemon.annotations("trainer-0") == {DO_NOT_DISRUPT: "true"}
    assert "Traceback" not in daemon.process.log()


def test_a_pod_recreated_under_the_same_name_is_protected_again(
    protecting: Callable[[], ProtectingDaemon], dcgm: ScriptedDcgm, apiserver: StandInApiServer
) -> None:
    apiserver.add_pod(pod_manifest("ml", "worker-0", SCRIPTED_NODE, gpus=1, start_time=STARTED))
    dcgm.set_gpu("0", "training", "ml", "worker-0")
    daemon = protecting()
    daemon.wait_cycles()
    assert daemon.annotations("worker-0") == PROTECTED

    later = STARTED + timedelta(hours=1)
    apiserver.recreate_pod(pod_manifest("ml", "worker-0", SCRIPTED_NODE, gpus=1, start_time=later))
    daemon.wait_cycles(4)

    assert daemon.annotations("worker-0") == PROTECTED


def test_pods_the_watcher_has_not_listed_are_neither_protected_nor_stored(
    protecting: Callable[[], ProtectingDaemon], dcgm: ScriptedDcgm, apiserver: StandInApiServer
) -> None:
    """The first pod list comes 9 s late (past the daemon's 5 s wait): the cycles before it
    must not act on, or store, the pod dcgm-exporter names, and say why."""
    apiserver.add_pod(pod_manifest("ml", "trainer-0", SCRIPTED_NODE, gpus=1, start_time=STARTED))
    dcgm.set_gpu("0", "training", "ml", "trainer-0")
    apiserver.hang("GET", "/api/v1/pods", seconds=9, times=1)  # within the 10 s read timeout
    daemon = protecting()
    daemon.wait_cycles(1)
    assert apiserver.requests(path="/api/v1/namespaces/ml/pods/trainer-0") == []
    assert daemon.annotations("trainer-0") == {}
    health = requests.get(f"{daemon.process.base}/healthz", timeout=2)
    assert health.status_code == 200
    assert "no pod list from Kubernetes" in health.text
    assert stored(daemon.database, "select pod from pod_usage") == []

    daemon.process.wait_for(
        lambda: "pod list arrived" in daemon.process.log(), timeout=30, what="the first pod list"
    )
    daemon.wait_cycles(4)

    assert daemon.annotations("trainer-0") == PROTECTED
    rows = stored(daemon.database, "select pod, pod_start_time from pod_usage")
    assert [pod for pod, _ in rows] == ["trainer-0"]
    assert not str(rows[0][1]).startswith("1970")
    assert "no pod list from Kubernetes" in daemon.process.log()


def test_a_pod_that_moved_to_another_node_is_left_to_that_node(
    protecting: Callable[[], ProtectingDaemon], dcgm: ScriptedDcgm, apiserver: StandInApiServer
) -> None:
    """node-a's last samples still name w-0 after it was recreated on node-b, where node-b's
    profiler protects it: node-a must not read or write the pod on node-b."""
    apiserver.add_pod(pod_manifest("ml", "w-0", SCRIPTED_NODE, gpus=1, start_time=STARTED))
    dcgm.set_gpu("0", "training", "ml", "w-0")
    daemon = protecting()
    daemon.wait_cycles()
    assert daemon.annotations("w-0") == PROTECTED

    moved = pod_manifest("ml", "w-0", OTHER_NODE, gpus=1, start_time=STARTED + timedelta(hours=1))
    moved["metadata"]["annotations"] = dict(PROTECTED)  # node-b's profiler protected it
    apiserver.recreate_pod(moved)
    dcgm.set_gpu("0", "idle", "ml", "w-0")  # node-a's GPU idles, its last pod label stays
    daemon.wait_cycles(4)

    assert daemon.annotations("w-0") == PROTECTED


def test_a_node_patch_that_keeps_failing_does_not_stop_protection(
    protecting: Callable[[], ProtectingDaemon], dcgm: ScriptedDcgm, apiserver: StandInApiServer
) -> None:
    apiserver.add_pod(pod_manifest("ml", "trainer-0", SCRIPTED_NODE, gpus=1, start_time=STARTED))
    dcgm.set_gpu("0", "training", "ml", "trainer-0")
    apiserver.fail("PATCH", f"/api/v1/nodes/{SCRIPTED_NODE}", 403)  # RBAC: forever
    daemon = protecting()
    daemon.wait_cycles(4)

    assert daemon.annotations("trainer-0") == PROTECTED
    assert daemon.process.errors("kubernetes") >= 1


# -- faults: one pod's, the metrics source's; pods on every GPU resource -----------------------


def marks(apiserver: StandInApiServer, namespace: str, pod: str) -> dict[str, str]:
    """The protection annotations on a pod (not the usage ones)."""
    found = apiserver.pod(namespace, pod)["metadata"]["annotations"]
    return {key: found[key] for key in (DO_NOT_DISRUPT, MARKER) if key in found}


def test_a_pod_behind_a_failing_webhook_does_not_stop_the_others_protection(
    protecting: Callable[[], ProtectingDaemon], dcgm: ScriptedDcgm, apiserver: StandInApiServer
) -> None:
    """aaa/old (idle, a stale mark of the profiler's, first in the pods' order) answers every
    PATCH with the 500 a fail-closed admission webhook gives while its service is down."""
    apiserver.add_pod(
        pod_manifest("aaa", "old", SCRIPTED_NODE, gpus=1, start_time=STARTED, annotations=PROTECTED)
    )
    apiserver.add_pod(pod_manifest("ml", "trainer-0", SCRIPTED_NODE, gpus=1, start_time=STARTED))
    dcgm.set_gpu("0", "training", "ml", "trainer-0")
    dcgm.set_gpu("1", "idle", "aaa", "old")
    old_path = "/api/v1/namespaces/aaa/pods/old"
    apiserver.fail("PATCH", old_path, 500, cause=webhook_down("guard.example.com", "guard.aaa.svc"))
    daemon = protecting()
    daemon.wait_cycles(4)

    assert daemon.annotations("trainer-0") == PROTECTED
    assert marks(apiserver, "aaa", "old") == PROTECTED
    process = daemon.process
    assert "protecting pod aaa/old failed (HTTP 500 Internal Server Error)" in process.log()
    assert process.value("gpu_profiler_failing_pods", kind="protection") == 1
    assert process.errors("protection") >= 1
    health = requests.get(f"{process.base}/healthz", timeout=2)
    assert health.status_code == 200
    assert "protection failing for 1 pod(s): aaa/old (HTTP 500" in health.text
    # aaa/old waits out its own back-off: fewer releases tried than cycles (the usage
    # annotations' merge patches are the other sink's).
    releases = [
        r for r in apiserver.requests("PATCH", old_path) if "json-patch" in str(r.content_type)
    ]
    assert 1 <= len(releases) < daemon.cycles()

    apiserver.clear_faults()  # the webhook is back: the stale mark goes, nothing fails
    process.wait_for(
        lambda: marks(apiserver, "aaa", "old") == {},
        timeout=30,
        what="aaa/old released",
    )
    process.wait_for(
        lambda: process.value("gpu_profiler_failing_pods", kind="protection") == 0,
        timeout=30,
        what="no failing pod",
    )
    assert "Traceback" not in process.log()


def test_a_training_workloads_pod_is_protected_while_prometheus_is_down(
    daemons: Callable[..., DaemonProcess], apiserver: StandInApiServer, tmp_path: Path
) -> None:
    """Prometheus refuses every connection: the daemon protects the PyTorchJob's new pod by its
    owner, keeps the mark of a pod it saw training, and releases a pod that has finished."""
    apiserver.add_node(SCRIPTED_NODE)
    just_now = datetime.now(UTC) - timedelta(seconds=30)
    apiserver.add_pod(
        pod_manifest(
            "ml", "worker-0", SCRIPTED_NODE, gpus=1, start_time=just_now, owner=("PyTorchJob", "l")
        )
    )
    apiserver.add_pod(
        pod_manifest("ml", "seen", SCRIPTED_NODE, gpus=1, start_time=STARTED, annotations=PROTECTED)
    )
    apiserver.add_pod(
        pod_manifest("ml", "done", SCRIPTED_NODE, gpus=1, phase="Succeeded", annotations=PROTECTED)
    )
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    process = daemons(
        *("--prometheus-url", f"http://127.0.0.1:{free_port()}", "--node", SCRIPTED_NODE),
        *("--kubeconfig", str(kubeconfig), "--store-url", "none", "--window", "10m"),
        *("--interval", "0.5s", "--protect-training"),
    )

    def marks_of(pod: str) -> dict[str, str]:
        return marks(apiserver, "ml", pod)

    process.wait_for(
        lambda: marks_of("worker-0") == {DO_NOT_DISRUPT: "true", MARKER: "owner"},
        timeout=30,
        what="the PyTorchJob's pod protected",
    )
    process.wait_for(lambda: marks_of("done") == {}, timeout=30, what="the finished pod released")
    assert marks_of("seen") == PROTECTED
    assert process.errors("source") >= 1
    assert "Traceback" not in process.log()


@pytest.mark.parametrize(
    "resources",
    [("nvidia.com/mig-3g.40gb", "nvidia.com/gpu.shared"), ("nvidia.com/mig-1g.10gb.shared",)],
)
def test_pods_on_mig_devices_and_shared_gpus_are_protected(
    protecting: Callable[[], ProtectingDaemon],
    dcgm: ScriptedDcgm,
    apiserver: StandInApiServer,
    resources: tuple[str, ...],
) -> None:
    names = [f"trainer-{index}" for index in range(len(resources))]
    for index, (name, resource) in enumerate(zip(names, resources, strict=True)):
        manifest = pod_manifest(
            "ml", name, SCRIPTED_NODE, gpus=1, gpu_resource=resource, start_time=STARTED
        )
        apiserver.add_pod(manifest)
        dcgm.set_gpu(str(index), "training", "ml", name)
    daemon = protecting()
    daemon.wait_cycles()

    assert [daemon.annotations(name) for name in names] == [PROTECTED] * len(names)
