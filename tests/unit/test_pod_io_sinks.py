"""Pods' disk and network rates on the /metrics page (parsed back, checked by promtool) and in
the pod annotations (through the real Kubernetes client against the stand-in API server)."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from collections.abc import Iterator

import pytest
import requests

from profiler_app.core.model import (
    DISK_READ,
    DISK_WRITE,
    NETWORK_RECEIVE,
    NETWORK_TRANSMIT,
    CycleResult,
    IoRates,
    RateStats,
)
from profiler_app.sinks.kubernetes import KubernetesSink
from profiler_app.sinks.metrics import Heartbeat, MetricsSink
from tests.support.apiserver.objects import pod_manifest
from tests.support.apiserver.server import StandInApiServer, running_apiserver
from tests.support.cycles import AT, sample_cycle
from tests.unit.test_metrics_sink import scrape

D = "ai.centaurus.io"
NODE = "node-a"
POD_PATH = "/api/v1/namespaces/ml/pods/trainer-0"
MIB = 2.0**20


def measured(read_max: float = 300 * MIB) -> IoRates:
    return IoRates(
        {
            DISK_READ: RateStats(read_max, 12.34 * MIB),
            DISK_WRITE: RateStats(2 * MIB, 0.5 * MIB),
            NETWORK_RECEIVE: RateStats(100 * MIB, 80 * MIB),
            NETWORK_TRANSMIT: RateStats(5 * MIB, 1 * MIB),
        }
    )


def with_io(io: IoRates | None) -> CycleResult:
    result = sample_cycle(NODE)
    return dataclasses.replace(result, pods=[dataclasses.replace(result.pods[0], io=io)])


@pytest.fixture
def served() -> Iterator[tuple[MetricsSink, str]]:
    sink = MetricsSink(Heartbeat(stale_after_seconds=90))
    port = sink.serve("127.0.0.1", 0)
    yield sink, f"http://127.0.0.1:{port}"
    sink.close()


def labels(**extra: str) -> frozenset[tuple[str, str]]:
    return frozenset({"node": NODE, "namespace": "ml", "pod": "trainer-0", **extra}.items())


def test_metrics_have_each_direction_as_a_bounded_label(served: tuple[MetricsSink, str]) -> None:
    sink, base = served
    sink.publish(with_io(measured()))
    samples = scrape(base)
    peak = "gpu_profiler_pod_io_max_bytes_per_second"
    p95 = "gpu_profiler_pod_io_p95_bytes_per_second"
    assert samples[peak, labels(direction="disk_read")] == 300 * MIB
    assert samples[p95, labels(direction="disk_read")] == pytest.approx(12.34 * MIB)
    assert samples[peak, labels(direction="network_receive")] == 100 * MIB
    assert samples[p95, labels(direction="network_transmit")] == 1 * MIB
    assert samples["gpu_profiler_pod_network_attributable", labels()] == 1.0
    directions = {dict(key[1])["direction"] for key in samples if key[0] == peak}
    assert directions == {"disk_read", "disk_write", "network_receive", "network_transmit"}


def test_a_host_network_pod_has_no_network_series(served: tuple[MetricsSink, str]) -> None:
    sink, base = served
    hidden = IoRates({DISK_READ: RateStats(1 * MIB, 1 * MIB)}, network_attributable=False)
    sink.publish(with_io(hidden))
    samples = scrape(base)
    assert samples["gpu_profiler_pod_network_attributable", labels()] == 0.0
    assert not [key for key in samples if ("direction", "network_receive") in key[1]]
    sink.publish(with_io(None))  # nothing measured: no pod series at all
    assert not [key for key in scrape(base) if key[0].startswith("gpu_profiler_pod_")]


def test_the_page_passes_promtool(served: tuple[MetricsSink, str]) -> None:
    if shutil.which("promtool") is None:
        pytest.skip("promtool (Debian package prometheus) is not installed")
    sink, base = served
    sink.publish(with_io(measured()))
    page = requests.get(f"{base}/metrics", timeout=5).text
    checked = subprocess.run(
        ["promtool", "check", "metrics"], input=page, capture_output=True, text=True, check=False
    )
    problems = [
        line
        for line in (checked.stdout + checked.stderr).splitlines()
        if "gpu_profiler_pod_" in line
    ]
    assert problems == []


@pytest.fixture
def apiserver() -> Iterator[StandInApiServer]:
    with running_apiserver() as server:
        server.add_node(NODE)
        server.add_pod(pod_manifest("ml", "trainer-0", NODE, gpus=1, start_time=AT))
        yield server


def test_pod_annotations_carry_peaks_and_95th_percentiles_in_mib_per_second(
    apiserver: StandInApiServer, sink: KubernetesSink
) -> None:
    sink.publish(with_io(measured()))
    annotations = apiserver.pod("ml", "trainer-0")["metadata"]["annotations"]
    assert {key: value for key, value in annotations.items() if "per-second" in key} == {
        f"{D}/disk-read-max-mib-per-second": "300.0",
        f"{D}/disk-read-p95-mib-per-second": "12.3",
        f"{D}/disk-write-max-mib-per-second": "2.0",
        f"{D}/disk-write-p95-mib-per-second": "0.5",
        f"{D}/network-receive-max-mib-per-second": "100.0",
        f"{D}/network-receive-p95-mib-per-second": "80.0",
        f"{D}/network-transmit-max-mib-per-second": "5.0",
        f"{D}/network-transmit-p95-mib-per-second": "1.0",
    }
    assert annotations[f"{D}/cpu-util-max"] == "250"  # the other keys as before


def test_rates_within_tolerance_are_not_patched_and_a_burst_is(
    apiserver: StandInApiServer, sink: KubernetesSink
) -> None:
    sink.publish(with_io(measured(300 * MIB)))
    sink.publish(with_io(measured(320 * MIB)))  # within 10 %
    assert len(apiserver.requests(method="PATCH", path=POD_PATH)) == 1
    sink.publish(with_io(measured(600 * MIB)))
    patches = apiserver.requests(method="PATCH", path=POD_PATH)
    assert len(patches) == 2
    written = patches[1].json()["metadata"]["annotations"]
    assert written[f"{D}/disk-read-max-mib-per-second"] == "600.0"


def test_a_host_network_pod_says_not_attributable(
    apiserver: StandInApiServer, sink: KubernetesSink
) -> None:
    sink.publish(with_io(measured()))
    hidden = IoRates({DISK_READ: RateStats(1 * MIB, 1 * MIB)}, network_attributable=False)
    sink.publish(with_io(hidden))
    annotations = apiserver.pod("ml", "trainer-0")["metadata"]["annotations"]
    assert annotations[f"{D}/network-receive-max-mib-per-second"] == "not attributable"
    assert annotations[f"{D}/network-transmit-p95-mib-per-second"] == "not attributable"
    assert annotations[f"{D}/disk-read-max-mib-per-second"] == "1.0"
    assert f"{D}/disk-write-max-mib-per-second" not in annotations  # no longer measured: removed
