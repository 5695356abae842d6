"""The parts a cycle depends on (the source, each sink), each with its back-off.

A part that failed is not tried again until its back-off (``profiler_app.core.backoff``) is over; a
cycle that skips a waiting part is not done, so ``last_success`` does not move, nothing is
logged as recovered and the back-off is not reset. Only a real success resets it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from profiler_app.core.backoff import MAX_BACKOFF_INTERVALS, Backoff
from profiler_app.core.errors import RetryLaterError, one_line
from profiler_app.sinks.metrics import MetricsSink

log = logging.getLogger(__name__)


class Part:
    """One source or sink as the cycle sees it: tried, waited out, or recovered."""

    def __init__(
        self,
        kind: str,
        metrics: MetricsSink,
        *,
        interval_seconds: float,
        clock: Callable[[], float],
    ) -> None:
        self.kind = kind
        self._metrics = metrics
        self.backoff = Backoff(interval_seconds, MAX_BACKOFF_INTERVALS * interval_seconds, clock)
        self.retries = True  # False for `run --once`, which stops after its one cycle

    def waiting(self) -> bool:
        """True while the back-off after a failure lasts: the part is not to be tried."""
        if self.backoff.ready():
            return False
        log.debug("%s: waiting %.0fs more after a failure", self.kind, self.backoff.remaining())
        return True

    def failed(self, error: BaseException, *, since: float) -> None:
        """Logs and counts the failure, and starts (or lengthens) the back-off from ``since``,
        the start of the attempt, so the next cycle due after the delay tries again."""
        retry_after = error.retry_after if isinstance(error, RetryLaterError) else None
        delay = self.backoff.failed(retry_after, since=since)
        self._metrics.record_error(self.kind)
        self._metrics.record_failures(self.kind, self.backoff.failures)
        if self.retries:
            log.warning("%s error: %s; next try in %gs", self.kind, one_line(error), delay)
        else:
            log.warning("%s error: %s", self.kind, one_line(error))

    def succeeded(self) -> None:
        if self.backoff.failures:
            log.info("%s recovered after %d failure(s)", self.kind, self.backoff.failures)
            self._metrics.record_failures(self.kind, 0)
        self.backoff.succeeded()
