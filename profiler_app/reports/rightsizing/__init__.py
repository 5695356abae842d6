"""Right-sizing advice: which MIG profile, share or whole GPU a workload needs, from its measured
peaks (docs/sharing.md). Pure functions: ``profiles`` (the MIG profile table per GPU model, or
NVML's at run time), ``advice`` (needs and verdicts), ``output`` (rows, JSON, CSV, the metric);
``defaults`` what ``report --help`` shows. The names below load their module on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from profiler_app.core.lazy import lazy_names
from profiler_app.reports.rightsizing.defaults import DEFAULT_HEADROOM

if TYPE_CHECKING:
    from profiler_app.reports.rightsizing.advice import (
        Advice,
        Needs,
        Verdict,
        WorkloadUsage,
        recommend,
    )
    from profiler_app.reports.rightsizing.profiles import MODELS, GpuModel, MigProfile, model_for

__all__ = [
    "DEFAULT_HEADROOM",
    "MODELS",
    "Advice",
    "GpuModel",
    "MigProfile",
    "Needs",
    "Verdict",
    "WorkloadUsage",
    "model_for",
    "recommend",
]

if not TYPE_CHECKING:  # hidden from mypy, which checks each name against the imports above
    __getattr__ = lazy_names(
        __name__,
        dict.fromkeys(("Advice", "Needs", "Verdict", "WorkloadUsage", "recommend"), "advice")
        | dict.fromkeys(("MODELS", "GpuModel", "MigProfile", "model_for"), "profiles"),
    )
