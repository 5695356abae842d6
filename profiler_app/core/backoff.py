"""The one back-off policy of the daemon, its sinks and the pod watcher.

After the n-th consecutive failure the next attempt waits ``initial * 2**(n-1)`` seconds,
capped at ``maximum``, and never less than a Retry-After the server asked for (itself capped
at ``maximum``, so a hostile or mistaken header cannot silence us for hours). A success resets
it. The caller asks ``ready()`` before trying, so a loop never blocks inside the policy: the
daemon keeps its heartbeat and stop requests while a dependency is waited out. Retry libraries
(tenacity, backoff) wrap a call and sleep inside it, which is the part we must not do.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# Back-off after consecutive failures: one interval, doubling, up to this many intervals
# (5 min at the 30 s default).
MAX_BACKOFF_INTERVALS = 10


class Backoff:
    """Exponential back-off between failed attempts, on a clock that tests can drive."""

    def __init__(
        self,
        initial: float,
        maximum: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < initial <= maximum:
            raise ValueError(f"back-off needs 0 < initial <= maximum, got {initial}, {maximum}")
        self.initial, self.maximum = initial, maximum
        self._clock = clock
        self.failures = 0  # consecutive
        self._until = 0.0

    def ready(self) -> bool:
        """Whether the wait after the last failure is over (always, after a success)."""
        return self._clock() >= self._until

    def remaining(self) -> float:
        """Seconds left to wait; 0 when ready."""
        return max(0.0, self._until - self._clock())

    def next_delay(self, retry_after: float | None = None) -> float:
        """The wait the next failure would start."""
        delay = min(self.maximum, self.initial * 2.0 ** min(self.failures, 60))
        return max(delay, min(retry_after or 0.0, self.maximum))

    def failed(self, retry_after: float | None = None, *, since: float | None = None) -> float:
        """Record a failure; returns the seconds to wait before the next attempt.

        The wait counts from ``since`` (when the failed attempt started) if given, else now.
        """
        delay = self.next_delay(retry_after)
        self.failures += 1
        self._until = (self._clock() if since is None else since) + delay
        return delay

    def succeeded(self) -> None:
        self.failures = 0
        self._until = 0.0
