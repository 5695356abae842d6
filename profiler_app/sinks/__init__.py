"""Where results go: Kubernetes annotations, Prometheus metrics, the table store, the terminal."""

from typing import Protocol

from profiler_app.model import GPU_UTIL, MEM_COPY_UTIL, CycleResult, GpuProfile

# DCGM's profiling fields are ratios (0-1); standing in for a percentage, they are scaled.
_RATIO_PREFIX = "DCGM_FI_PROF_"


class Sink(Protocol):
    """Publishes each cycle's result. ``publish`` may raise; the daemon counts and logs it."""

    name: str

    def publish(self, result: CycleResult) -> None: ...

    def close(self) -> None: ...


def field_stat(profile: GpuProfile, field: str, name: str = "max") -> float | None:
    """One statistic (``max``, ``p95``, ...) of one field of ``profile``; None if not read.

    GPU utilisation and memory bandwidth are read from the fields that stand for them on this
    GPU (on a MIG instance GR_ENGINE_ACTIVE and DRAM_ACTIVE, in percent).
    """
    source = {GPU_UTIL: profile.util_field, MEM_COPY_UTIL: profile.mem_field}.get(field, field)
    stats = profile.stats.get(source)
    if stats is None:
        return None
    value = float(getattr(stats, name))
    ratio = source != field and source.startswith(_RATIO_PREFIX) and name != "idle_fraction"
    return value * 100.0 if ratio else value
