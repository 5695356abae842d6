"""The iteration period of a traced job: from NVTX ranges, else from the kernel sequence.

NVTX: among range names seen at least ``MIN_ITERATIONS`` times, those covering at least half
as much of the span (per thread) as the best-covering name are candidates, and the one with
the most ranges per thread wins: it tells a ``train_step`` apart from the ``epoch`` around it
(few ranges) and from the per-operator ranges inside it (little coverage). The period is the
median start-to-start spacing of its ranges on each thread.

Kernel sequence: kernel time per bin over the GPU's span is a utilisation-like signal, and the
continuous profiler's period detection (``profiler_app.analysis.periodicity``) finds its period;
``COARSE_BINS`` first (one bin holds many kernels, so per-layer structure averages out), then
``FINE_BINS`` for iterations too short for the coarse grid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from profiler_app.analysis.periodicity import find_periods
from profiler_app.analysis.stats import FloatArray
from profiler_app.errors import UserError
from profiler_app.trace import queries
from profiler_app.trace.export import Export

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
    names = queries.nvtx_names(export, MIN_ITERATIONS)
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
    spacings = queries.nvtx_spacings(export, name)
    if not spacings:
        return None
    return Iteration(float(np.median(spacings)) / 1e9, "nvtx", name, count // threads)


def from_kernels(bins: dict[int, np.ndarray], width_ns: int) -> dict[int, Iteration]:
    """Per device, the period found in its kernel-time signal (``bins``: ns per fine bin)."""
    found: dict[int, Iteration] = {}
    for factor in (FINE_BINS // COARSE_BINS, 1):
        pending = [device for device in bins if device not in found]
        for device in pending:
            signal = _downsample(bins[device], factor)
            width = width_ns * factor
            percent = signal * (100.0 / width)
            period = find_periods(percent[None, :])[0]
            if math.isfinite(period):
                seconds = period * width / 1e9
                span = bins[device].size * width_ns / 1e9
                found[device] = Iteration(seconds, "kernels", None, int(span / seconds))
    return found


def _downsample(signal: FloatArray, factor: int) -> FloatArray:
    """Sums of ``factor`` consecutive bins (a trailing partial bin is dropped)."""
    whole = signal.size // factor * factor
    if factor == 1 or whole == 0:
        return signal
    coarse: FloatArray = signal[:whole].reshape(-1, factor).sum(axis=1)
    return coarse
