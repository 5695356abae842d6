"""The profiling loop: every interval, read the window, classify each GPU, publish everywhere.

Nothing transient stops it: a failing source backs off exponentially (capped) and recovers, a
failing sink is skipped for a growing number of cycles without holding up the others, and every
failure is logged in one line and counted in ``gpu_profiler_errors_total{kind}``. Each cycle runs
in a worker thread so that a stop request (SIGTERM) is honoured within seconds even when a
dependency hangs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

from profiler_app.model import GPU_UTIL, CycleResult, GpuProfile, PodPeak, SeriesMatrix
from profiler_app.pods import attribute_profiles, pod_usage
from profiler_app.profiles import build_profiles
from profiler_app.sinks import Sink
from profiler_app.sinks.metrics import MetricsSink
from profiler_app.sources import MetricsSource

if TYPE_CHECKING:  # the Kubernetes client is imported only when Kubernetes is used
    from profiler_app.sources.kube_pods import PodInfo

log = logging.getLogger(__name__)

# Backoff doubles per consecutive failure up to this many intervals (5 min at the 30 s default).
MAX_BACKOFF_FACTOR = 10
# How long a stop request waits for a running cycle before abandoning it; closing the sinks
# takes the rest of the 5 s a container gets between SIGTERM and SIGKILL in tests and charts.
STOP_GRACE_SECONDS = 1.5
_POLL_SECONDS = 0.1


def one_line(error: BaseException) -> str:
    """``Type: message`` on one line, for logs."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class HostReadings(Protocol):
    def snapshot(self) -> dict[str, float]: ...

    def pod_peaks(self) -> dict[str, PodPeak]: ...


@dataclass
class Backoff:
    """Consecutive failures -> a factor 1, 2, 4, ... capped at ``cap``; success resets it."""

    cap: int = MAX_BACKOFF_FACTOR
    failures: int = 0

    @property
    def factor(self) -> int:
        if self.failures == 0:
            return 1
        return int(min(2 ** (self.failures - 1), self.cap))

    def failed(self) -> int:
        self.failures += 1
        return self.factor

    def succeeded(self) -> None:
        self.failures = 0


class _GuardedSink:
    """A sink that is skipped for ``factor - 1`` cycles after each failure."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.backoff = Backoff()
        self.skip_cycles = 0

    @property
    def kind(self) -> str:
        return self.sink.name


class Daemon:
    """Runs cycles until ``stop()``; ``run(once=True)`` runs exactly one."""

    def __init__(
        self,
        *,
        node: str,
        source: MetricsSource,
        sinks: Sequence[Sink],
        metrics: MetricsSink,
        window_seconds: float,
        interval_seconds: float,
        primary_field: str = GPU_UTIL,
        node_label: str = "Hostname",
        host: HostReadings | None = None,
        pods: Callable[[], Sequence[PodInfo]] | None = None,
        metric_pod_peaks: Callable[[float], Mapping[tuple[str, str], PodPeak]] | None = None,
    ) -> None:
        self.node = node
        self.source = source
        self.sinks = [_GuardedSink(sink) for sink in sinks]
        self.metrics = metrics
        self.window_seconds = window_seconds
        self.interval_seconds = interval_seconds
        self.primary_field = primary_field
        self.node_label = node_label
        self.host = host
        self.pods = pods
        # Pod CPU/memory peaks from Prometheus (cAdvisor) by (namespace, pod), given the window.
        self.metric_pod_peaks = metric_pod_peaks
        self.source_backoff = Backoff()
        self.cycles = 0
        self._stop = threading.Event()
        self._worker: threading.Thread | None = None

    # -- control ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Asks the loop to end; safe from a signal handler."""
        self._stop.set()

    def run(self, *, once: bool = False, first_delay_seconds: float = 0.0) -> int:
        """Loops until stopped (exit status 0); with ``once``, 0 if the cycle succeeded, else 1.

        ``first_delay_seconds`` lets a local sampler collect data before the first cycle.
        """
        if first_delay_seconds > 0:
            log.info("sampling for %gs before the first cycle", first_delay_seconds)
            self._wait(first_delay_seconds)
        while not self._stop.is_set():
            succeeded = self._run_cycle_in_worker()
            if once:
                return 0 if succeeded else 1
            self._wait(self.interval_seconds * self.source_backoff.factor)
        log.info("stopping after %d cycle(s)", self.cycles)
        return 0

    def _wait(self, seconds: float) -> None:
        """Sleeps until the next cycle or a stop, beating the heartbeat every interval: a loop
        that is backing off is alive; only a hung cycle lets /healthz go stale."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            if self._stop.wait(min(remaining, self.interval_seconds)):
                return
            self.metrics.heartbeat.beat()

    def close(self) -> None:
        """Closes every sink; one failing to close does not keep the others open."""
        for guarded in self.sinks:
            try:
                guarded.sink.close()
            except Exception as error:
                log.warning("closing the %s sink failed: %s", guarded.kind, one_line(error))

    # -- one cycle -------------------------------------------------------------------------

    def _run_cycle_in_worker(self) -> bool:
        if self._worker is not None and self._worker.is_alive():
            # A dependency hangs past its own timeouts: don't pile up threads; /healthz goes
            # stale and the orchestrator restarts us.
            self._record_error("cycle", "the previous cycle is still running; skipping this one")
            return False
        outcome: list[bool] = []
        done = threading.Event()

        def work() -> None:
            try:
                outcome.append(self.run_cycle())
            except Exception as error:  # the loop must never die
                self._record_error("cycle", one_line(error))
                log.debug("cycle failed", exc_info=True)
            finally:
                done.set()

        self._worker = threading.Thread(target=work, name="profiling-cycle", daemon=True)
        self._worker.start()
        while not done.wait(_POLL_SECONDS):
            if self._stop.is_set():
                if not done.wait(STOP_GRACE_SECONDS):
                    log.warning("abandoning a cycle that is still running")
                break
        return bool(outcome and outcome[0])

    def run_cycle(self) -> bool:
        """Reads, classifies and publishes once; True when the source and every sink worked."""
        self.metrics.heartbeat.beat()
        started = time.monotonic()
        self.cycles += 1
        result = self._read_and_classify()
        succeeded = result is not None
        if result is not None:
            for guarded in self.sinks:
                if self._stop.is_set():
                    succeeded = False
                    break
                succeeded = self._publish(guarded, result) and succeeded
        self.metrics.record_cycle(time.monotonic() - started, success=succeeded)
        self.metrics.heartbeat.beat()
        return succeeded

    def _read_and_classify(self) -> CycleResult | None:
        try:
            matrices = self.source.read(self.window_seconds)
        except Exception as error:
            factor = self.source_backoff.failed()
            self._record_error(
                "source", f"{one_line(error)}; next try in {self.interval_seconds * factor:g}s"
            )
            return None
        if self.source_backoff.failures:
            log.info("source recovered after %d failure(s)", self.source_backoff.failures)
        self.source_backoff.succeeded()
        try:
            profiles = self._profiles(matrices)
        except Exception as error:
            self._record_error("analysis", one_line(error))
            return None
        pods = list(self.pods()) if self.pods is not None else []
        profiles = attribute_profiles(profiles, pods)
        peaks: Mapping[str, PodPeak] = self.host.pod_peaks() if self.host is not None else {}
        return CycleResult(
            node=self.node,
            at=datetime.now(UTC),
            window_seconds=self.window_seconds,
            gpus=profiles,
            pods=pod_usage(profiles, pods, peaks, self.node, self._read_metric_pod_peaks()),
            host=self.host.snapshot() if self.host is not None else {},
        )

    def _read_metric_pod_peaks(self) -> Mapping[tuple[str, str], PodPeak]:
        """Prometheus' pod peaks, or none this cycle when reading them fails: they only add to
        the GPU results, so a failure is counted as a source error but fails nothing."""
        if self.metric_pod_peaks is None:
            return {}
        try:
            return self.metric_pod_peaks(self.window_seconds)
        except Exception as error:
            self._record_error(
                "source", f"pod CPU/memory peaks: {one_line(error)}; none this cycle"
            )
            return {}

    def _profiles(self, matrices: list[SeriesMatrix]) -> list[GpuProfile]:
        if not matrices:  # local sampling without GPUs
            return []
        return build_profiles(matrices, self.primary_field, self.node_label)

    def _publish(self, guarded: _GuardedSink, result: CycleResult) -> bool:
        if guarded.skip_cycles > 0:
            guarded.skip_cycles -= 1
            log.debug("skipping the %s sink while it backs off", guarded.kind)
            return False
        try:
            guarded.sink.publish(result)
        except Exception as error:
            factor = guarded.backoff.failed()
            guarded.skip_cycles = factor - 1
            self._record_error(
                guarded.kind,
                f"publishing failed: {one_line(error)}; skipping it for {factor - 1} cycle(s)",
            )
            return False
        if guarded.backoff.failures:
            log.info("the %s sink recovered", guarded.kind)
        guarded.backoff.succeeded()
        return True

    def _record_error(self, kind: str, message: str) -> None:
        log.warning("%s error: %s", kind, message)
        self.metrics.record_error(kind)
