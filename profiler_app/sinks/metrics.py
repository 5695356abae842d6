"""Prometheus metrics of the latest cycle and of the daemon's health, on /metrics and /healthz.

Per-GPU series are produced from the latest ``CycleResult`` at scrape time, so a GPU (or a pod
on it) that disappears from the result disappears from the page. The registry is our own, not
prometheus-client's global one, so nothing else leaks onto the page.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from profiler_app.analysis.basis import Basis, JobType
from profiler_app.core.errors import UserError
from profiler_app.core.model import GPU_UTIL, IO_FIELDS, CycleResult, GpuProfile
from profiler_app.sinks import field_stat

log = logging.getLogger(__name__)

JOB_TYPES = tuple(job_type.value for job_type in JobType)
# What a verdict rests on: a bounded set of label values, where the free-text reasons would not be.
BASES = tuple(basis.label for basis in Basis)
# A MIG instance adds dcgm-exporter's own labels GPU_I_ID and GPU_I_PROFILE (empty, so absent
# in Prometheus, on a whole GPU): the instances of one GPU are series of their own.
GPU_LABELS = ("Hostname", "gpu", "UUID", "GPU_I_ID", "GPU_I_PROFILE", "namespace", "pod")
# Per pod: the node's GPU-using pods, each direction one of IO_FIELDS.
POD_LABELS = ("node", "namespace", "pod")
# The parts that back off (the source and the sinks) are also counted in consecutive_failures.
PART_KINDS = ("source", "kubernetes", "protection", "store", "metrics", "terminal")
ERROR_KINDS = (*PART_KINDS, "analysis", "cycle")
_CYCLE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

StartResponse = Callable[[str, list[tuple[str, str]]], Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class Heartbeat:
    """When the loop last attempted a cycle; /healthz fails once that is too long ago."""

    def __init__(self, stale_after_seconds: float, clock: Callable[[], float] = time.monotonic):
        self.stale_after_seconds = stale_after_seconds
        self._clock = clock
        self._last = clock()

    def beat(self) -> None:
        self._last = self._clock()

    def age(self) -> float:
        return self._clock() - self._last

    def alive(self) -> bool:
        return self.age() <= self.stale_after_seconds


class _GpuCollector(Collector):
    """Turns the latest cycle result into per-GPU metric families at scrape time."""

    def __init__(self) -> None:
        self.latest: CycleResult | None = None

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        result = self.latest
        families = self._families()
        if result is None:
            return families
        job_type, period, util_max, util_p95, idle, confidence, basis, engine = families
        for profile in result.gpus:
            labels = _gpu_label_values(profile, result.node)
            for name in JOB_TYPES:
                job_type.add_metric([*labels, name], 1.0 if name == profile.job_type else 0.0)
            if _finite(profile.confidence):
                confidence.add_metric(labels, float(profile.confidence or 0.0))
            if profile.basis is not None:
                for name in BASES:
                    basis.add_metric([*labels, name], 1.0 if name == profile.basis else 0.0)
            if profile.engine or profile.framework:
                engine.add_metric([*labels, profile.engine or "", profile.framework or ""], 1.0)
            if profile.job_type == "training" and _finite(profile.period_seconds):
                period.add_metric(labels, float(profile.period_seconds or 0.0))
            # On a MIG instance its GR_ENGINE_ACTIVE, in percent (sinks.field_stat).
            maximum, p95 = field_stat(profile, GPU_UTIL), field_stat(profile, GPU_UTIL, "p95")
            idle_fraction = field_stat(profile, GPU_UTIL, "idle_fraction")
            if _finite(maximum):
                util_max.add_metric(labels, maximum or 0.0)
            if _finite(p95):
                util_p95.add_metric(labels, p95 or 0.0)
            if _finite(idle_fraction):
                idle.add_metric(labels, (idle_fraction or 0.0) * result.window_seconds)
        return families

    @staticmethod
    def _families() -> list[GaugeMetricFamily]:
        labels = list(GPU_LABELS)
        return [
            # A state set, written as a gauge so the state label is ``job_type`` (the text
            # format would name it after the metric).
            GaugeMetricFamily(
                "gpu_profiler_gpu_job_type",
                "What the GPU did over the window: 1 for the current job type, 0 for the others.",
                labels=[*labels, "job_type"],
            ),
            GaugeMetricFamily(
                "gpu_profiler_gpu_period_seconds",
                "Period of the training loop (training GPUs only).",
                labels=labels,
            ),
            GaugeMetricFamily(
                "gpu_profiler_gpu_utilization_max_percent",
                "Maximum GPU utilisation over the window.",
                labels=labels,
            ),
            GaugeMetricFamily(
                "gpu_profiler_gpu_utilization_p95_percent",
                "95th percentile of GPU utilisation over the window.",
                labels=labels,
            ),
            GaugeMetricFamily(
                "gpu_profiler_gpu_idle_seconds",
                "Seconds the GPU was idle within the window.",
                labels=labels,
            ),
            GaugeMetricFamily(
                "gpu_profiler_gpu_confidence",
                "How sure the classifier is of the job type, 0-1 (a heuristic score).",
                labels=labels,
            ),
            GaugeMetricFamily(
                "gpu_profiler_gpu_basis",
                "What the job type rests on: 1 for the current basis (idle, util-loop, "
                "signal-loop, waiting, sibling, prior, bursty, cadence, steady), 0 for the others.",
                labels=[*labels, "basis"],
            ),
            # An info metric: its labels are the tables of profiler_app.profiles.engines, bounded.
            GaugeMetricFamily(
                "gpu_profiler_gpu_engine_info",
                "What runs on the GPU, where known: engine (vllm, torchrun, ...) and framework "
                "(pytorch, jax, ...); empty when only the other is known. Always 1.",
                labels=[*labels, "engine", "framework"],
            ),
        ]


class _PodCollector(Collector):
    """Turns the latest cycle result into per-pod disk and network families at scrape time."""

    def __init__(self) -> None:
        self.latest: CycleResult | None = None

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        result = self.latest
        families = self._families()
        if result is None:
            return families
        peak, p95, attributable = families
        for usage in result.pods:
            if usage.io is None:
                continue
            labels = [usage.node or result.node, usage.namespace, usage.pod]
            for direction in IO_FIELDS:
                for family, which in ((peak, "max"), (p95, "p95")):
                    value = usage.io.stat(direction, which)
                    if _finite(value):
                        family.add_metric([*labels, direction], float(value or 0.0))
            attributable.add_metric(labels, 1.0 if usage.io.network_attributable else 0.0)
        return families

    @staticmethod
    def _families() -> list[GaugeMetricFamily]:
        labels = list(POD_LABELS)
        return [
            GaugeMetricFamily(
                "gpu_profiler_pod_io_max_bytes_per_second",
                "Peak disk or network rate of a GPU-using pod over the window; direction is "
                "disk_read, disk_write, network_receive or network_transmit.",
                labels=[*labels, "direction"],
            ),
            GaugeMetricFamily(
                "gpu_profiler_pod_io_p95_bytes_per_second",
                "95th percentile of a GPU-using pod's disk or network rate over the window.",
                labels=[*labels, "direction"],
            ),
            GaugeMetricFamily(
                "gpu_profiler_pod_network_attributable",
                "1 when the pod's network rates are its own; 0 when they cannot be told from "
                "the host's (a pod on the host's network) and are left out.",
                labels=labels,
            ),
        ]


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _gpu_label_values(profile: GpuProfile, node: str) -> list[str]:
    return [
        profile.hostname or node,
        profile.gpu,
        profile.uuid,
        profile.mig_instance,
        profile.mig_profile,
        profile.namespace or "",
        profile.pod or "",
    ]


# At most this many requests served at once (Prometheus scrapes once, the kubelet probes once):
# more connections are closed unanswered instead of each taking a thread, and a client that
# stops sending is dropped after the timeout, so no client can pile up threads in the daemon.
MAX_CONCURRENT_REQUESTS = 8
REQUEST_TIMEOUT_SECONDS = 10.0


class _QuietHandler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_SECONDS

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics server: " + format, *args)


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True

    def server_activate(self) -> None:
        super().server_activate()
        self._slots = threading.BoundedSemaphore(MAX_CONCURRENT_REQUESTS)
        self._refused_said = False

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            if not self._refused_said:  # once: a flood must not flood the log too
                self._refused_said = True
                log.warning(
                    "metrics server: more than %d requests at once; closing the extra ones",
                    MAX_CONCURRENT_REQUESTS,
                )
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


class MetricsSink:
    """Sink exposing the latest cycle, plus the daemon's health counters, to Prometheus."""

    name = "metrics"

    def __init__(
        self,
        heartbeat: Heartbeat,
        registry: CollectorRegistry | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.heartbeat = heartbeat
        self._clock = clock  # wall time (Unix seconds), for last_success
        self._gpus = _GpuCollector()
        self.registry.register(self._gpus)
        self._pods = _PodCollector()
        self.registry.register(self._pods)
        self.errors = Counter(
            "gpu_profiler_errors",
            "Errors by kind (source, kubernetes, store, metrics, ...).",
            ["kind"],
            registry=self.registry,
        )
        for kind in ERROR_KINDS:
            self.errors.labels(kind=kind)  # present at 0, so rate() and alerts work from the start
        self.cycle_duration = Histogram(
            "gpu_profiler_cycle_duration_seconds",
            "Duration of one profiling cycle.",
            buckets=_CYCLE_BUCKETS,
            registry=self.registry,
        )
        self.last_success = Gauge(
            "gpu_profiler_last_success_timestamp_seconds",
            "Unix time of the last cycle that read its source and published everywhere.",
            registry=self.registry,
        )
        self.consecutive_failures = Gauge(
            "gpu_profiler_consecutive_failures",
            "Failures in a row of the source or a sink; it is waiting out its back-off while > 0.",
            ["kind"],
            registry=self.registry,
        )
        for kind in PART_KINDS:
            self.consecutive_failures.labels(kind=kind)
        self.failing_pods = Gauge(
            "gpu_profiler_failing_pods",
            "Pods a sink could not write to, each waiting out its own back-off (protection: "
            "pods left without the protection or release they need).",
            ["kind"],
            registry=self.registry,
        )
        self.failing_pods.labels(kind="protection")
        self._failing: dict[str, int] = {}
        self._failing_pods: dict[str, dict[str, str]] = {}
        self._last_success_at: float | None = None
        self._pod_list_missing_since: float | None = None
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def publish(self, result: CycleResult) -> None:
        self._gpus.latest = result
        self._pods.latest = result

    def record_error(self, kind: str) -> None:
        self.errors.labels(kind=kind).inc()

    def record_failures(self, kind: str, failures: int) -> None:
        """``failures`` in a row for ``kind`` (0: it works again)."""
        self.consecutive_failures.labels(kind=kind).set(failures)
        if failures:
            self._failing[kind] = failures
        else:
            self._failing.pop(kind, None)

    def record_failing_items(self, kind: str, failing: Mapping[str, str], attempts: int) -> None:
        """The pods (``namespace/name`` -> why) ``kind`` could not write to; ``attempts``
        failed in this cycle (each an error)."""
        if attempts:
            self.errors.labels(kind=kind).inc(attempts)
        if not failing and kind not in self._failing_pods:
            return  # nothing was failing: no series for the sinks that write no pods
        self.failing_pods.labels(kind=kind).set(len(failing))
        if failing:
            self._failing_pods[kind] = dict(failing)
        else:
            self._failing_pods.pop(kind, None)

    def record_pod_list(self, listed: bool) -> None:
        """Whether the cycle had Kubernetes' list of the node's pods; /healthz says since when
        the cycles go without it."""
        if listed:
            self._pod_list_missing_since = None
        elif self._pod_list_missing_since is None:
            self._pod_list_missing_since = self._clock()

    def record_cycle(self, seconds: float, *, success: bool) -> None:
        self.cycle_duration.observe(seconds)
        if success:
            self._last_success_at = self._clock()
            self.last_success.set(self._last_success_at)

    def app(self) -> WsgiApp:
        """The WSGI application: /metrics, /healthz; anything else is 404."""
        metrics_app: WsgiApp = make_wsgi_app(self.registry)

        def dispatch(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            if path == "/metrics":
                return metrics_app(environ, start_response)
            if path == "/healthz":
                return self._healthz(start_response)
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: try /metrics or /healthz\n"]

        return dispatch

    def _healthz(self, start_response: StartResponse) -> Iterator[bytes]:
        """200 while the loop runs, even through an outage (a restart would not end it); the
        body says what is failing. 503 when the loop itself is stuck."""
        age = self.heartbeat.age()
        if self.heartbeat.alive():
            start_response("200 OK", [("Content-Type", "text/plain")])
            yield f"ok: last cycle {age:.0f}s ago; {self.health_summary()}\n".encode()
        else:
            start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
            limit = self.heartbeat.stale_after_seconds
            yield f"stale: last cycle {age:.0f}s ago (limit {limit:.0f}s)\n".encode()

    def health_summary(self) -> str:
        """``last success 412s ago; failing: kubernetes (4 in a row)`` (or ``all parts work``)."""
        last = self._last_success_at
        words = [
            "no success yet" if last is None else f"last success {self._clock() - last:.0f}s ago"
        ]
        failing = dict(self._failing)
        words.append(
            "failing: " + ", ".join(f"{kind} ({n} in a row)" for kind, n in sorted(failing.items()))
            if failing
            else "all parts work"
        )
        for kind, pods in sorted(self._failing_pods.items()):
            words.append(
                f"{kind} failing for {len(pods)} pod(s): "
                + ", ".join(f"{pod} ({why})" for pod, why in sorted(pods.items()))
            )
        missing = self._pod_list_missing_since
        if missing is not None:
            words.append(
                f"no pod list from Kubernetes for {self._clock() - missing:.0f}s: pods are not "
                "annotated, protected or stored"
            )
        return "; ".join(words)

    def serve(self, address: str, port: int) -> int:
        """Starts the HTTP server in a daemon thread; returns the bound port (0 picks one)."""
        server_class = _ThreadingServer6 if ":" in address else _ThreadingServer
        try:
            server = make_server(
                address, port, self.app(), server_class=server_class, handler_class=_QuietHandler
            )
        except OSError as error:
            raise UserError(
                f"cannot serve metrics on {address}:{port}: {error.strerror or error}"
            ) from None
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.5}, name="metrics-http"
        )
        self._thread.daemon = True
        self._thread.start()
        bound_port: int = server.server_port
        log.info("metrics on http://%s:%d/metrics, health on /healthz", address, bound_port)
        return bound_port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
