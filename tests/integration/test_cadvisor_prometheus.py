"""Pod CPU/memory peaks from cAdvisor series in a real Prometheus.

The ``prometheus`` fixture (tests/conftest.py) backfills, beside the dcgm-exporter series, the
kubelet cAdvisor series of every busy GPU's pod (``tests.support.dcgm.add_cadvisor_pod``: two
containers plus the pod-level and pause rows that must not be counted) with known peaks.
"""

from __future__ import annotations

import pytest

from profiler_app.sources.cadvisor import PodPeaksQuery
from profiler_app.sources.prometheus import PrometheusSource
from tests.support.prometheus import LoadedPrometheus

pytestmark = pytest.mark.integration
WINDOW = 1800.0


@pytest.mark.parametrize("node", ["gpu-node-1", "gpu-node-2"])
def test_peaks_of_the_nodes_pods_in_two_requests(prometheus: LoadedPrometheus, node: str) -> None:
    source = PrometheusSource(prometheus.url, node)
    served = prometheus.server.requests_served("/api/v1/query")
    peaks = PodPeaksQuery(source).read(WINDOW, end=prometheus.dataset.end)
    expected = {
        (namespace, pod): values
        for (host, namespace, pod), values in prometheus.dataset.pod_peaks.items()
        if host == node
    }
    assert len(expected) == 3  # every node has three busy GPUs
    assert set(peaks) == set(expected)
    for key, (cpu, memory) in expected.items():
        assert peaks[key].cpu_util_max == pytest.approx(cpu, rel=1e-6), key
        assert peaks[key].mem_used_max_bytes == pytest.approx(memory, rel=1e-9), key
    assert source.stats.requests == 2
    assert prometheus.server.requests_served("/api/v1/query") == served + 2


def test_a_window_without_the_burst_sees_the_base_load(prometheus: LoadedPrometheus) -> None:
    """The last 10 minutes exclude the burst (20 to 12 minutes before the end)."""
    source = PrometheusSource(prometheus.url, "gpu-node-1")
    peaks = PodPeaksQuery(source).read(600.0, end=prometheus.dataset.end)
    assert peaks
    for peak in peaks.values():
        assert peak.cpu_util_max == pytest.approx(60.0, rel=1e-6)  # main 0.5 + sidecar 0.1
        assert peak.mem_used_max_bytes == pytest.approx(1088 * 2**20)


def test_a_node_without_cadvisor_series_has_no_peaks(prometheus: LoadedPrometheus) -> None:
    source = PrometheusSource(prometheus.url, "gpu-node-9")
    assert PodPeaksQuery(source).read(WINDOW, end=prometheus.dataset.end) == {}
