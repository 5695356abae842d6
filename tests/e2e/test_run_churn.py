"""One GPU, one profile, end to end: ``gpu-profiler run`` against a real Prometheus whose series
change labels within the window, the stand-in Kubernetes API server (a test double, see its
docstring) and a real SQLite store; ``report`` then reads the store.

Node ``gpu-node-churn``, 40 minutes at 10 s, ending now:

- GPU 0 trains (120 s loop); dcgm-exporter restarted 12 minutes ago under a new ``instance``.
- GPU 1 serves; pod ``ml/serve-a`` handed it to ``ml/serve-b`` 15 minutes ago.
- GPU 2 serves too, but the exporter lost it for 8 minutes (no samples), then it came back.

Every cycle must give annotations, /metrics, the store and the report exactly one profile per GPU.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from profiler_app.cli import main
from profiler_app.core.model import FB_USED, GPU_UTIL, POWER_USAGE
from tests.e2e.conftest import DaemonProcess
from tests.support import signals
from tests.support.apiserver.objects import pod_manifest
from tests.support.apiserver.server import StandInApiServer
from tests.support.dcgm import Gpu, OpenMetricsBuilder, sample_times
from tests.support.prometheus import PrometheusServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NODE = "gpu-node-churn"
DOMAIN = "ai.centaurus.io"
STEP = 10.0
POINTS = 241  # 40 minutes


def churning_node() -> str:
    rng = np.random.default_rng(11)
    times = sample_times(POINTS, STEP)
    builder = OpenMetricsBuilder()
    index = np.arange(POINTS)

    def add(labels: dict[str, str], util: np.ndarray, keep: np.ndarray, fb: float) -> None:
        shown = np.where(keep, util, np.nan)
        builder.add(GPU_UTIL, labels, shown, times)
        builder.add(FB_USED, labels, np.where(keep, fb, np.nan), times)
        builder.add(POWER_USAGE, labels, np.where(keep, 70 + 4.7 * util, np.nan), times)

    restart = POINTS - 72  # 12 minutes ago; one sample scraped by both exporters
    trainer = Gpu(NODE, 0, namespace="ml", pod="trainer-0", container="main").labels()
    loop = signals.square(POINTS, 12, rng, duty=0.6, noise=3.0)
    add({**trainer, "instance": "10.0.0.1:9400"}, loop, index <= restart, 61_000.0)
    add({**trainer, "instance": "10.0.0.2:9400"}, loop, index >= restart, 61_000.0)

    handover = POINTS - 90  # 15 minutes ago
    serving = signals.steady_serving(POINTS, rng)
    for pod, keep in (("serve-a", index < handover), ("serve-b", index >= handover)):
        labels = {**Gpu(NODE, 1, namespace="ml", pod=pod, container="main").labels()}
        add({**labels, "instance": "10.0.0.2:9400"}, serving, keep, 20_000.0)

    lost = (index >= POINTS - 120) & (index < POINTS - 72)  # 8 minutes without samples
    returning = Gpu(NODE, 2, namespace="ml", pod="serve-c", container="main").labels()
    add({**returning, "instance": "10.0.0.2:9400"}, signals.steady_serving(POINTS, rng), ~lost, 9e3)
    return builder.text()


def cycles(daemon: DaemonProcess) -> float:
    return daemon.value("gpu_profiler_cycle_duration_seconds_count") or 0.0


def job_type_series(daemon: DaemonProcess) -> list[dict[str, str]]:
    return [
        dict(labels)
        for (name, labels), value in daemon.samples().items()
        if name == "gpu_profiler_gpu_job_type" and value == 1.0
    ]


def test_label_changes_give_one_profile_per_gpu_in_every_output(
    daemons: Callable[..., DaemonProcess],
    apiserver: StandInApiServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    apiserver.add_node(NODE)
    for name in ("trainer-0", "serve-b", "serve-c"):
        apiserver.add_pod(pod_manifest("ml", name, NODE, gpus=1))
    apiserver.add_pod(pod_manifest("ml", "serve-a", NODE, gpus=1, phase="Succeeded"))
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    database = tmp_path / "profiler.db"
    with PrometheusServer(churning_node()) as prometheus:
        daemon = daemons(
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
            "--interval",
            "1s",
        )
        daemon.wait_for(
            lambda: (daemon.value("gpu_profiler_cycle_duration_seconds_count") or 0) >= 3,
            90,
            "three cycles",
        )
        series = job_type_series(daemon)
        status, _ = daemon.terminate()
    assert status == 0, daemon.log()

    # /metrics: one job type per GPU; GPU 1 under its current pod only.
    assert sorted((s["gpu"], s["pod"], s["job_type"]) for s in series) == [
        ("0", "trainer-0", "training"),
        ("1", "serve-b", "inference"),
        ("2", "serve-c", "inference"),
    ]
    # Annotations: one set per GPU, GPU 0's loop found across the restart.
    annotations = apiserver.node(NODE)["metadata"]["annotations"]
    assert annotations[f"{DOMAIN}/gpu-0-job-type"] == "training"
    assert float(annotations[f"{DOMAIN}/gpu-0-period-seconds"]) == pytest.approx(120, rel=0.1)
    assert annotations[f"{DOMAIN}/gpu-0-reasons"].startswith("period 120s in util")
    assert annotations[f"{DOMAIN}/gpu-1-job-type"] == "inference"
    assert annotations[f"{DOMAIN}/gpu-2-job-type"] == "inference"
    # The store: every cycle wrote exactly one row per GPU.
    with sqlite3.connect(database) as connection:
        rows = connection.execute("select at, gpu, uuid, pod from gpu_window").fetchall()
        pods = connection.execute("select pod, gpus from pod_usage order by pod").fetchall()
    per_cycle = Counter(at for at, *_ in rows)
    assert len(per_cycle) >= 3
    assert set(per_cycle.values()) == {3}
    assert {(gpu, pod) for _, gpu, _, pod in rows} == {
        ("0", "trainer-0"),
        ("1", "serve-b"),
        ("2", "serve-c"),
    }
    # serve-a finished but held GPU 1 within the window: it stays, with its GPU.
    assert pods == [("serve-a", "1"), ("serve-b", "1"), ("serve-c", "2"), ("trainer-0", "0")]
    # The report: three GPUs, each covering the time once (the first row its window).
    assert main(["report", "--store-url", f"sqlite:///{database}", "--output", "json"]) == 0
    report = json.loads(capsys.readouterr().out)["rows"]
    assert sorted(row["gpu"] for row in report) == ["0", "1", "2"]
    assert all(row["covered_hours"] < 0.6 for row in report)
    assert (
        main(["report", "--store-url", f"sqlite:///{database}", "--by", "pod", "--output", "json"])
        == 0
    )
    by_pod = {row["pod"]: row for row in json.loads(capsys.readouterr().out)["rows"]}
    assert set(by_pod) >= {"serve-a", "serve-b"}
    assert by_pod["serve-a"]["last_seen"] <= by_pod["serve-b"]["last_seen"]
