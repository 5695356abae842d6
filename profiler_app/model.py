"""The data that flows from sources through analysis to sinks.

Sources produce ``SeriesMatrix`` objects (one per metric field); ``profiles.build_profiles``
classifies them into ``GpuProfile`` objects; a cycle's ``CycleResult`` goes to every sink.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import numpy.typing as npt

FloatMatrix = npt.NDArray[np.float64]

# dcgm-exporter field names used across the project.
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
MEM_COPY_UTIL = "DCGM_FI_DEV_MEM_COPY_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
SM_ACTIVE = "DCGM_FI_PROF_SM_ACTIVE"


@dataclass(frozen=True)
class SeriesMatrix:
    """One metric field for a set of series on a common time grid.

    ``values[i, j]`` is series ``i`` (labels ``labels[i]``) at ``timestamps[j]``; NaN marks a
    missing sample. Timestamps are Unix seconds, evenly spaced by ``step_seconds``.
    """

    field: str
    labels: list[dict[str, str]]
    timestamps: npt.NDArray[np.float64]
    values: FloatMatrix
    step_seconds: float


@dataclass(frozen=True)
class FieldStats:
    """Summary statistics of one series over the window (NaN samples ignored)."""

    max: float
    p95: float
    mean: float
    idle_fraction: float


@dataclass(frozen=True)
class GpuProfile:
    """What one GPU did over the window."""

    gpu: str  # index on the node, dcgm-exporter's ``gpu`` label
    uuid: str
    hostname: str
    job_type: str
    period_seconds: float | None
    stats: dict[str, FieldStats]  # by field name
    labels: dict[str, str] = field(default_factory=dict)  # every label of the primary series
    namespace: str | None = None
    pod: str | None = None


@dataclass(frozen=True)
class PodPeak:
    """A pod's peaks within the window (None where its cgroup does not account for it)."""

    cpu_util_max: float | None  # percent of one core
    mem_used_max_bytes: float | None


@dataclass(frozen=True)
class PodUsage:
    """Peak resource use of one pod that uses GPUs, as far as this node can see it."""

    namespace: str
    pod: str
    node: str
    start_time: datetime | None
    gpus: tuple[str, ...]
    gpu_util_max: float | None = None
    gpu_mem_util_max: float | None = None
    fb_used_max_mib: float | None = None
    cpu_util_max: float | None = None  # percent of one core
    mem_used_max_bytes: float | None = None


@dataclass(frozen=True)
class CycleResult:
    """Everything one profiling cycle found, handed to every sink."""

    node: str
    at: datetime
    window_seconds: float
    gpus: list[GpuProfile]
    pods: list[PodUsage] = field(default_factory=list)
    host: dict[str, float] = field(default_factory=dict)  # cpu/memory/disk/network utilisation
