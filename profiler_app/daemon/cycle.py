"""One profiling cycle: read the window, classify each GPU, publish to every sink.

A cycle is done only when the source was read and every sink published. A part waiting out its
back-off (``parts.Part``) is not tried, and the cycle is then not done: it is never counted as a
success, so ``gpu_profiler_last_success_timestamp_seconds`` tells how long an outage has lasted.

When the GPU series cannot be read, the sinks that act on the pod list alone
(``acts_without_metrics``: owner-based training protection) still get the cycle's pods, in a
result whose ``gpus_read`` is False. A sink that fails for some items only
(``ItemsFailedError``: protection's pods, each with its own back-off) is not backed off.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from profiler_app.core.errors import ItemsFailedError, one_line
from profiler_app.core.model import (
    GPU_UTIL,
    CycleResult,
    GpuProfile,
    PodInfo,
    PodIoSeries,
    PodPeak,
    SeriesMatrix,
)
from profiler_app.daemon.parts import Part
from profiler_app.profiles.build import build_profiles
from profiler_app.profiles.pods import (
    attribute_series,
    identities_of,
    io_by_pod,
    pod_usage,
    workloads_of,
)
from profiler_app.sinks import Sink
from profiler_app.sinks.metrics import MetricsSink
from profiler_app.sources import MetricsSource

log = logging.getLogger(__name__)


class HostReadings(Protocol):
    def snapshot(self) -> dict[str, float]: ...

    def pod_peaks(self) -> dict[str, PodPeak]: ...

    def pod_io(self) -> dict[str, PodIoSeries]: ...


@dataclass(frozen=True)
class Inputs:
    """Where a cycle's data comes from besides the GPU series."""

    host: HostReadings | None = None  # local sampling: the host and pod cgroups
    # The pod watcher's snapshot, None until its first list; no callable: Kubernetes is off.
    pods: Callable[[], Sequence[PodInfo] | None] | None = None
    # Pod CPU/memory peaks from Prometheus (cAdvisor) by (namespace, pod), given the window.
    metric_pod_peaks: Callable[[float], Mapping[tuple[str, str], PodPeak]] | None = None
    # The node's GPU sharing as GPU feature discovery labels it (sources.gfd): strategy, replicas.
    node_sharing: Callable[[], tuple[str | None, int | None]] | None = None
    # Pods' disk and network rates from Prometheus (cAdvisor) by (namespace, pod), given the
    # window.
    metric_pod_io: Callable[[float], Mapping[tuple[str, str], PodIoSeries]] | None = None


@dataclass(frozen=True)
class Analysis:
    """How the series are read and classified."""

    node: str
    window_seconds: float
    primary_field: str = GPU_UTIL
    node_label: str = "Hostname"


class Cycle:
    """Runs cycles; ``stop`` (an event) ends one between sinks."""

    def __init__(
        self,
        analysis: Analysis,
        source: MetricsSource,
        sinks: Sequence[Sink],
        metrics: MetricsSink,
        inputs: Inputs,
        *,
        interval_seconds: float,
        clock: Callable[[], float],
        stop: threading.Event,
    ) -> None:
        self.analysis = analysis
        self.source = source
        self.sinks = list(sinks)
        self.metrics = metrics
        self.inputs = inputs
        self._clock = clock
        self._stop = stop

        def part(kind: str) -> Part:
            return Part(kind, metrics, interval_seconds=interval_seconds, clock=clock)

        self.source_part = part("source")
        self.sink_parts = [part(sink.name) for sink in self.sinks]
        self.count = 0
        self._without_pod_list = False

    def run(self) -> bool:
        """Reads, classifies and publishes once; True when the source and every sink worked."""
        self.metrics.heartbeat.beat()
        started = self._clock()
        self.count += 1
        result = self._read_and_classify(started)
        done = result is not None
        if result is None:
            self._publish_without_metrics(started)
        else:
            for sink, part in zip(self.sinks, self.sink_parts, strict=True):
                if self._stop.is_set():
                    done = False
                    break
                done = self._publish(sink, part, result, started) and done
        self.metrics.record_cycle(self._clock() - started, success=done)
        self.metrics.heartbeat.beat()
        return done

    def _read_and_classify(self, started: float) -> CycleResult | None:
        if self.source_part.waiting():
            return None
        try:
            matrices = self.source.read(self.analysis.window_seconds)
        except Exception as error:
            self.source_part.failed(error, since=started)
            return None
        self.source_part.succeeded()
        listed = self._listed_pods()
        pods = list(listed or [])
        host = self.inputs.host
        io = io_by_pod(pods, host.pod_io() if host is not None else {}, self._read_metric_pod_io())
        try:
            profiles = self._profiles(attribute_series(matrices, pods), pods, io)
        except Exception as error:
            self._record_error("analysis", one_line(error))
            return None
        return CycleResult(
            node=self.analysis.node,
            at=datetime.now(UTC),
            window_seconds=self.analysis.window_seconds,
            gpus=profiles,
            pods=pod_usage(
                profiles,
                pods,
                host.pod_peaks() if host is not None else {},
                self.analysis.node,
                self._read_metric_pod_peaks(),
                listed_only=self.inputs.pods is not None,
                io=io,
            ),
            host=host.snapshot() if host is not None else {},
            node_pods=None if listed is None else tuple(pods),
        )

    def _listed_pods(self) -> Sequence[PodInfo] | None:
        """The pods Kubernetes lists on the node; None when it is off or while its first list
        has not come (no pod is then annotated, protected or stored; /healthz says so)."""
        if self.inputs.pods is None:
            return None
        listed = self.inputs.pods()
        self.metrics.record_pod_list(listed is not None)
        if listed is not None and self._without_pod_list:
            log.info(
                "pod list arrived from Kubernetes: pods are annotated, protected and stored "
                "from this cycle on"
            )
        self._without_pod_list = listed is None
        return listed

    def _read_metric_pod_peaks(self) -> Mapping[tuple[str, str], PodPeak]:
        """Prometheus' pod peaks, or none this cycle when reading them fails: they only add to
        the GPU results, so a failure is counted as a source error but fails nothing."""
        if self.inputs.metric_pod_peaks is None:
            return {}
        try:
            return self.inputs.metric_pod_peaks(self.analysis.window_seconds)
        except Exception as error:
            self._record_error(
                "source", f"pod CPU/memory peaks: {one_line(error)}; none this cycle"
            )
            return {}

    def _read_metric_pod_io(self) -> Mapping[tuple[str, str], PodIoSeries]:
        """Prometheus' pod disk and network rates, or none this cycle when reading them fails
        (counted as a source error, failing nothing, as the pod peaks)."""
        if self.inputs.metric_pod_io is None:
            return {}
        try:
            return self.inputs.metric_pod_io(self.analysis.window_seconds)
        except Exception as error:
            self._record_error(
                "source", f"pod disk/network rates: {one_line(error)}; none this cycle"
            )
            return {}

    def _profiles(
        self,
        matrices: list[SeriesMatrix],
        pods: list[PodInfo],
        io: Mapping[tuple[str, str], PodIoSeries],
    ) -> list[GpuProfile]:
        if not matrices:  # local sampling without GPUs
            return []
        # The pods' owners and engines are the classifier's prior; owners group the pods of
        # one workload.
        return build_profiles(
            matrices,
            self.analysis.primary_field,
            self.analysis.node_label,
            workloads_of(pods),
            identities_of(pods),
            node_sharing=self.inputs.node_sharing() if self.inputs.node_sharing else None,
            pod_io=io,
        )

    def _publish_without_metrics(self, started: float) -> None:
        """The pods alone, to the sinks that act on them without GPU series."""
        chosen = [
            (sink, part)
            for sink, part in zip(self.sinks, self.sink_parts, strict=True)
            if getattr(sink, "acts_without_metrics", False)
        ]
        listed = self._listed_pods() if chosen else None
        if listed is None:
            return
        result = CycleResult(
            node=self.analysis.node,
            at=datetime.now(UTC),
            window_seconds=self.analysis.window_seconds,
            gpus=[],
            node_pods=tuple(listed),
            gpus_read=False,
        )
        for sink, part in chosen:
            if not self._stop.is_set():
                self._publish(sink, part, result, started)

    def _publish(self, sink: Sink, part: Part, result: CycleResult, started: float) -> bool:
        if part.waiting():
            return False
        try:
            sink.publish(result)
        except ItemsFailedError as error:  # the sink backs off per item: the part goes on
            part.succeeded()
            self.metrics.record_failing_items(sink.name, error.failing, error.attempts)
            return False
        except Exception as error:
            part.failed(error, since=started)
            return False
        part.succeeded()
        self.metrics.record_failing_items(sink.name, {}, 0)
        return True

    def _record_error(self, kind: str, message: str) -> None:
        log.warning("%s error: %s", kind, message)
        self.metrics.record_error(kind)
