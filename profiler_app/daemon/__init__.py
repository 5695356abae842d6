"""The profiling daemon: every interval, read the window, classify each GPU, publish everywhere.

Nothing transient stops it: a failing source or sink waits out one back-off policy
(``profiler_app.core.backoff``: one interval, doubling, capped at ten; never shorter than a
Retry-After) while the others go on, and every failure is logged in one line and counted in
``gpu_profiler_errors_total{kind}``. A cycle that skipped a waiting part is not a success.

- ``cycle``: one cycle (read, classify, publish);
- ``parts``: the source and each sink with its back-off;
- ``loop``: ``Daemon``, the loop, its worker thread and the ordered close.
"""

from profiler_app.daemon.cycle import HostReadings
from profiler_app.daemon.loop import STOP_GRACE_SECONDS, Daemon

__all__ = ["STOP_GRACE_SECONDS", "Daemon", "HostReadings"]
