"""The daemon's whole Prometheus path for pods' disk and network: dcgm-exporter's utilisation at
10 s and the kubelet's cAdvisor counters at 30 s, backfilled into a real Prometheus, read by one
cycle of the daemon.

Two training pods run the same 5-minute loop (4 minutes computing, 1 minute stalled):
``ml/loader-0`` reads its next shard in the 30 s before each stall ends its compute; ``ml/ckpt-0``
streams its input steadily and writes a checkpoint in every third stall. Only the first is
input-bound.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import numpy as np
import pytest

from profiler_app.core.model import DISK_READ, DISK_WRITE, GPU_UTIL, CycleResult, PodInfo
from profiler_app.daemon import Daemon
from profiler_app.sinks.metrics import Heartbeat, MetricsSink
from profiler_app.sources.cadvisor import PodIoQuery
from profiler_app.sources.prometheus import PrometheusSource
from tests.support.daemon_doubles import RecordingSink
from tests.support.dcgm import Gpu, OpenMetricsBuilder, sample_times
from tests.support.prometheus import PrometheusServer

pytestmark = pytest.mark.integration

NODE = "gpu-node-io"
WINDOW = 3600.0
STEP = 10.0
SCRAPE = 30.0
PERIOD = 300.0
STALL = 60.0
MB = 1e6


def loop_util(times: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    phase = (times - times[0]) % PERIOD
    util = np.where(phase < PERIOD - STALL, 95.0, 3.0)
    return np.rint(np.clip(util + rng.normal(0, 2, times.size), 0, 100))


def add_pod_io(
    builder: OpenMetricsBuilder, times: np.ndarray, pod: str, reads: np.ndarray, writes: np.ndarray
) -> None:
    labels = {
        "namespace": "ml",
        "pod": pod,
        "container": "main",
        "node": NODE,
        "device": "/dev/sda",
    }
    builder.add(
        "container_fs_reads_bytes_total", labels, np.cumsum(reads * SCRAPE), times, kind="counter"
    )
    builder.add(
        "container_fs_writes_bytes_total", labels, np.cumsum(writes * SCRAPE), times, kind="counter"
    )


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[PrometheusServer, float]]:
    rng = np.random.default_rng(11)
    points = int(2 * WINDOW / STEP)
    gpu_times = sample_times(points, STEP)
    end = float(gpu_times[-1])
    start = float(gpu_times[0])
    builder = OpenMetricsBuilder()
    for index, pod in enumerate(("loader-0", "ckpt-0")):
        gpu = Gpu(NODE, index, namespace="ml", pod=pod, container="main")
        builder.add(GPU_UTIL, gpu.labels(), loop_util(gpu_times, rng), gpu_times)
    scrapes = sample_times(int(2 * WINDOW / SCRAPE), SCRAPE, end)
    # The rate over each scrape interval (t - 30 s, t], by where t falls in the loop.
    phase = (scrapes - start) % PERIOD
    before_stall = (phase > PERIOD - STALL - SCRAPE) & (phase <= PERIOD - STALL)
    add_pod_io(
        builder,
        scrapes,
        "loader-0",
        reads=np.where(before_stall, 250 * MB, 1 * MB),
        writes=np.full(scrapes.size, 0.5 * MB),
    )
    iteration = ((scrapes - start) // PERIOD).astype(int)
    in_stall = phase > PERIOD - STALL
    checkpoint = in_stall & (iteration % 3 == 2)
    add_pod_io(
        builder,
        scrapes,
        "ckpt-0",
        reads=50 * MB + rng.normal(0, 2 * MB, scrapes.size),
        writes=np.where(checkpoint, 800 * MB, 0.2 * MB),
    )
    with PrometheusServer(builder.text()) as running:
        yield running, end


def listed(name: str) -> PodInfo:
    return PodInfo(
        uid=f"uid-{name}",
        namespace="ml",
        name=name,
        node=NODE,
        phase="Running",
        start_time=datetime(2026, 11, 26, tzinfo=UTC),
        gpu_requests=1,
        gpu_limits=1,
        container_ids={},
        owner_kind="PyTorchJob",
        owner_name=name.partition("-")[0],
    )


def one_cycle(url: str) -> CycleResult:
    source = PrometheusSource(url, NODE, fields=(GPU_UTIL,), step_seconds=STEP)
    sink = RecordingSink("store")
    metrics = MetricsSink(Heartbeat(stale_after_seconds=600))
    daemon = Daemon(
        node=NODE,
        source=source,
        sinks=[sink, metrics],
        metrics=metrics,
        window_seconds=WINDOW,
        interval_seconds=60.0,
        pods=lambda: [listed("loader-0"), listed("ckpt-0")],
        metric_pod_io=PodIoQuery(source).read,
    )
    assert daemon.run_cycle()
    daemon.close()
    return sink.received[-1]


def test_the_loader_is_input_bound_and_the_checkpointer_is_not(
    server: tuple[PrometheusServer, float],
) -> None:
    result = one_cycle(server[0].url)
    gpus = {profile.pod: profile for profile in result.gpus}
    assert {pod: gpus[pod].job_type for pod in gpus} == {
        "loader-0": "training",
        "ckpt-0": "training",
    }
    hint = [reason for reason in gpus["loader-0"].reasons if "input-bound" in reason]
    assert hint
    assert hint[0].startswith("stalls follow disk reads: likely input-bound")
    assert not [reason for reason in gpus["ckpt-0"].reasons if "input-bound" in reason]
    pods = {usage.pod: usage for usage in result.pods}
    loader, ckpt = pods["loader-0"].io, pods["ckpt-0"].io
    assert loader is not None
    assert ckpt is not None
    assert loader.stat(DISK_READ, "max") == pytest.approx(250 * MB, rel=1e-6)
    assert ckpt.stat(DISK_WRITE, "max") == pytest.approx(800 * MB, rel=1e-6)
