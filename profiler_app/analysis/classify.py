"""Job type of each GPU from its utilisation samples: the rules applied to the whole matrix."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from profiler_app.analysis.gaps import fill_gaps
from profiler_app.analysis.periodicity import find_periods
from profiler_app.analysis.recurrence import idle_window_fraction
from profiler_app.analysis.stats import Summary, as_matrix, summarise
from profiler_app.model import FieldStats

# A GPU busy (at or above IDLE_THRESHOLD_PERCENT) in a single sample, or in at most this
# fraction of its samples, is idle: a health check or an nvidia-smi call is not a workload.
MAX_IDLE_ACTIVE_FRACTION = 0.01
# A non-periodic GPU idle for at least this fraction of its samples runs sporadic bursts.
MIN_BURSTY_IDLE_FRACTION = 0.3
# A periodic GPU with idle stretches is training only if at most this fraction of the windows
# one period long hold no busy sample (room for an evaluation pause).
MAX_IDLE_ITERATION_FRACTION = 0.15


class JobType(StrEnum):
    IDLE = "idle"
    TRAINING = "training"
    INFERENCE = "inference"
    BURSTY = "bursty"


@dataclass(frozen=True)
class Classification:
    """What one row of the matrix shows."""

    job_type: JobType
    period_seconds: float | None  # only for training
    stats: FieldStats


def job_types(summary: Summary, periodic: npt.NDArray[np.bool_]) -> list[JobType]:
    """The rules, first match wins: idle, training (periodic), bursty, else inference."""
    allowed_active = np.maximum(1, MAX_IDLE_ACTIVE_FRACTION * summary.valid_count)
    rules = [
        (summary.active_count <= allowed_active, JobType.IDLE),
        (periodic, JobType.TRAINING),
        (summary.idle_fraction >= MIN_BURSTY_IDLE_FRACTION, JobType.BURSTY),
    ]
    types = list(JobType)
    codes = np.select(
        [condition for condition, _ in rules],
        [types.index(job_type) for _, job_type in rules],
        default=types.index(JobType.INFERENCE),
    )
    return [types[code] for code in codes.tolist()]


def classify_matrix(values: object, step_seconds: float) -> list[Classification]:
    """Classify each row (one GPU's utilisation in percent, NaN for missed samples).

    ``values`` is a 2-D array-like, one row per GPU, samples ``step_seconds`` apart.
    Returns one ``Classification`` per row, in order. See the package docstring for the rules.
    """
    if not step_seconds > 0:
        raise ValueError(f"step_seconds must be positive, got {step_seconds!r}")
    matrix = as_matrix(values)
    summary = summarise(matrix)
    periods = find_periods(matrix)
    periodic = np.isfinite(periods)
    # Only periodic rows with idle stretches could be bursts that happen to line up.
    suspect = periodic & (summary.idle_fraction >= MIN_BURSTY_IDLE_FRACTION)
    if suspect.any():
        idle_windows = idle_window_fraction(
            fill_gaps(matrix[suspect]), summary.p95[suspect], periods[suspect]
        )
        periodic[suspect] = idle_windows <= MAX_IDLE_ITERATION_FRACTION
    types = job_types(summary, periodic)
    return [
        Classification(
            job_type,
            period * step_seconds if job_type is JobType.TRAINING else None,
            row_stats,
        )
        for job_type, period, row_stats in zip(
            types, periods.tolist(), summary.field_stats(), strict=True
        )
    ]
