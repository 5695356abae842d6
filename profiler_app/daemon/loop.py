"""The loop: a cycle every interval in a worker thread until a stop request, then an ordered close.

Each cycle runs in a worker thread so that a stop request (SIGTERM) is honoured within seconds
even when a dependency hangs past its own timeouts. Closing is ordered: the worker must have
finished, then the sources stop, then the sinks close. A worker still running after the grace
period is left alone (nothing is closed under it) and the process exits without closing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from profiler_app.core.errors import one_line
from profiler_app.core.model import GPU_UTIL, PodInfo, PodIoSeries, PodPeak
from profiler_app.daemon.cycle import Analysis, Cycle, HostReadings, Inputs
from profiler_app.sinks import Sink
from profiler_app.sinks.metrics import MetricsSink
from profiler_app.sources import MetricsSource

log = logging.getLogger(__name__)

# How long a stop request waits for a running cycle. Every call a cycle makes has its own
# timeout, but several in a row can take longer; then the cycle is abandoned (see above). Well
# within the DaemonSet's terminationGracePeriodSeconds (infra/profiler.py).
STOP_GRACE_SECONDS = 2.0
_POLL_SECONDS = 0.1


class Daemon:
    """Runs cycles until ``stop()``; ``run(once=True)`` runs exactly one; ``close()`` after."""

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
        pods: Callable[[], Sequence[PodInfo] | None] | None = None,
        metric_pod_peaks: Callable[[float], Mapping[tuple[str, str], PodPeak]] | None = None,
        node_sharing: Callable[[], tuple[str | None, int | None]] | None = None,
        metric_pod_io: Callable[[float], Mapping[tuple[str, str], PodIoSeries]] | None = None,
        sources: contextlib.ExitStack | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``pods``: the pod watcher's pods on the node, None until its first list (no callable:
        Kubernetes is off). ``sources`` stops whatever feeds the cycle (samplers, the pod
        watcher, the source's connections); ``close()`` runs it before closing the sinks."""
        self.interval_seconds = interval_seconds
        self.metrics = metrics
        self._stop = threading.Event()
        self._sources = sources or contextlib.ExitStack()
        self.cycle = Cycle(
            Analysis(node, window_seconds, primary_field, node_label),
            source,
            sinks,
            metrics,
            Inputs(host, pods, metric_pod_peaks, node_sharing, metric_pod_io),
            interval_seconds=interval_seconds,
            clock=clock,
            stop=self._stop,
        )
        self._worker: threading.Thread | None = None

    @property
    def cycles(self) -> int:
        return self.cycle.count

    def run_cycle(self) -> bool:
        """One cycle in the caller's thread (tests and benchmarks)."""
        return self.cycle.run()

    # -- control ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Asks the loop to end; safe from a signal handler."""
        self._stop.set()

    def run(self, *, once: bool = False, first_delay_seconds: float = 0.0) -> int:
        """Loops until stopped (exit status 0); with ``once``, 0 if the cycle succeeded, else 1.

        ``first_delay_seconds`` lets a local sampler collect data before the first cycle.
        """
        if once:  # a failure ends the run: no "next try" to promise
            for part in (self.cycle.source_part, *self.cycle.sink_parts):
                part.retries = False
        if first_delay_seconds > 0:
            log.info("sampling for %gs before the first cycle", first_delay_seconds)
            self._wait(first_delay_seconds)
        while not self._stop.is_set():
            succeeded = self._run_cycle_in_worker()
            if once:
                return 0 if succeeded else 1
            self._wait(self.interval_seconds)
        log.info("stopping after %d cycle(s)", self.cycles)
        return 0

    def _wait(self, seconds: float) -> None:
        """Sleeps until the next cycle or a stop."""
        self._stop.wait(seconds)

    def _run_cycle_in_worker(self) -> bool:
        outcome: list[bool] = []

        def work() -> None:
            try:
                outcome.append(self.cycle.run())
            except Exception as error:  # the loop must never die
                log.warning("cycle error: %s", one_line(error))
                self.metrics.record_error("cycle")
                log.debug("cycle failed", exc_info=True)

        self._worker = threading.Thread(target=work, name="profiling-cycle", daemon=True)
        self._worker.start()
        while self._worker.is_alive():
            self._worker.join(_POLL_SECONDS)
            if self._stop.is_set():
                self._worker.join(STOP_GRACE_SECONDS)
                break
        return bool(outcome and outcome[0])

    # -- shutdown --------------------------------------------------------------------------

    def close(self) -> bool:
        """Stops the sources, then closes every sink; False (nothing closed) while a cycle still
        runs, since closing under it could corrupt what it writes."""
        if self._worker is not None and self._worker.is_alive():
            log.warning(
                "a cycle is still running %gs after the stop request (a dependency hangs); "
                "exiting without closing the sources and sinks under it",
                STOP_GRACE_SECONDS,
            )
            return False
        try:
            self._sources.close()
        except Exception as error:
            log.warning("stopping the sources failed: %s", one_line(error))
        for sink in self.cycle.sinks:
            try:
                sink.close()
            except Exception as error:
                log.warning("closing the %s sink failed: %s", sink.name, one_line(error))
        return True
