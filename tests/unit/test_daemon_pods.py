"""Pod attribution, workloads and per-pod peaks (profiler_app/profiles/pods.py)."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime

import numpy as np

from profiler_app.core.model import FB_USED, GPU_UTIL, FieldStats, PodPeak, PodShare, SeriesMatrix
from profiler_app.profiles.exporter_series import POD_UID_LABEL
from profiler_app.profiles.pods import attribute_series, pod_usage, workloads_of
from profiler_app.profiles.workloads import Workload
from profiler_app.sources.kube_pods import PodInfo
from tests.support.cycles import gpu_profile

START = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)


def pod(name: str, uid: str, gpus: int = 1, **extra: object) -> PodInfo:
    fields: dict[str, object] = {
        "uid": uid,
        "namespace": "ml",
        "name": name,
        "node": "node-a",
        "phase": "Running",
        "start_time": START,
        "gpu_requests": gpus,
        "gpu_limits": gpus,
        "container_ids": {},
        **extra,
    }
    return PodInfo(**fields)  # type: ignore[arg-type]


def test_series_with_only_a_pod_uid_get_the_pods_name() -> None:
    """Local NVML sampling knows the pod by UID; its name makes the GPUs of a pod one job."""
    labels = [
        {"gpu": "0", POD_UID_LABEL: "uid-1"},
        {"gpu": "1", POD_UID_LABEL: "uid-gone"},
        {"gpu": "2", "namespace": "serving", "pod": "api-0", POD_UID_LABEL: "uid-1"},
    ]
    matrix = SeriesMatrix(GPU_UTIL, labels, np.arange(3.0), np.zeros((3, 3)), 1.0)

    [named] = attribute_series([matrix], [pod("trainer", "uid-1")])

    assert [(series.get("namespace"), series.get("pod")) for series in named.labels] == [
        ("ml", "trainer"),
        (None, None),
        ("serving", "api-0"),
    ]


def test_workloads_come_from_the_owner_chain_and_the_labels() -> None:
    pods = [
        pod(
            "web-7d9c-x2",
            "u1",
            owner_kind="ReplicaSet",
            owner_name="web-7d9c",
            labels={"pod-template-hash": "7d9c"},
        ),
        pod("nightly-29412345-abcde", "u2", owner_kind="Job", owner_name="nightly-29412345"),
        pod("llama-worker-0", "u3", owner_kind="PyTorchJob", owner_name="llama"),
        pod(
            "js-workers-0-0-x",
            "u4",
            owner_kind="Job",
            owner_name="js-workers-0",
            labels={"jobset.sigs.k8s.io/jobset-name": "js"},
        ),
        pod("bare", "u5"),
    ]

    found = workloads_of(pods)

    assert {name: (w.kind, w.name, w.prior) for (_, name), w in found.items()} == {
        "web-7d9c-x2": ("Deployment", "web", "serving"),
        "nightly-29412345-abcde": ("CronJob", "nightly", "training"),
        "llama-worker-0": ("PyTorchJob", "llama", "training"),
        "js-workers-0-0-x": ("JobSet", "js", "training"),
    }


def test_a_trainjobs_pod_trains_through_its_jobset() -> None:
    """A Kubeflow Trainer TrainJob's pod as it runs: owned by a Job of the JobSet the TrainJob
    made under its own name (kubeflow/trainer v2.3.0, pkg/runtime/framework/plugins/jobset/
    jobset.go lines 413-433), labelled by JobSet's controller (kubernetes-sigs/jobset v0.12.0,
    pkg/controllers/jobset_controller.go lines 1014-1030) and by the Job controller; no label
    names the TrainJob."""
    labels = {
        "jobset.sigs.k8s.io/jobset-name": "llama-ft",
        "jobset.sigs.k8s.io/replicatedjob-name": "node",
        "jobset.sigs.k8s.io/job-index": "0",
        "batch.kubernetes.io/job-name": "llama-ft-node-0",
        "job-name": "llama-ft-node-0",
    }
    trainer = pod(
        "llama-ft-node-0-0-x", "u1", owner_kind="Job", owner_name="llama-ft-node-0", labels=labels
    )

    (workload,) = workloads_of([trainer]).values()

    assert (workload.kind, workload.name, workload.prior) == ("JobSet", "llama-ft", "training")


def test_a_pod_seen_earlier_in_the_window_counts_its_gpu_but_not_the_peaks_after_it() -> None:
    handed = replace(
        gpu_profile("0", "training", util=(99, 95, 80, 0), namespace="ml", pod="new"),
        pods=(
            PodShare("ml", "old", 0.5, START.timestamp(), START.timestamp() + 900),
            PodShare("ml", "new", 0.5, START.timestamp() + 910, START.timestamp() + 1800),
        ),
    )
    gone = replace(handed, gpu="1", pods=(PodShare("ml", "deleted", 1.0, None, None),))
    known = [pod("old", "u-old", phase="Succeeded"), pod("new", "u-new")]

    usage = {u.pod: u for u in pod_usage([handed, gone], known, {}, "node-a")}

    assert set(usage) == {"old", "new"}  # a former pod Kubernetes forgot is left alone
    assert (usage["old"].gpus, usage["old"].gpu_util_max) == (("0",), None)
    assert usage["old"].last_seen is not None
    assert usage["old"].last_seen.timestamp() == START.timestamp() + 900
    assert (usage["new"].gpus, usage["new"].gpu_util_max) == (("0",), 99)


def test_a_finished_pod_no_longer_holds_its_gpus() -> None:
    usage = pod_usage([], [pod("done", "u1", phase="Succeeded"), pod("up", "u2")], {}, "n")
    assert [u.pod for u in usage] == ["up"]


def test_the_owner_of_a_pod_is_written_with_its_usage() -> None:
    running = pod("llama-worker-0", "u3", owner_kind="PyTorchJob", owner_name="llama")
    usage = pod_usage([], [running], {}, "n")
    assert (usage[0].owner_kind, usage[0].owner_name) == ("PyTorchJob", "llama")
    labelled = replace(
        gpu_profile("0", "inference", namespace="s", pod="api"),
        owner_kind="InferenceService",
        owner_name="api",
    )
    assert pod_usage([labelled], [], {}, "n")[0].owner_kind == "InferenceService"
    assert Workload("X", "y", None).reason == "owner X"


def test_pod_usage_takes_maxima_over_the_pods_gpus() -> None:
    profiles = [
        gpu_profile(
            "0", "training", util=(80, 70, 50, 0), fb_used_max=1000, namespace="ml", pod="t"
        ),
        gpu_profile(
            "1", "training", util=(95, 90, 60, 0), fb_used_max=500, namespace="ml", pod="t"
        ),
        gpu_profile("2", "idle"),
    ]
    profiles[1] = replace(
        profiles[1],
        stats={**profiles[1].stats, FB_USED: FieldStats(math.nan, math.nan, math.nan, 1)},
    )
    usage = pod_usage(
        profiles,
        [pod("t", "uid-t", gpus=2), pod("waiting", "uid-w"), pod("cpu-only", "uid-c", gpus=0)],
        {"uid-t": PodPeak(cpu_util_max=310.0, mem_used_max_bytes=5e9)},
        "node-a",
    )
    by_name = {u.pod: u for u in usage}
    assert set(by_name) == {"t", "waiting"}  # the CPU-only pod is not a GPU pod
    trainer = by_name["t"]
    assert trainer.gpus == ("0", "1")
    assert trainer.gpu_util_max == 95
    assert trainer.fb_used_max_mib == 1000  # NaN ignored
    assert trainer.cpu_util_max == 310.0
    assert trainer.mem_used_max_bytes == 5e9
    assert trainer.start_time == START
    assert trainer.node == "node-a"
    waiting = by_name["waiting"]
    assert waiting.gpus == ()
    assert waiting.gpu_util_max is None
    assert waiting.cpu_util_max is None


def test_pods_from_dcgm_labels_without_kubernetes() -> None:
    usage = pod_usage([gpu_profile("0", "inference", namespace="s", pod="api")], [], {}, "n")
    assert [(u.namespace, u.pod, u.gpus, u.start_time) for u in usage] == [
        ("s", "api", ("0",), None)
    ]


def test_with_kubernetes_only_listed_pods_that_started_are_reported() -> None:
    """A pod the series name but the watcher does not list on this node (not listed yet, moved
    away, deleted) has no known start time: it is not this node's to store or annotate."""
    profiles = [
        gpu_profile("0", "training", namespace="ml", pod="trainer"),
        gpu_profile("1", "training", namespace="ml", pod="moved-away"),
        gpu_profile("2", "idle", namespace="ml", pod="pending"),
    ]
    pods = [pod("trainer", "u1"), pod("pending", "u2", phase="Pending", start_time=None)]

    listed = pod_usage(profiles, pods, {}, "node-a", listed_only=True)
    assert [(u.pod, u.start_time) for u in listed] == [("trainer", START)]

    unlisted = pod_usage(profiles, pods, {}, "node-a")  # Kubernetes off: the series' names
    assert sorted(u.pod for u in unlisted) == ["moved-away", "pending", "trainer"]
