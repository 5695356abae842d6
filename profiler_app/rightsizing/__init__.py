"""Right-sizing advice: which MIG profile, share or whole GPU a workload needs, from its measured
peaks (docs/sharing.md). Pure functions: ``profiles`` (the MIG profile table per GPU model, or
NVML's at run time), ``advice`` (needs and verdicts), ``output`` (rows, JSON, CSV, the metric)."""

from profiler_app.rightsizing.advice import (
    DEFAULT_HEADROOM,
    Advice,
    Needs,
    Verdict,
    WorkloadUsage,
    recommend,
)
from profiler_app.rightsizing.profiles import MODELS, GpuModel, MigProfile, model_for

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
