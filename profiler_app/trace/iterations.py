"""The iteration period of a traced job: from NVTX ranges, else from the kernel sequence.

NVTX: among range names seen at least ``MIN_ITERATIONS`` times (not those of communication
libraries' domains, such as the MPI calls Nsight Systems traces as NVTX ranges), those
covering at least half as much of the span (per thread) as the best-covering name are
candidates, and the one with the most ranges per thread wins: it tells a ``train_step`` apart
from the ``epoch`` around it (few ranges) and from the per-operator ranges inside it (little
coverage). The period is the median start-to-start spacing of its ranges on each thread.

Kernel sequence: the GPU's busy fraction per time bin (from the idle gaps of the union of its
kernels, copies and memsets: the utilisation the continuous profiler classifies) goes through
that profiler's period detection (``profiler_app.analysis.periodicity``); ``COARSE_BINS`` over
the GPU's span first (a bin holds many kernels, so per-layer structure averages out), then
``FINE_BINS`` for iterations too short for the coarse grid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from profiler_app.analysis.periodicity import find_periods
from profiler_app.analysis.stats import FloatArray
from profiler_app.core.errors import UserError
from profiler_app.trace import queries
from profiler_app.trace.export import Export
from profiler_app.trace.grouping import IntArray
from profiler_app.trace.timeline import Gaps

MIN_ITERATIONS = 3
MIN_COVERAGE_OF_BEST = 0.5
FINE_BINS = 1 << 16
COARSE_BINS = 1 << 12


@dataclass(frozen=True)
class Iteration:
    seconds: float
    source: str  # "nvtx" or "kernels"
    range_name: str | None = None
    count: int | None = None  # iterations per thread seen (NVTX), or span / period


def from_nvtx(export: Export, span_ns: int, range_name: str | None = None) -> Iteration | None:
    """The NVTX iteration; ``range_name`` picks the range instead of the rule above."""
    # a range asked for by name may be any; the automatic choice skips library calls' ranges
    user_only = range_name is None
    names = queries.nvtx_names(export, MIN_ITERATIONS, user_only=user_only)
    if range_name is not None:
        chosen = [entry for entry in names if entry[0] == range_name]
        if not chosen:
            seen = ", ".join(sorted(name for name, *_ in names)[:10]) or "none"
            raise UserError(
                f"no NVTX range {range_name!r} seen {MIN_ITERATIONS} times or more in "
                f"{export.path} (ranges seen that often: {seen})"
            )
        name, count, _, threads = chosen[0]
    else:
        if not names or span_ns <= 0:
            return None
        coverage = {name: total / threads / span_ns for name, _, total, threads in names}
        best = max(coverage.values())
        eligible = [entry for entry in names if coverage[entry[0]] >= MIN_COVERAGE_OF_BEST * best]
        name, count, _, threads = max(
            eligible, key=lambda entry: (entry[1] / entry[3], coverage[entry[0]], entry[0])
        )
    spacings = queries.nvtx_spacings(export, name, user_only=user_only)
    if not spacings:
        return None
    return Iteration(float(np.median(spacings)) / 1e9, "nvtx", name, count // threads)


def from_activity(gaps: Gaps, first: int, span_ns: int) -> Iteration | None:
    """The period in the busy signal of a GPU with idle ``gaps`` over its span (``first``: ns
    after the origin)."""
    width = span_ns // FINE_BINS
    if width < 1:
        return None
    fine = busy_signal(gaps.idle_by_bin(first, width, FINE_BINS), width)
    for factor in (FINE_BINS // COARSE_BINS, 1):
        coarse = fine.reshape(-1, factor).sum(axis=1)
        percent = coarse * (100.0 / (width * factor))
        periods, _ = find_periods(percent[None, :])  # and each period's strength
        period = float(periods[0])
        if math.isfinite(period):
            seconds = period * width * factor / 1e9
            return Iteration(seconds, "kernels", None, int(span_ns / 1e9 / seconds))
    return None


def busy_signal(idle_ns: IntArray, width_ns: int) -> FloatArray:
    """Busy nanoseconds per bin of ``width_ns``, from ``Gaps.idle_by_bin``."""
    busy: FloatArray = (width_ns - idle_ns).astype(np.float64)
    return busy
