"""Does the activity recur in every iteration? Tells a training loop from sporadic bursts."""

from __future__ import annotations

import numpy as np

from profiler_app.analysis.gaps import fill_gaps
from profiler_app.analysis.stats import IDLE_THRESHOLD_PERCENT, FloatArray
from profiler_app.core.model import FloatMatrix

# A sample is busy when it reaches half of its row's p95 (and the idle threshold): the
# iteration's busy phase, not noise on an idle stretch.
BUSY_FRACTION_OF_P95 = 0.5
# A non-periodic GPU idle for at least this fraction of its samples runs sporadic bursts; a
# periodic one that idle must pass the recurrence test below.
MIN_BURSTY_IDLE_FRACTION = 0.3
# A periodic GPU with idle stretches is training only if at most this fraction of the windows
# one period long hold no busy sample (room for an evaluation pause).
MAX_IDLE_ITERATION_FRACTION = 0.15


def idle_window_fraction(filled: FloatMatrix, p95: FloatArray, period: FloatArray) -> FloatArray:
    """Per row, the fraction of windows one period long that hold no busy sample.

    A training loop is busy in every iteration, so any window as long as an iteration holds
    some busy samples (a short evaluation pause aside); bursts that happen to be spaced
    alike leave most such windows idle. ``period`` is in samples; rows must have no NaN.
    """
    rows, columns = filled.shape
    if rows == 0 or columns == 0:
        return np.zeros(rows)
    level = np.maximum(IDLE_THRESHOLD_PERCENT, BUSY_FRACTION_OF_P95 * np.nan_to_num(p95))
    busy = filled >= level[:, None]
    running = np.zeros((rows, columns + 1), dtype=np.intp)
    np.cumsum(busy, axis=1, out=running[:, 1:])
    length = np.clip(np.round(np.nan_to_num(period, nan=1.0)), 1, columns).astype(np.intp)
    starts = np.arange(columns)
    ends = np.minimum(starts + length[:, None], columns)
    busy_in_window = np.take_along_axis(running, ends, axis=1) - running[:, :columns]
    complete = starts + length[:, None] <= columns
    idle = ((busy_in_window == 0) & complete).sum(axis=1)
    fraction: FloatArray = idle / np.maximum(complete.sum(axis=1), 1)
    return fraction


def drop_irregular(
    util: FloatMatrix,
    idle_fraction: FloatArray,
    p95: FloatArray,
    period: FloatArray,
    strength: FloatArray,
) -> None:
    """Clears (in place) the period and strength of rows idle at least
    ``MIN_BURSTY_IDLE_FRACTION`` of the time whose activity does not recur in every iteration:
    only such rows could be bursts that happen to line up. ``util`` may have gaps."""
    suspect = np.isfinite(period) & (idle_fraction >= MIN_BURSTY_IDLE_FRACTION)
    if not suspect.any():
        return
    idle_windows = idle_window_fraction(fill_gaps(util[suspect]), p95[suspect], period[suspect])
    dropped = np.flatnonzero(suspect)[idle_windows > MAX_IDLE_ITERATION_FRACTION]
    period[dropped], strength[dropped] = np.nan, 0.0
