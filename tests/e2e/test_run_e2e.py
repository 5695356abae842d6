"""``gpu-profiler run`` end to end: a real Prometheus (the session fixture, 3 nodes x 4 GPUs of
dcgm-exporter data), the stand-in Kubernetes API server (a test double, see its docstring) and a
real SQLite store; the daemon runs as a subprocess and is stopped with SIGTERM."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from tests.e2e.conftest import DaemonProcess
from tests.support.apiserver.objects import pod_manifest
from tests.support.apiserver.server import StandInApiServer
from tests.support.prometheus import LoadedPrometheus

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NODE = "gpu-node-1"
DOMAIN = "ai.centaurus.io"


def prepare_cluster(apiserver: StandInApiServer, prometheus: LoadedPrometheus) -> list[str]:
    """The node and a pod for every GPU dcgm-exporter attributes to one; returns pod names."""
    apiserver.add_node(NODE)
    pods = sorted(
        gpu.pod for gpu in prometheus.dataset.gpus if gpu.hostname == NODE and gpu.pod is not None
    )
    for name in pods:
        apiserver.add_pod(pod_manifest("ml", name, NODE, gpus=1))
    apiserver.add_pod(pod_manifest("ml", "elsewhere", "gpu-node-2", gpus=1))
    return pods


def run_args(prometheus: LoadedPrometheus, kubeconfig: Path, database: Path) -> list[str]:
    return [
        "--prometheus-url",
        prometheus.url,
        "--node",
        NODE,
        "--kubeconfig",
        str(kubeconfig),
        "--store-url",
        f"sqlite:///{database}",
        "--window",
        "30m",
    ]


def assert_node_annotations(annotations: dict[str, str], prometheus: LoadedPrometheus) -> None:
    assert f"{DOMAIN}/profiled-at" in annotations
    for (host, gpu), (job_type, period) in prometheus.expected.items():
        if host != NODE:
            continue
        assert annotations[f"{DOMAIN}/gpu-{gpu}-job-type"] == job_type, gpu
        if period is None:
            assert f"{DOMAIN}/gpu-{gpu}-period-seconds" not in annotations
        else:
            assert float(annotations[f"{DOMAIN}/gpu-{gpu}-period-seconds"]) == pytest.approx(
                period, rel=0.1
            )
        assert float(annotations[f"{DOMAIN}/gpu-{gpu}-util-max"]) <= 100


def stored(database: Path, query: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(database) as connection:
        return connection.execute(query).fetchall()


def test_once_annotates_stores_and_exits_zero(
    daemons: Callable[..., DaemonProcess],
    prometheus: LoadedPrometheus,
    apiserver: StandInApiServer,
    tmp_path: Path,
) -> None:
    pods = prepare_cluster(apiserver, prometheus)
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    database = tmp_path / "profiler.db"
    daemon = daemons(*run_args(prometheus, kubeconfig, database), "--once", metrics=False)
    assert daemon.process.wait(timeout=60) == 0, daemon.log()
    assert_node_annotations(apiserver.node(NODE)["metadata"]["annotations"], prometheus)
    for name in pods:
        annotations = apiserver.pod("ml", name)["metadata"]["annotations"]
        assert 0 <= float(annotations[f"{DOMAIN}/gpu-util-max"]) <= 100, name
        assert f"{DOMAIN}/gpu-mem-copy-util-max" in annotations
        # CPU and memory peaks from the cAdvisor series in Prometheus (no cgroup tree here).
        cpu, memory = prometheus.dataset.pod_peaks[NODE, "ml", name]
        assert annotations[f"{DOMAIN}/cpu-util-max"] == str(round(cpu)), name
        assert annotations[f"{DOMAIN}/mem-used-max-mib"] == str(round(memory / 2**20)), name
    assert apiserver.pod("ml", "elsewhere")["metadata"]["annotations"] == {}
    rows = stored(database, "select gpu, job_type from gpu_window order by gpu")
    expected = sorted(
        (gpu, role) for (host, gpu), (role, _) in prometheus.expected.items() if host == NODE
    )
    assert rows == expected
    stored_pods = stored(
        database,
        "select namespace, pod, node, round(cpu_util_max, 3), mem_used_max_bytes"
        " from pod_usage order by pod",
    )
    peaks = prometheus.dataset.pod_peaks
    assert stored_pods == [
        ("ml", name, NODE, round(peaks[NODE, "ml", name][0], 3), peaks[NODE, "ml", name][1])
        for name in pods
    ]
    log = daemon.log()
    assert "Traceback" not in log
    assert kubeconfig.read_text().split("token: ")[1].split()[0] not in log  # no token in logs


def test_loop_serves_metrics_and_health_and_stops_on_sigterm(
    daemons: Callable[..., DaemonProcess],
    prometheus: LoadedPrometheus,
    apiserver: StandInApiServer,
    tmp_path: Path,
) -> None:
    prepare_cluster(apiserver, prometheus)
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    database = tmp_path / "profiler.db"
    daemon = daemons(*run_args(prometheus, kubeconfig, database), "--interval", "1s")
    daemon.wait_for(
        lambda: (daemon.value("gpu_profiler_cycle_duration_seconds_count") or 0) >= 2,
        timeout=60,
        what="two cycles",
    )
    samples = daemon.samples()
    for (host, gpu), (job_type, period) in prometheus.expected.items():
        if host != NODE:
            continue
        states = {
            dict(labels)["job_type"]: value
            for (name, labels), value in samples.items()
            if name == "gpu_profiler_gpu_job_type" and dict(labels)["gpu"] == gpu
        }
        assert states == {
            t: float(t == job_type) for t in ("idle", "training", "inference", "bursty")
        }
        periods = [
            value
            for (name, labels), value in samples.items()
            if name == "gpu_profiler_gpu_period_seconds" and dict(labels)["gpu"] == gpu
        ]
        assert periods == ([] if period is None else [pytest.approx(period, rel=0.1)])
    labels = next(
        dict(labels)
        for (name, labels), _ in samples.items()
        if name == "gpu_profiler_gpu_utilization_max_percent" and dict(labels)["gpu"] == "0"
    )
    assert labels["Hostname"] == NODE
    assert labels["namespace"] == "ml"
    assert labels["pod"].startswith("training-")
    assert labels["UUID"].startswith("GPU-")
    assert samples["gpu_profiler_errors_total", frozenset({("kind", "source")})] == 0
    assert daemon.healthz() == 200
    assert (
        requests.get(f"{daemon.base}/metrics", timeout=2)
        .headers["Content-Type"]
        .startswith("text/plain")
    )
    # Nothing changed between cycles: no further PATCH after the first cycle's.
    patches = len(apiserver.requests("PATCH"))
    cycles = daemon.value("gpu_profiler_cycle_duration_seconds_count") or 0
    daemon.wait_for(
        lambda: (daemon.value("gpu_profiler_cycle_duration_seconds_count") or 0) >= cycles + 2,
        timeout=30,
        what="two more cycles",
    )
    assert len(apiserver.requests("PATCH")) == patches
    status, seconds = daemon.terminate()
    assert status == 0, daemon.log()
    assert seconds < 5
    assert len(stored(database, "select * from gpu_window")) >= 4
