"""The time grid every field of one read shares, and how fine it may be.

``end`` is the current time rounded down to a multiple of the step, and the grid holds
``window / step + 1`` points before it. Prometheus refuses more than 11,000 points per series in
one request: the default step never gets there (it coarsens with the window), and a finer
explicit step is read in consecutive chunks of the same grid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from profiler_app.core.durations import format_duration
from profiler_app.core.errors import UserError
from profiler_app.sources.prometheus.defaults import DEFAULT_MAX_POINTS, DEFAULT_STEP_SECONDS

FloatArray = npt.NDArray[np.float64]

MAX_POINTS_PER_REQUEST = 11_000  # Prometheus' per-series limit for query_range
MAX_POINTS_PER_READ = 10 * MAX_POINTS_PER_REQUEST  # beyond this a finer step is a mistake


def default_step(window_seconds: float) -> float:
    """10 s, or coarser (whole seconds) so the window holds at most ``DEFAULT_MAX_POINTS``."""
    return max(DEFAULT_STEP_SECONDS, float(math.ceil(window_seconds / DEFAULT_MAX_POINTS)))


@dataclass(frozen=True)
class TimeGrid:
    """Evenly spaced evaluation times ``start + k * step`` for ``k`` in ``range(points)``."""

    start: float
    step: float
    points: int

    @property
    def end(self) -> float:
        return self.start + (self.points - 1) * self.step

    def timestamps(self) -> FloatArray:
        return self.start + self.step * np.arange(self.points, dtype=np.float64)

    def chunks(self, max_points: int) -> list[TimeGrid]:
        """Consecutive sub-grids of at most ``max_points`` points covering this grid."""
        return [
            TimeGrid(
                self.start + first * self.step, self.step, min(max_points, self.points - first)
            )
            for first in range(0, self.points, max_points)
        ]


def grid_ending_at(end: float, window_seconds: float, step_seconds: float) -> TimeGrid:
    """The grid of a ``window_seconds`` window ending at ``end`` (rounded down to the step)."""
    if not window_seconds > 0 or not step_seconds > 0:
        raise UserError("window and step must be positive durations")
    if step_seconds > window_seconds:
        raise UserError(
            f"step {format_duration(step_seconds)} is longer than the window "
            f"{format_duration(window_seconds)}"
        )
    aligned_end = math.floor(end / step_seconds) * step_seconds
    points = int(window_seconds // step_seconds) + 1
    if points > MAX_POINTS_PER_READ:
        raise UserError(
            f"a {format_duration(window_seconds)} window at a {format_duration(step_seconds)} "
            f"step is {points:,} points per GPU; use a coarser step (at most "
            f"{MAX_POINTS_PER_READ:,} points)"
        )
    return TimeGrid(aligned_end - (points - 1) * step_seconds, step_seconds, points)
