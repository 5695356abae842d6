"""Pods' disk and network rates from cAdvisor series in a real Prometheus (``PodIoQuery``).

The series are backfilled with promtool as a kubelet exports them at its 30 s scrape: disk
counters per container and device, plus the pod-level (``container=""``) and pause rows that
must not be counted again; network counters on every row of the pod (the same sandbox
namespace seen from each), on two interfaces and loopback. A container restart resets its
disk counter halfway.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from profiler_app.analysis.io import io_rates
from profiler_app.core.model import DISK_READ, DISK_WRITE, NETWORK_RECEIVE, NETWORK_TRANSMIT
from profiler_app.sources.cadvisor import PodIoQuery
from profiler_app.sources.prometheus import PrometheusSource
from tests.support.dcgm import OpenMetricsBuilder, sample_times
from tests.support.prometheus import PrometheusServer

pytestmark = pytest.mark.integration

NODE = "gpu-node-io"
SCRAPE = 30.0
WINDOW = 1800.0
MB = 1e6
# main reads 4 MB/s, sidecar 1 MB/s; main bursts to 200 MB/s for one minute.
MAIN_READ, SIDECAR_READ, BURST_READ = 4 * MB, 1 * MB, 200 * MB
BURST = (16 * 60.0, 15 * 60.0)  # seconds before the end
RESTART = 8 * 60.0  # main's counters start again from zero this long before the end
WRITE = 3 * MB
ETH0_IN, NET1_IN, LO_IN = 7 * MB, 2 * MB, 500 * MB
ETH0_OUT = 5 * MB


@dataclass(frozen=True)
class IoCluster:
    server: PrometheusServer
    end: float


def _counter(rate: np.ndarray) -> np.ndarray:
    return np.cumsum(rate * SCRAPE)


def cadvisor_io(builder: OpenMetricsBuilder, times: np.ndarray, node: str, pod: str) -> None:
    before_end = times[-1] - times
    burst = (before_end <= BURST[0]) & (before_end > BURST[1])
    restarted = before_end < RESTART
    main_read = np.where(burst, BURST_READ, MAIN_READ)
    main_counter = _counter(main_read)
    main_counter[restarted] = _counter(main_read[restarted])  # from zero after the restart
    disk = {
        "main": {"read": main_counter, "write": _counter(np.full(times.size, WRITE))},
        "sidecar": {"read": _counter(np.full(times.size, SIDECAR_READ)), "write": 0 * times},
        "POD": {"read": 0 * times, "write": 0 * times},
    }
    disk[""] = {  # the pod-level cgroup: its containers' sum, not to be counted again
        kind: disk["main"][kind] + disk["sidecar"][kind] for kind in ("read", "write")
    }
    network = {
        "eth0": (_counter(np.full(times.size, ETH0_IN)), _counter(np.full(times.size, ETH0_OUT))),
        "net1": (_counter(np.full(times.size, NET1_IN)), 0 * times),
        "lo": (_counter(np.full(times.size, LO_IN)), _counter(np.full(times.size, LO_IN))),
    }
    for container, counters in disk.items():
        base = {"namespace": "ml", "pod": pod, "container": container, "node": node}
        for device, share in (("/dev/nvme0n1", 0.75), ("/dev/sda", 0.25)):
            labels = {**base, "device": device, "job": "kubelet"}
            builder.add(
                "container_fs_reads_bytes_total",
                labels,
                counters["read"] * share,
                times,
                kind="counter",
            )
            builder.add(
                "container_fs_writes_bytes_total",
                labels,
                counters["write"] * share,
                times,
                kind="counter",
            )
        # Every row of the pod sees the sandbox's namespace.
        for interface, (received, sent) in network.items():
            labels = {**base, "interface": interface, "job": "kubelet"}
            builder.add(
                "container_network_receive_bytes_total", labels, received, times, kind="counter"
            )
            builder.add(
                "container_network_transmit_bytes_total", labels, sent, times, kind="counter"
            )


@pytest.fixture(scope="module")
def io_cluster() -> Iterator[IoCluster]:
    times = sample_times(int(2 * WINDOW / SCRAPE), SCRAPE)
    builder = OpenMetricsBuilder()
    cadvisor_io(builder, times, NODE, "trainer-0")
    cadvisor_io(builder, times, "other-node", "elsewhere")
    with PrometheusServer(builder.text()) as server:
        yield IoCluster(server, float(times[-1]))


def read(cluster: IoCluster, node: str = NODE, window: float = WINDOW) -> dict:
    source = PrometheusSource(cluster.server.url, node)
    found = PodIoQuery(source).read(window, end=cluster.end)
    assert source.stats.requests == 4  # one range request per direction
    return found


def test_one_range_request_per_direction_and_only_the_nodes_pods(io_cluster: IoCluster) -> None:
    served = io_cluster.server.requests_served("/api/v1/query_range")
    found = read(io_cluster)
    assert set(found) == {("ml", "trainer-0")}
    assert io_cluster.server.requests_served("/api/v1/query_range") == served + 4


def test_disk_counts_containers_once_and_keeps_the_burst(io_cluster: IoCluster) -> None:
    rates = io_rates(read(io_cluster)["ml", "trainer-0"])
    assert rates is not None
    # The burst at the scrape's resolution (irate), summed over devices and containers only.
    assert rates.stat(DISK_READ, "max") == pytest.approx(BURST_READ + SIDECAR_READ, rel=1e-6)
    # The burst is 1 of 30 minutes: the 95th percentile is the base load.
    assert rates.stat(DISK_READ, "p95") == pytest.approx(MAIN_READ + SIDECAR_READ, rel=1e-6)
    assert rates.stat(DISK_WRITE, "max") == pytest.approx(WRITE, rel=1e-6)


def test_a_counter_reset_is_no_spike_and_no_negative_rate(io_cluster: IoCluster) -> None:
    series = read(io_cluster)["ml", "trainer-0"]
    reads = series.rates[DISK_READ]
    after = series.timestamps > io_cluster.end - RESTART + SCRAPE
    assert after.sum() > 10
    assert np.nanmin(reads) >= 0
    assert np.allclose(reads[after & np.isfinite(reads)], MAIN_READ + SIDECAR_READ, rtol=1e-6)


def test_network_sums_interfaces_once_per_pod_without_loopback(io_cluster: IoCluster) -> None:
    rates = io_rates(read(io_cluster)["ml", "trainer-0"])
    assert rates is not None
    assert rates.network_attributable
    assert rates.stat(NETWORK_RECEIVE, "max") == pytest.approx(ETH0_IN + NET1_IN, rel=1e-6)
    assert rates.stat(NETWORK_RECEIVE, "p95") == pytest.approx(ETH0_IN + NET1_IN, rel=1e-6)
    assert rates.stat(NETWORK_TRANSMIT, "max") == pytest.approx(ETH0_OUT, rel=1e-6)


def test_a_window_after_the_burst_sees_the_base_load(io_cluster: IoCluster) -> None:
    rates = io_rates(read(io_cluster, window=600.0)["ml", "trainer-0"])
    assert rates is not None
    assert rates.stat(DISK_READ, "max") == pytest.approx(MAIN_READ + SIDECAR_READ, rel=1e-6)


def test_a_node_without_cadvisor_series_has_no_rates(io_cluster: IoCluster) -> None:
    assert read(io_cluster, node="gpu-node-9") == {}
