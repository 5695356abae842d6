"""Where results go: Kubernetes annotations, Prometheus metrics, the table store, the terminal."""

from typing import Protocol

from profiler_app.core.model import CycleResult, GpuProfile, stats_of


class Sink(Protocol):
    """Publishes each cycle's result. ``publish`` may raise; the daemon counts and logs it."""

    name: str

    def publish(self, result: CycleResult) -> None: ...

    def close(self) -> None: ...


def field_stat(profile: GpuProfile, field: str, name: str = "max") -> float | None:
    """One statistic (``max``, ``p95``, ...) of one field of ``profile``; None if not read.
    GPU utilisation and memory bandwidth of a MIG instance come from its own fields
    (``model.stats_of``)."""
    stats = stats_of(profile, field)
    return None if stats is None else float(getattr(stats, name))
