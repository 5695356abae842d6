"""The profiling loop's cycle: the GPUs classified (with their pods' owners, engines and
launchers as context) and published to every sink, with the host, the pods and the time each
GPU's rows cover; the pods once Kubernetes has listed them.

The source and sinks are test doubles (tests/support/daemon_doubles.py); the analysis is the
real one. Failures and back-off: test_daemon_failures.py; running, stopping and the heartbeat:
test_daemon_lifecycle.py.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from profiler_app.core.model import GPU_UTIL, CycleResult, SeriesMatrix
from profiler_app.sinks.store import TableStore
from profiler_app.sources.kube_pods import PodInfo
from profiler_app.sources.kube_pods import pod_info as parse_pod
from tests.support.daemon_doubles import (
    POD_UID,
    POINTS,
    STEP,
    RecordingSink,
    ScriptedSource,
    make_daemon,
    pod_info,
)


def test_a_cycle_classifies_and_publishes_everywhere() -> None:
    store = RecordingSink("store")
    daemon, metrics = make_daemon(ScriptedSource(), store, pods=lambda: [pod_info()])
    assert daemon.run_cycle()
    (result,) = store.received
    assert result.node == "node-a"
    assert result.window_seconds == 1800.0
    assert [(gpu.gpu, gpu.job_type) for gpu in result.gpus] == [("0", "training"), ("1", "idle")]
    assert result.gpus[0].period_seconds == pytest.approx(120.0, rel=0.1)
    assert (result.gpus[0].namespace, result.gpus[0].pod) == ("ml", "trainer-0")
    assert result.gpus[1].pod is None
    (pod,) = result.pods
    assert (pod.namespace, pod.pod, pod.gpus) == ("ml", "trainer-0", ("0",))
    assert pod.fb_used_max_mib == 61_000.0
    assert pod.cpu_util_max == 150.0
    assert pod.start_time == datetime(2026, 11, 22, 3, 0, tzinfo=UTC)
    assert result.host == {"cpu_percent": 5.0}
    sample = metrics.registry.get_sample_value
    assert sample("gpu_profiler_last_success_timestamp_seconds") == pytest.approx(
        time.time(), abs=5
    )
    assert sample("gpu_profiler_cycle_duration_seconds_count") == 1.0
    job = {"Hostname": "node-a", "gpu": "0", "UUID": "GPU-0", "namespace": "ml", "pod": "trainer-0"}
    job |= {"GPU_I_ID": "", "GPU_I_PROFILE": ""}  # a whole GPU
    assert sample("gpu_profiler_gpu_job_type", {**job, "job_type": "training"}) == 1.0


def test_the_pods_owner_is_the_prior_for_a_flat_busy_gpu() -> None:
    """GPU 1 of the same pod reads a flat 93 %: its sibling's loop and the PyTorchJob owner
    make it training; the owner is named in the pod's usage and the GPUs' reasons."""

    class FlatSibling(ScriptedSource):
        def read(self, window_seconds: float) -> list[SeriesMatrix]:
            util, fb = super().read(window_seconds)
            labels = [dict(series, pod_uid=POD_UID) for series in util.labels]
            values = util.values.copy()
            values[1] = 93.0
            return [SeriesMatrix(GPU_UTIL, labels, util.timestamps, values, STEP), fb]

    owned = replace(pod_info(), owner_kind="PyTorchJob", owner_name="llama", gpu_requests=2)
    store = RecordingSink("store")
    daemon, _ = make_daemon(FlatSibling(), store, pods=lambda: [owned])
    assert daemon.run_cycle()
    (result,) = store.received
    first, second = result.gpus
    assert (first.job_type, second.job_type) == ("training", "training")
    assert second.reasons[0] == "sibling gpu 0 periodic"
    assert second.reasons[-1] == "owner PyTorchJob"
    assert (second.owner_kind, second.owner_name) == ("PyTorchJob", "llama")
    assert [(pod.pod, pod.gpus, pod.owner_kind) for pod in result.pods] == [
        ("trainer-0", ("0", "1"), "PyTorchJob")
    ]


def manifest(owner: tuple[str, str] | None, image: str, *, args: list[str]) -> dict[str, object]:
    """GPU 0's pod (uid ``POD_UID``) as the API server lists it."""
    metadata: dict[str, object] = {
        "uid": POD_UID,
        "namespace": "ml",
        "name": "gen-0",
        "labels": {"pod-template-hash": "5d8f"},
    }
    if owner is not None:
        metadata["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    container = {
        "name": "main",
        "image": image,
        "args": args,
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    return {
        "metadata": metadata,
        "spec": {
            "nodeName": "node-a",
            "containers": [container, {"name": "proxy", "image": "envoy"}],
        },
        "status": {"phase": "Running", "startTime": "2026-11-22T03:00:00Z"},
    }


def run_with_pod(pod: PodInfo) -> CycleResult:
    store = RecordingSink("store")
    daemon, _ = make_daemon(ScriptedSource(), store, pods=lambda: [pod])
    assert daemon.run_cycle()
    (result,) = store.received
    return result


def test_without_workload_context_a_loop_is_training_that_says_so() -> None:
    gpu = run_with_pod(pod_info()).gpus[0]
    assert (gpu.job_type, gpu.basis) == ("training", "util-loop")
    assert gpu.reasons[-1] == "no workload context"
    assert (gpu.engine, gpu.framework) == (None, None)


def test_a_serving_owner_makes_the_daemons_loop_a_request_cadence() -> None:
    """The pod's controller is a Deployment's ReplicaSet: the same loop is requests arriving
    at a steady rhythm, not training iterations."""
    pod = parse_pod(manifest(("ReplicaSet", "gen-5d8f"), "registry.example.com/gen:1", args=[]))

    gpu = run_with_pod(pod).gpus[0]

    assert (gpu.job_type, gpu.basis, gpu.period_seconds) == ("inference", "cadence", None)
    assert gpu.reasons[-2:] == ("loop in a serving workload", "owner Deployment")
    assert (gpu.owner_kind, gpu.owner_name) == ("Deployment", "gen")


def test_a_serving_engine_in_the_image_outweighs_a_training_owner() -> None:
    """Offline generation in a Job: the owner says training, the vLLM image says serving, and the
    engine wins. Engine and framework reach the profile (and so JSON, annotations, metrics and
    the store)."""
    pod = parse_pod(
        manifest(("Job", "batch-gen"), "vllm/vllm-openai:v0.6.3", args=["--model", "m"])
    )
    assert pod.identity is not None
    assert pod.identity.engine == "vllm"

    gpu = run_with_pod(pod).gpus[0]

    assert (gpu.job_type, gpu.basis) == ("inference", "cadence")
    assert (gpu.engine, gpu.framework) == ("vllm", "pytorch")
    assert gpu.reasons[-3:] == ("loop in a serving workload", "engine vllm (serving)", "owner Job")


def test_a_training_launcher_in_the_command_keeps_a_deployments_loop_training() -> None:
    pod = parse_pod(
        manifest(
            ("ReplicaSet", "gen-5d8f"),
            "nvcr.io/nvidia/pytorch:24.08-py3",
            args=["torchrun", "--nproc-per-node=8", "train.py"],
        )
    )

    gpu = run_with_pod(pod).gpus[0]

    assert (gpu.job_type, gpu.engine, gpu.framework) == ("training", "torchrun", "pytorch")
    assert gpu.reasons[-2:] == ("engine torchrun (training)", "owner Deployment")


def test_no_gpus_still_publishes_the_host() -> None:
    class NoGpus(ScriptedSource):
        def read(self, window_seconds: float) -> list[SeriesMatrix]:
            return []

    store = RecordingSink("store")
    daemon, _ = make_daemon(NoGpus(), store)
    assert daemon.run_cycle()
    assert store.received[0].gpus == []
    assert store.received[0].host == {"cpu_percent": 5.0}


def test_a_gpu_first_seen_on_a_node_ten_minutes_old_is_credited_ten_minutes(
    tmp_path: Path,
) -> None:
    """The window is 30 minutes but the node (and its exporter) started 10 minutes ago: the
    GPU's first stored row must not claim the 20 minutes before its first sample."""

    class YoungNode(ScriptedSource):
        def read(self, window_seconds: float) -> list[SeriesMatrix]:
            timestamps = time.time() - STEP * np.arange(POINTS)[::-1]
            young = []
            for matrix in super().read(window_seconds):
                values = matrix.values.copy()
                values[:, : POINTS - 60] = np.nan  # samples for the last 60 steps only
                young.append(replace(matrix, timestamps=timestamps, values=values))
            return young

    database = tmp_path / "profiler.db"
    store = TableStore(f"sqlite:///{database}")
    daemon, _ = make_daemon(YoungNode(), store)  # type: ignore[arg-type]
    assert daemon.run_cycle()
    store.close()

    with sqlite3.connect(database) as connection:
        covered = connection.execute("SELECT gpu, covers_seconds FROM gpu_window").fetchall()
    assert [gpu for gpu, _ in covered] == ["0", "1"]
    assert [seconds for _, seconds in covered] == [pytest.approx(59 * STEP, abs=5)] * 2


def test_until_the_first_pod_list_no_pod_is_reported_and_health_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    listed: list[PodInfo] | None = None
    store = RecordingSink("store")
    daemon, metrics = make_daemon(ScriptedSource(), store, pods=lambda: listed)

    assert daemon.run_cycle()
    first = store.received[-1]
    assert (first.pods, first.node_pods) == ([], None)
    assert [gpu.job_type for gpu in first.gpus] == ["training", "idle"]  # GPUs go on
    assert "no pod list from Kubernetes for" in metrics.health_summary()

    listed = [pod_info()]
    with caplog.at_level(logging.INFO):
        assert daemon.run_cycle()
    second = store.received[-1]
    assert [pod.pod for pod in second.pods] == ["trainer-0"]
    assert second.node_pods == (pod_info(),)
    assert "no pod list" not in metrics.health_summary()
    assert "pod list arrived from Kubernetes" in caplog.text


def test_without_kubernetes_there_are_no_node_pods_and_no_waiting() -> None:
    store = RecordingSink("store")
    daemon, metrics = make_daemon(ScriptedSource(), store)
    assert daemon.run_cycle()
    assert store.received[-1].node_pods is None
    assert "no pod list" not in metrics.health_summary()
