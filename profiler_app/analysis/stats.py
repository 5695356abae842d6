"""Per-series summary statistics (max, p95, mean, idle fraction), vectorised over a matrix."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from profiler_app.core.model import FieldStats, FloatMatrix

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.intp]
BoolArray = npt.NDArray[np.bool_]

# A reading below this percentage counts as idle: a few percent is noise (a monitoring
# query, a context kept alive), not a workload.
IDLE_THRESHOLD_PERCENT = 5.0


def as_matrix(values: object) -> FloatMatrix:
    """``values`` as a 2-D float64 array (one row per series), infinities read as missing
    samples (NaN); ValueError for other shapes."""
    matrix = np.asarray(values, dtype=np.float64)
    if matrix.ndim != 2:
        raise ValueError(f"expected a 2-D array (series x samples), got {matrix.ndim}-D")
    infinite = np.isinf(matrix)
    return np.where(infinite, np.nan, matrix) if infinite.any() else matrix


def _p95(matrix: FloatMatrix, counts: IntArray) -> FloatArray:
    """95th percentile of each row's valid samples, with numpy's linear interpolation.

    Rows without a missing sample share the two order statistics they need, so one
    ``partition`` finds them for all such rows at once (about 2.5 times faster than sorting);
    rows with gaps are sorted (NaNs sort to the end, so row ``i``'s valid samples are its first
    ``counts[i]``). Both avoid nanpercentile's loop over rows.
    """
    rows, columns = matrix.shape
    p95 = np.full(rows, np.nan)
    if columns == 0:
        return p95
    complete = counts == columns
    if complete.any():
        position = 0.95 * (columns - 1)
        below = int(np.floor(position))
        above = min(below + 1, columns - 1)
        ordered = matrix[complete] if not complete.all() else matrix.copy()
        ordered.partition([below, above], axis=1)  # in place: one copy of the matrix, not two
        low, high = ordered[:, below], ordered[:, above]
        p95[complete] = low + (high - low) * (position - below)
    gapped = ~complete & (counts > 0)
    if gapped.any():
        ordered = np.sort(matrix[gapped], axis=1)
        valid = counts[gapped]
        position_gapped = 0.95 * (valid - 1)
        below_gapped = np.floor(position_gapped).astype(np.intp)
        above_gapped = np.minimum(below_gapped + 1, valid - 1)
        low = np.take_along_axis(ordered, below_gapped[:, None], axis=1)[:, 0]
        high = np.take_along_axis(ordered, above_gapped[:, None], axis=1)[:, 0]
        p95[gapped] = low + (high - low) * (position_gapped - below_gapped)
    return p95


@dataclass(frozen=True)
class Summary:
    """Per-row arrays; NaN statistics for rows without any valid sample."""

    maximum: FloatArray
    p95: FloatArray
    mean: FloatArray
    idle_fraction: FloatArray
    valid_count: IntArray
    active_count: IntArray  # valid samples at or above IDLE_THRESHOLD_PERCENT
    # Sum over valid samples of the reading above IDLE_THRESHOLD_PERCENT (percentage points):
    # times the step / 100, the seconds of work the row shows beyond noise.
    excess: FloatArray

    def field_stats(self) -> list[FieldStats]:
        return [
            FieldStats(max=a, p95=b, mean=c, idle_fraction=d)
            for a, b, c, d in zip(
                self.maximum.tolist(),
                self.p95.tolist(),
                self.mean.tolist(),
                self.idle_fraction.tolist(),
                strict=True,
            )
        ]


def summarise(matrix: FloatMatrix) -> Summary:
    """Max, p95, mean, idle fraction and sample counts of every row at once."""
    valid = np.isfinite(matrix)
    counts = valid.sum(axis=1)
    present = counts > 0
    safe_counts = np.maximum(counts, 1)
    with np.errstate(invalid="ignore"):
        above = matrix - IDLE_THRESHOLD_PERCENT
        active_samples = valid & (above >= 0)
    active = active_samples.sum(axis=1)
    excess = np.sum(above, axis=1, where=active_samples)
    return Summary(
        maximum=np.where(present, np.max(matrix, axis=1, initial=-np.inf, where=valid), np.nan),
        p95=_p95(matrix, counts),
        mean=np.where(present, np.sum(matrix, axis=1, where=valid) / safe_counts, np.nan),
        idle_fraction=np.where(present, (counts - active) / safe_counts, np.nan),
        valid_count=counts,
        active_count=active,
        excess=excess,
    )


def field_stats(values: object) -> list[FieldStats]:
    """Max, p95, mean and idle fraction of each row of ``values`` (NaN samples ignored).

    Works for any DCGM field (utilisation percentages, framebuffer MiB, ...); the idle fraction
    uses ``IDLE_THRESHOLD_PERCENT`` and only means something for percentages. Rows without any
    sample get NaN everywhere.
    """
    return summarise(as_matrix(values)).field_stats()
