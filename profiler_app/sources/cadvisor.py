"""Pods' CPU and memory peaks, and their disk and network rates, on one node from the kubelet's
cAdvisor series in Prometheus."""

from __future__ import annotations

import logging
import math
import time

import numpy as np

from profiler_app.core.errors import UserError
from profiler_app.core.model import (
    DISK_READ,
    DISK_WRITE,
    NETWORK_FIELDS,
    NETWORK_RECEIVE,
    NETWORK_TRANSMIT,
    PodIoSeries,
    PodPeak,
)
from profiler_app.sources.prometheus.client import PrometheusSource
from profiler_app.sources.prometheus.grid import FloatArray, default_step
from profiler_app.sources.prometheus.promql import promql_duration, promql_selector

log = logging.getLogger(__name__)

CADVISOR_NODE_LABEL = "node"  # the node label kube-prometheus-stack puts on cAdvisor series
CADVISOR_RATE_WINDOW = "2m"  # four kubelet scrapes at its 30 s default


class PodPeaksQuery:
    """Each pod's CPU and memory peaks on one node from cAdvisor series (the kubelet's, as
    kube-prometheus-stack scrapes them): two instant queries with subqueries per read.

    For the DaemonSet, which cannot see the host cgroup tree. Rows of pod-level cgroups
    (``container=""``) and pause containers (``container="POD"``) are left out so a pod's
    containers are summed once. No cAdvisor series is not an error: the result is empty.
    """

    def __init__(self, source: PrometheusSource, node_label: str = CADVISOR_NODE_LABEL) -> None:
        self.source = source
        self.node_label = node_label
        self._empty_said = False
        # Containers only: the pod-level cgroup ("") and the pause container ("POD") would
        # count the pod twice.
        containers_only = ',container!="",container!="POD"}'
        self.cpu_selector = (
            promql_selector("container_cpu_usage_seconds_total", node_label, source.node)[:-1]
            + containers_only
        )
        self.memory_selector = (
            promql_selector("container_memory_working_set_bytes", node_label, source.node)[:-1]
            + containers_only
        )

    def queries(self, window_seconds: float) -> tuple[str, str]:
        """(CPU percent of one core, working-set bytes): per-pod peaks within the window."""
        step = self.source.step_seconds or default_step(window_seconds)
        subquery = f"[{promql_duration(window_seconds)}:{promql_duration(step)}]"
        cpu = (
            f"max_over_time((sum by (namespace, pod) (rate({self.cpu_selector}"
            f"[{CADVISOR_RATE_WINDOW}])))"
            f"{subquery}) * 100"
        )
        memory = f"max_over_time((sum by (namespace, pod) ({self.memory_selector})){subquery})"
        return cpu, memory

    def read(
        self, window_seconds: float, end: float | None = None
    ) -> dict[tuple[str, str], PodPeak]:
        """(namespace, pod) -> peaks; a pod missing from one query has None for that resource."""
        at = time.time() if end is None else end
        cpu_query, memory_query = self.queries(window_seconds)
        cpu = _by_pod(self.source.instant_query(cpu_query, at))
        memory = _by_pod(self.source.instant_query(memory_query, at))
        if not cpu and not memory and not self._empty_said:
            self._empty_said = True
            log.info(
                "no cAdvisor series for %s=%s in Prometheus: pods get no CPU/memory peaks",
                self.node_label,
                self.source.node,
            )
        return {
            key: PodPeak(cpu_util_max=cpu.get(key), mem_used_max_bytes=memory.get(key))
            for key in sorted(cpu.keys() | memory.keys())
        }


def _by_pod(samples: list[dict[str, object]]) -> dict[tuple[str, str], float]:
    values = {}
    for sample in samples:
        metric: dict[str, str] = sample["metric"]  # type: ignore[assignment]
        pair: list[object] = sample["value"]  # type: ignore[assignment]
        try:
            value = float(pair[1])  # type: ignore[arg-type]
        except (TypeError, ValueError) as error:
            raise UserError(f"malformed sample in an instant query answer: {error}") from error
        if "namespace" in metric and "pod" in metric and math.isfinite(value):
            values[str(metric["namespace"]), str(metric["pod"])] = value
    return values


# cAdvisor's byte counters for each direction (profiler_app.core.model.IO_FIELDS).
CADVISOR_IO_COUNTERS = {
    DISK_READ: "container_fs_reads_bytes_total",
    DISK_WRITE: "container_fs_writes_bytes_total",
    NETWORK_RECEIVE: "container_network_receive_bytes_total",
    NETWORK_TRANSMIT: "container_network_transmit_bytes_total",
}


class PodIoQuery:
    """Each pod's disk and network rates on one node over the window from cAdvisor series:
    one range request per direction, on the grid of the GPU series.

    The rate is ``irate`` (between the last two kubelet scrapes within ``CADVISOR_RATE_WINDOW``)
    rather than ``rate`` over the whole 2 minutes, so a read burst keeps its height and time at
    the scrape's resolution; both treat a counter going down as a reset. Disk is summed over
    the pod's containers and their devices (the pod-level and pause rows left out, as for
    CPU). Network belongs to the pod's sandbox, and every row of the pod that carries it (the
    pod-level row, the pause container, on some runtimes each container) reports the same
    namespace's counters: the largest per interface is taken, then the interfaces are summed.
    """

    def __init__(self, source: PrometheusSource, node_label: str = CADVISOR_NODE_LABEL) -> None:
        self.source = source
        self.node_label = node_label

    def queries(self) -> dict[str, str]:
        """The PromQL of each direction."""
        queries = {}
        for direction, counter in CADVISOR_IO_COUNTERS.items():
            selector = promql_selector(counter, self.node_label, self.source.node)[:-1]
            if direction in NETWORK_FIELDS:
                rate = f'irate({selector},interface!="lo"}}[{CADVISOR_RATE_WINDOW}])'
                queries[direction] = (
                    f"sum by (namespace, pod) (max by (namespace, pod, interface) ({rate}))"
                )
            else:
                rate = f'irate({selector},container!="",container!="POD"}}[{CADVISOR_RATE_WINDOW}])'
                queries[direction] = f"sum by (namespace, pod) ({rate})"
        return queries

    def read(
        self, window_seconds: float, end: float | None = None
    ) -> dict[tuple[str, str], PodIoSeries]:
        """(namespace, pod) -> its rates; a direction without series for the pod is left out."""
        at = time.time() if end is None else end
        timestamps: FloatArray | None = None
        rates: dict[tuple[str, str], dict[str, FloatArray]] = {}
        for direction, query in self.queries().items():
            labels, values, timestamps = self.source.range_query(query, window_seconds, at)
            for row, metric in enumerate(labels):
                if "namespace" in metric and "pod" in metric:
                    finite = np.where(np.isfinite(values[row]), values[row], np.nan)
                    rates.setdefault((metric["namespace"], metric["pod"]), {})[direction] = finite
        if timestamps is None:
            return {}
        return {key: PodIoSeries(timestamps, by_direction) for key, by_direction in rates.items()}
