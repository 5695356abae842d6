"""``RunOptions``: what a trial run is asked for (namespace, durations, parallelism, limits)."""

from __future__ import annotations

from dataclasses import dataclass

from profiler_app.trial.grace import DEFAULT_GRACE_SECONDS

DEFAULT_NAMESPACE = "gpu-profiler-trials"
PRIORITY_CLASS = "gpu-profiler-trial"


@dataclass(frozen=True)
class RunOptions:
    budget_gpu_hours: float
    namespace: str = DEFAULT_NAMESPACE
    per_trial_seconds: float = 600.0
    warmup_seconds: float = 180.0
    pending_timeout_seconds: float = 120.0
    parallel: int = 1
    allow_scale_up: bool = False
    poll_seconds: float = 5.0
    ttl_seconds: int = 300
    priority_class: str = PRIORITY_CLASS
    skip_tolerance: float = 0.10
    cleanup_timeout_seconds: float = 180.0
    max_gpus: int | None = None  # the quota; default: the largest trial times parallel
    grace_seconds: int = DEFAULT_GRACE_SECONDS  # the cap on trial pods' grace period
    read_only_volumes: bool = False
