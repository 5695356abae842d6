"""Filling missed scrapes (NaN) by linear interpolation, for all rows at once."""

from __future__ import annotations

import numpy as np

from profiler_app.core.model import FloatMatrix


def fill_gaps(matrix: FloatMatrix) -> FloatMatrix:
    """``matrix`` with each NaN replaced by linear interpolation between its row's neighbours.

    Leading and trailing gaps take the nearest valid sample; rows without any sample become 0.
    """
    gapped = ~np.isfinite(matrix).all(axis=1)
    if not gapped.any():
        return matrix
    filled = matrix.copy()
    filled[gapped] = _interpolate(matrix[gapped])
    return filled


def _interpolate(matrix: FloatMatrix) -> FloatMatrix:
    valid = np.isfinite(matrix)
    columns = matrix.shape[1]
    index = np.arange(columns)
    before = np.maximum.accumulate(np.where(valid, index, -1), axis=1)
    after = np.minimum.accumulate(np.where(valid, index, columns)[:, ::-1], axis=1)[:, ::-1]
    has_before, has_after = before >= 0, after < columns
    value_before = np.take_along_axis(matrix, np.clip(before, 0, columns - 1), axis=1)
    value_after = np.take_along_axis(matrix, np.clip(after, 0, columns - 1), axis=1)
    span = np.where(has_before & has_after, np.maximum(after - before, 1), 1)
    weight = (index - before) / span
    between = value_before + (value_after - value_before) * weight
    filled = np.where(
        has_before & has_after, between, np.where(has_before, value_before, value_after)
    )
    filled = np.where(valid, matrix, filled)
    return np.nan_to_num(filled, nan=0.0)
