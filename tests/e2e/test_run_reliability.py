"""``gpu-profiler run`` keeps going through faults, and stops promptly.

A real Prometheus is stopped and restarted under the running daemon; the stand-in Kubernetes API
server (a test double) fails and hangs on demand; ``StandInPrometheus`` (a test double) serves
malformed data (NaN, resets, missing GPUs, label churn) that a real one could not be made to.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from profiler_app.core.model import FB_USED, GPU_UTIL, MEM_COPY_UTIL
from tests.e2e.conftest import DaemonProcess
from tests.support.apiserver.server import StandInApiServer
from tests.support.dcgm import standard_dataset
from tests.support.prometheus import (
    LoadedPrometheus,
    PrometheusServer,
    Reply,
    StandInPrometheus,
    matrix_reply,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NODE = "gpu-node-1"


def cycles(daemon: DaemonProcess) -> float:
    return daemon.value("gpu_profiler_cycle_duration_seconds_count") or 0.0


def last_success(daemon: DaemonProcess) -> float:
    return daemon.value("gpu_profiler_last_success_timestamp_seconds") or 0.0


def test_survives_prometheus_restart(daemons: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    dataset = standard_dataset(nodes=1, gpus_per_node=2, hours=1)
    with PrometheusServer(dataset.openmetrics) as server:
        daemon = daemons(
            "--prometheus-url",
            server.url,
            "--node",
            NODE,
            "--interval",
            "0.5s",
            "--store-url",
            "none",
        )
        daemon.wait_for(lambda: last_success(daemon) > 0, 60, "a first successful cycle")
        server.stop()
        daemon.wait_for(lambda: daemon.errors("source") >= 3, 60, "source errors while down")
        assert daemon.healthz() == 200  # backing off is alive, not stuck
        assert (
            daemon.value(
                "gpu_profiler_gpu_job_type",
                Hostname=NODE,
                gpu="0",
                UUID=dataset.gpus[0].uuid,
                namespace="ml",
                pod="training-1-0",
                job_type="training",
            )
            == 1.0
        )
        restarted_at = time.time()
        server.start()
        daemon.wait_for(
            lambda: last_success(daemon) > restarted_at, 60, "a successful cycle after restart"
        )
        assert "cannot reach Prometheus" in daemon.log()
        assert "source recovered after" in daemon.log()
        status, seconds = daemon.terminate()
    assert status == 0
    assert seconds < 5


def test_kubernetes_errors_do_not_stop_the_store_and_recover(
    daemons: Callable[..., DaemonProcess],
    prometheus: LoadedPrometheus,
    apiserver: StandInApiServer,
    tmp_path: Path,
) -> None:
    apiserver.add_node(NODE)
    node_path = f"/api/v1/nodes/{NODE}"
    apiserver.fail("PATCH", node_path, 503, times=2)
    database = tmp_path / "profiler.db"
    daemon = daemons(
        "--prometheus-url",
        prometheus.url,
        "--node",
        NODE,
        "--interval",
        "0.5s",
        "--kubeconfig",
        str(apiserver.write_kubeconfig(tmp_path / "kubeconfig")),
        "--store-url",
        f"sqlite:///{database}",
    )
    daemon.wait_for(lambda: daemon.errors("kubernetes") >= 1, 60, "a kubernetes error")
    daemon.wait_for(lambda: cycles(daemon) >= 3, 60, "more cycles")
    with sqlite3.connect(database) as connection:
        assert connection.execute("select count(*) from gpu_window").fetchone()[0] >= 4
    daemon.wait_for(
        lambda: "ai.centaurus.io/gpu-0-job-type" in apiserver.node(NODE)["metadata"]["annotations"],
        60,
        "annotations once the API server recovers",
    )
    assert daemon.errors("store") == 0
    status, _ = daemon.terminate()
    assert status == 0


def test_sigterm_during_a_hung_api_call_exits_promptly(
    daemons: Callable[..., DaemonProcess],
    prometheus: LoadedPrometheus,
    apiserver: StandInApiServer,
    tmp_path: Path,
) -> None:
    apiserver.add_node(NODE)
    apiserver.hang("PATCH", f"/api/v1/nodes/{NODE}", seconds=60)
    daemon = daemons(
        "--prometheus-url",
        prometheus.url,
        "--node",
        NODE,
        "--interval",
        "1s",
        "--kubeconfig",
        str(apiserver.write_kubeconfig(tmp_path / "kubeconfig")),
        "--store-url",
        "none",
    )
    daemon.wait_for(lambda: bool(apiserver.requests("PATCH")), 60, "the hanging PATCH")
    time.sleep(0.5)
    status, seconds = daemon.terminate()
    assert status == 0, daemon.log()
    assert seconds < 5


def test_sigterm_in_the_embedded_default_exits_zero(
    daemons: Callable[..., DaemonProcess],
) -> None:
    daemon = daemons("--interval", "0.5s", "--sample-interval", "0.1s", "--store-url", "none")
    daemon.wait_for(lambda: cycles(daemon) >= 1, 60, "a cycle")
    assert daemon.healthz() == 200
    status, seconds = daemon.terminate()
    assert status == 0
    assert seconds < 5
    assert daemon.log().count("no NVIDIA driver found") == 1


STEP = 10.0


def malformed_responder(params: dict[str, str]) -> Reply:
    """Four GPUs' worth of trouble, on the grid the client asked for."""
    start, end, step = float(params["start"]), float(params["end"]), float(params["step"])
    times = [start + step * i for i in range(round((end - start) / step) + 1)]
    half = len(times) // 2
    query = params["query"]
    field = query.split("{", 1)[0]

    def series(gpu: str, values: list[float | str], **extra: str) -> dict[str, object]:
        labels = {"__name__": field, "gpu": gpu, "UUID": f"GPU-{gpu}", "Hostname": NODE, **extra}
        pairs = [
            [t, v if isinstance(v, str) else repr(float(v))]
            for t, v in zip(times, values, strict=True)
            if v is not None
        ]
        return {"metric": labels, "values": pairs}

    busy = [90.0 if (i // 6) % 2 == 0 else 5.0 for i in range(len(times))]
    with_nan: list[float | str] = [("NaN" if i % 7 == 0 else v) for i, v in enumerate(busy)]
    reset: list[float | str] = [v if i < half else 0.0 for i, v in enumerate(busy)]
    result = [series("0", with_nan), series("1", reset)]
    # GPU 2 changes hands mid-window: one series per pod, each with gaps; still one GPU.
    result.append(
        series("2", [*busy[:half], *([None] * (len(times) - half))], namespace="ml", pod="a")
    )
    result.append(series("2", [*([None] * half), *busy[half:]], namespace="ml", pod="b"))
    if field == GPU_UTIL:
        result.append(series("3", ["+Inf", *busy[1:]]))  # GPU 3 only exports utilisation
    return matrix_reply(result)


def test_malformed_metrics_are_profiled_without_failing(
    daemons: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    database = tmp_path / "profiler.db"
    with StandInPrometheus(malformed_responder) as prometheus:
        daemon = daemons(
            "--prometheus-url",
            prometheus.url,
            "--node",
            NODE,
            "--interval",
            "1s",
            "--store-url",
            f"sqlite:///{database}",
            "--step",
            "10s",
            "--field",
            f"{GPU_UTIL},{MEM_COPY_UTIL},{FB_USED}",
        )
        daemon.wait_for(lambda: last_success(daemon) > 0, 60, "a successful cycle")
        samples = daemon.samples()
        status, _ = daemon.terminate()
    assert status == 0
    job_types = {
        (labels["gpu"], labels.get("pod", "")): labels["job_type"]
        for (name, frozen), value in samples.items()
        if name == "gpu_profiler_gpu_job_type" and value == 1.0
        for labels in [dict(frozen)]
    }
    # One profile per GPU: GPU 2's two pods are one time line, attributed to its current pod.
    assert set(job_types) == {("0", ""), ("1", ""), ("2", "b"), ("3", "")}
    for (name, _), value in samples.items():
        if name.startswith("gpu_profiler_gpu_utilization"):
            assert math.isfinite(value) or value == math.inf, name
    assert "Traceback" not in daemon.log()
    with sqlite3.connect(database) as connection:
        rows = connection.execute("select gpu, pod from gpu_window").fetchall()
    assert sorted((gpu, pod or "") for gpu, pod in rows) == sorted(job_types)
