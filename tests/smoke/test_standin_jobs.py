"""The stand-in GPU cluster's Jobs, PyTorchJobs, quota, garbage collection, GFD labels and
scheduling (tests/support/gpu_cluster/batch.py, kubelet.py): the test double holds to the real
API's behaviour that ``gpu-profiler trial`` relies on. Its clock is a fake one; no Prometheus."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.support.clock import FakeClock
from tests.support.gpu_cluster import GpuNode, Scenario, StandInGpuCluster

NS = "trials"
TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


class Api:
    def __init__(self, cluster: StandInGpuCluster) -> None:
        self.cluster = cluster
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {cluster.token}"

    def call(self, method: str, path: str, body: Any = None, **query: str) -> tuple[int, Any]:
        answer = self.session.request(
            method, f"{self.cluster.url}{path}", json=body, params=query, timeout=5
        )
        return answer.status_code, answer.json() if answer.content else None

    def pods(self) -> dict[str, Any]:
        with self.cluster.lock:
            return {name: pod for (ns, name), pod in self.cluster.state.pods.items() if ns == NS}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_790_000_000.0)


def cluster_of(scenario: Scenario, clock: FakeClock) -> Iterator[Api]:
    cluster = StandInGpuCluster(scenario, "http://127.0.0.1:9", clock=clock)
    cluster.start()
    cluster.namespaces.add(NS)
    try:
        yield Api(cluster)
    finally:
        cluster.stop()


@pytest.fixture
def api(clock: FakeClock) -> Iterator[Api]:
    yield from cluster_of(
        Scenario(gpu_nodes=(GpuNode("gpu-node-1", gpus=4), GpuNode("gpu-node-2", gpus=4))), clock
    )


def job(name: str, gpus: int = 1, **spec: Any) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": "x",
        "command": ["python", "train.py"],
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "spec": {
                    "containers": [container],
                    "tolerations": [TOLERATION],
                    "restartPolicy": "Never",
                }
            },
            **spec,
        },
    }


GRACE_SECONDS = 30  # a pod's default terminationGracePeriodSeconds


def advance(api: Api, clock: FakeClock, seconds: float) -> None:
    clock.advance(seconds)
    api.cluster.reconcile()


def test_a_job_makes_its_pod_which_the_kubelet_starts_on_the_clock(
    api: Api, clock: FakeClock
) -> None:
    code, made = api.call("POST", f"/apis/batch/v1/namespaces/{NS}/jobs", job("a"))
    assert code == 201
    ((name, pod),) = api.pods().items()
    assert name.startswith("a-")
    assert pod["metadata"]["ownerReferences"][0]["uid"] == made["metadata"]["uid"]
    assert pod["status"]["phase"] == "Pending"
    advance(api, clock, 0.2)
    assert api.pods()[name]["status"]["phase"] == "Running"
    _, status = api.call("GET", f"/apis/batch/v1/namespaces/{NS}/jobs/a")
    assert status["status"]["active"] == 1


def test_the_deadline_fails_the_job_and_deletes_its_pods(api: Api, clock: FakeClock) -> None:
    api.call(
        "POST",
        f"/apis/batch/v1/namespaces/{NS}/jobs",
        job("a", activeDeadlineSeconds=60, ttlSecondsAfterFinished=30),
    )
    advance(api, clock, 59)
    assert api.pods()
    advance(api, clock, 2)
    _, found = api.call("GET", f"/apis/batch/v1/namespaces/{NS}/jobs/a")
    reasons = {c["type"]: c["reason"] for c in found["status"]["conditions"]}
    # 1.35's Job controller: FailureTarget at once, Failed once its pods have terminated.
    assert reasons == {"FailureTarget": "DeadlineExceeded"}
    assert all(pod["metadata"].get("deletionTimestamp") for pod in api.pods().values())
    advance(api, clock, GRACE_SECONDS + 1)
    _, found = api.call("GET", f"/apis/batch/v1/namespaces/{NS}/jobs/a")
    reasons = {c["type"]: c["reason"] for c in found["status"]["conditions"]}
    assert reasons["Failed"] == "DeadlineExceeded"
    assert api.pods() == {}
    advance(api, clock, 31)  # past ttlSecondsAfterFinished
    assert api.call("GET", f"/apis/batch/v1/namespaces/{NS}/jobs/a")[0] == 404


def test_a_job_deleted_without_a_policy_orphans_its_pods(api: Api, clock: FakeClock) -> None:
    """batch/v1's default over the REST API (kubectl sends Background)."""
    api.call("POST", f"/apis/batch/v1/namespaces/{NS}/jobs", job("a"))
    api.call("DELETE", f"/apis/batch/v1/namespaces/{NS}/jobs/a")
    (pod,) = api.pods().values()
    assert pod["metadata"]["ownerReferences"] == []
    api.call("POST", f"/apis/batch/v1/namespaces/{NS}/jobs", job("b"))
    api.call(
        "DELETE", f"/apis/batch/v1/namespaces/{NS}/jobs/b", {"propagationPolicy": "Background"}
    )
    dependents = [pod for name, pod in api.pods().items() if name.startswith("b-")]
    assert all(pod["metadata"].get("deletionTimestamp") for pod in dependents)  # Terminating
    advance(api, clock, GRACE_SECONDS + 1)
    assert [name for name in api.pods() if name.startswith("b-")] == []


def test_deleting_an_owner_cascades_through_every_level(api: Api, clock: FakeClock) -> None:
    code, anchor = api.call(
        "POST", f"/api/v1/namespaces/{NS}/configmaps", {"metadata": {"name": "anchor"}}
    )
    assert code == 201
    owned = job("a")
    owned["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": "anchor",
            "uid": anchor["metadata"]["uid"],
        }
    ]
    api.call("POST", f"/apis/batch/v1/namespaces/{NS}/jobs", owned)
    assert api.pods()
    api.call("DELETE", f"/api/v1/namespaces/{NS}/configmaps/anchor")
    assert api.call("GET", f"/apis/batch/v1/namespaces/{NS}/jobs/a")[0] == 404
    assert all(pod["metadata"].get("deletionTimestamp") for pod in api.pods().values())
    advance(api, clock, GRACE_SECONDS + 1)  # the pods' grace period
    assert api.pods() == {}


def test_a_quota_refuses_pods_past_its_gpus_and_the_job_retries(api: Api, clock: FakeClock) -> None:
    api.call(
        "POST",
        f"/api/v1/namespaces/{NS}/resourcequotas",
        {"metadata": {"name": "q"}, "spec": {"hard": {"requests.nvidia.com/gpu": "2"}}},
    )
    advance(api, clock, 1.5)  # the quota controller fills its status; until then pods get 403
    api.call("POST", f"/apis/batch/v1/namespaces/{NS}/jobs", job("a", gpus=2))
    api.call("POST", f"/apis/batch/v1/namespaces/{NS}/jobs", job("b", gpus=1))
    assert [name[0] for name in api.pods()] == ["a"]  # b's pod refused: 403 exceeded quota
    api.call(
        "DELETE", f"/apis/batch/v1/namespaces/{NS}/jobs/a", {"propagationPolicy": "Background"}
    )
    advance(api, clock, 1)
    assert [name[0] for name in api.pods()] == ["a"]  # Terminating, it holds its GPUs
    for _ in range(60):  # past the grace period, and the controller's back-off
        advance(api, clock, 5)
        if [name[0] for name in api.pods()] == ["b"]:
            break
    assert [name[0] for name in api.pods()] == ["b"]  # the controller created it again
    assert api.cluster.batch.state.peak_gpus[NS] == 2


def test_a_missing_priority_class_is_refused(api: Api) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "priorityClassName": "nope",
            "containers": [{"name": "c", "image": "x", "command": ["sleep", "1"]}],
        },
    }
    code, status = api.call("POST", f"/api/v1/namespaces/{NS}/pods", pod)
    assert code == 403
    assert "no PriorityClass with name nope was found" in status["message"]


def pytorch_job(name: str, workers: int, extra_spec: dict[str, Any]) -> dict[str, Any]:
    def replica(count: int) -> dict[str, Any]:
        spec = {
            "containers": [
                {
                    "name": "pytorch",
                    "image": "x",
                    "command": ["python", "train.py"],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
            "tolerations": [TOLERATION],
            **extra_spec,
        }
        return {"replicas": count, "template": {"metadata": {"labels": {"t": name}}, "spec": spec}}

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name},
        "spec": {
            "runPolicy": {"cleanPodPolicy": "All"},
            "pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(workers)},
        },
    }


def nodes_of(api: Api, prefix: str) -> list[str]:
    return sorted(
        str(p["spec"].get("nodeName")) for n, p in api.pods().items() if n.startswith(prefix)
    )


def test_pytorch_jobs_pack_or_spread_as_their_pods_ask(api: Api, clock: FakeClock) -> None:
    path = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs"
    packed = {
        "affinity": {
            "podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": {"t": "p"}},
                        "topologyKey": "kubernetes.io/hostname",
                    }
                ]
            }
        }
    }
    spread = {
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"t": "s"}},
            }
        ]
    }
    assert api.call("POST", path, pytorch_job("p", 2, packed))[0] == 201
    assert nodes_of(api, "p-") == ["gpu-node-1"] * 3
    assert api.call("POST", path, pytorch_job("s", 1, spread))[0] == 201
    assert nodes_of(api, "s-") == ["gpu-node-1", "gpu-node-2"]
    assert sorted(n for n in api.pods() if n.startswith("p-")) == [
        "p-master-0",
        "p-worker-0",
        "p-worker-1",
    ]
    bad = pytorch_job("x", 1, {})
    bad["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] = "a"
    assert api.call("POST", path, bad)[0] == 422


def test_nodes_carry_gfd_labels_or_only_the_instance_type(clock: FakeClock) -> None:
    nodes = (GpuNode("gpu-node-1", instance_type="g5.12xlarge"),)
    for gfd, expected in ((True, "NVIDIA-A10G"), (False, None)):
        for api in cluster_of(Scenario(gpu_nodes=nodes, gfd=gfd), clock):
            _, node = api.call("GET", "/api/v1/nodes/gpu-node-1")
            labels = node["metadata"]["labels"]
            assert labels.get("nvidia.com/gpu.product") == expected
            assert labels["node.kubernetes.io/instance-type"] == "g5.12xlarge"
