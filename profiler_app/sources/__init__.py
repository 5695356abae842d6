"""Where GPU metrics come from: Prometheus (dcgm-exporter), or NVML and psutil on this host."""

from typing import Protocol

from profiler_app.core.model import SeriesMatrix


class MetricsSource(Protocol):
    """Reads the last ``window_seconds`` of each configured field, one matrix per field.

    Raises ``profiler_app.core.errors.SourceError`` for transient faults (the daemon backs off)
    and ``profiler_app.core.errors.UserError`` for configuration mistakes.
    """

    def read(self, window_seconds: float) -> list[SeriesMatrix]: ...
