"""Finding the iteration period of each row with one FFT-based autocorrelation per matrix."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from profiler_app.analysis.gaps import fill_gaps
from profiler_app.analysis.stats import FloatArray, IntArray
from profiler_app.model import FloatMatrix

MIN_PERIOD_SAMPLES = 4  # shorter "periods" are indistinguishable from noise
MAX_PERIOD_FRACTION = 1 / 3  # at least three iterations must fit in the window
MIN_PEAK = 0.35  # autocorrelation at the period
MIN_PROMINENCE = 0.3  # rise of that peak above the lowest autocorrelation before it
HARMONIC_RATIO = 0.85  # the first peak this close to the highest one is the fundamental
MIN_CONFIRMATION = 0.2  # autocorrelation near twice the period (the next iteration)
CONFIRMATION_TOLERANCE = 0.1  # relative search width around twice the period
ROWS_PER_CHUNK = 1024  # bounds the FFT's working memory


@dataclass(frozen=True)
class Periodicity:
    """Per-row arrays: the period in samples (NaN when not periodic) and the evidence."""

    period: FloatArray
    peak: FloatArray
    confirmation: FloatArray


def _fast_length(minimum: int) -> int:
    """The smallest 2^a 3^b 5^c at least ``minimum``: sizes pocketfft handles fastest."""
    best = 1 << max(0, (minimum - 1).bit_length())
    power5 = 1
    while power5 < best:
        power3 = power5
        while power3 < best:
            size = power3
            while size < minimum:
                size *= 2
            best = min(best, size)
            power3 *= 3
        power5 *= 5
    return best


def detrended(matrix: FloatMatrix) -> FloatMatrix:
    """A gap-filled copy of ``matrix`` with each row's mean and least-squares slope removed,
    so a level or a slow drift does not count as a pattern."""
    work = fill_gaps(matrix)
    if work is matrix:
        work = matrix.copy()
    columns = work.shape[1]
    time = np.arange(columns) - (columns - 1) / 2
    slope = work @ (time / (float(time @ time) or 1.0))  # time is centred: the mean drops out
    trend = slope[:, None] * time
    trend += work.mean(axis=1, keepdims=True)
    work -= trend
    return work


def autocorrelation(matrix: FloatMatrix, max_lag: int) -> FloatMatrix:
    """Normalised autocorrelation of each row for lags 0..max_lag (rows must have no NaN).

    The biased estimate (every lag divided by the full length): a lag covered by fewer pairs
    of samples gets proportionally less weight, so a coincidence between two bursts far apart
    cannot pass for a period. Computed as the inverse FFT of the power spectrum, zero-padded
    to at least ``columns + max_lag`` so lags up to ``max_lag`` do not wrap around. Rows with
    zero variance get 0 everywhere.
    """
    columns = matrix.shape[1]
    size = _fast_length(columns + max_lag)
    spectrum = np.fft.rfft(matrix, size, axis=1)
    power = np.square(spectrum.real)
    power += np.square(spectrum.imag)
    covariance = np.fft.irfft(power, size, axis=1)[:, : max_lag + 1]
    variance = covariance[:, 0]
    scale = np.where(variance > 1e-9 * columns, 1.0 / np.maximum(variance, 1e-300), 0.0)
    normalised: FloatMatrix = covariance * scale[:, None]
    return normalised


def _first_fundamental(acf: FloatMatrix, columns: int) -> tuple[IntArray, FloatArray]:
    """Lag of the fundamental peak per row (0 when none) and its height."""
    rows = acf.shape[0]
    longest = int(columns * MAX_PERIOD_FRACTION)
    if longest < MIN_PERIOD_SAMPLES or acf.shape[1] < longest + 2:
        return np.zeros(rows, dtype=np.intp), np.zeros(rows)
    lags = np.arange(1, longest + 1)
    here = acf[:, 1 : longest + 1]
    is_peak = (here > acf[:, :longest]) & (here >= acf[:, 2 : longest + 2])
    trough = np.minimum.accumulate(acf[:, : longest + 1], axis=1)[:, 1:]
    candidate = (
        is_peak
        & (lags >= MIN_PERIOD_SAMPLES)
        & (here >= MIN_PEAK)
        & (here - trough >= MIN_PROMINENCE)
    )
    heights = np.where(candidate, here, -np.inf)
    best = heights.max(axis=1)
    fundamental = candidate & (here >= HARMONIC_RATIO * best[:, None])
    found = fundamental.any(axis=1)
    lag = np.where(found, lags[np.argmax(fundamental, axis=1)], 0)
    height = np.where(found, np.take_along_axis(acf, lag[:, None], axis=1)[:, 0], 0.0)
    return lag, height


def _refine(acf: FloatMatrix, lag: IntArray) -> FloatArray:
    """Sub-sample peak position by fitting a parabola through the peak and its neighbours."""
    at = np.maximum(lag, 1)
    left = np.take_along_axis(acf, (at - 1)[:, None], axis=1)[:, 0]
    middle = np.take_along_axis(acf, at[:, None], axis=1)[:, 0]
    right = np.take_along_axis(acf, (at + 1)[:, None], axis=1)[:, 0]
    curvature = left - 2 * middle + right
    with np.errstate(divide="ignore", invalid="ignore"):
        shift = np.where(curvature < 0, 0.5 * (left - right) / curvature, 0.0)
    refined: FloatArray = at + np.clip(shift, -0.5, 0.5)
    return refined


def _confirmation(acf: FloatMatrix, period: FloatArray) -> FloatArray:
    """Highest autocorrelation within ``CONFIRMATION_TOLERANCE`` of twice the period."""
    last = acf.shape[1] - 1
    reach = np.maximum(1, np.round(CONFIRMATION_TOLERANCE * 2 * period)).astype(np.intp)
    widest = int(reach.max(initial=1))
    offsets = np.arange(-widest, widest + 1)
    centre = np.round(2 * period).astype(np.intp)
    index = centre[:, None] + offsets
    inside = (np.abs(offsets) <= reach[:, None]) & (index >= 0) & (index <= last)
    values = np.take_along_axis(acf, np.clip(index, 0, last), axis=1)
    highest: FloatArray = np.where(inside, values, -np.inf).max(axis=1)
    return highest


def _chunk_periodicity(chunk: FloatMatrix) -> Periodicity:
    columns = chunk.shape[1]
    longest = int(columns * MAX_PERIOD_FRACTION)
    # Lags needed: the peak search (up to ``longest`` + 1) and the confirmation near 2x.
    max_lag = min(columns - 1, int(2 * (longest + 1) * (1 + CONFIRMATION_TOLERANCE)) + 2)
    acf = autocorrelation(detrended(chunk), max_lag)
    lag, peak = _first_fundamental(acf, columns)
    period = _refine(acf, lag)
    confirmation = np.where(lag > 0, _confirmation(acf, period), -np.inf)
    periodic = (lag > 0) & (confirmation >= MIN_CONFIRMATION)
    return Periodicity(np.where(periodic, period, np.nan), peak, confirmation)


def find_periods(matrix: FloatMatrix) -> Periodicity:
    """The period (in samples) of each row, NaN where there is none.

    Missing samples (NaN) are filled by linear interpolation first, a chunk of rows at a time.

    A row is periodic when its autocorrelation has a clear peak between ``MIN_PERIOD_SAMPLES``
    and a third of the window (high enough, prominent over the dip before it), the earliest
    such peak nearly as high as the best one is taken as the fundamental (not a multiple), and
    the next iteration confirms it with a peak near twice that lag.
    """
    rows, columns = matrix.shape
    if rows == 0 or columns < 3 * MIN_PERIOD_SAMPLES:
        empty = np.full(rows, np.nan)
        return Periodicity(empty, np.zeros(rows), np.zeros(rows))
    parts = [
        _chunk_periodicity(matrix[start : start + ROWS_PER_CHUNK])
        for start in range(0, rows, ROWS_PER_CHUNK)
    ]
    return Periodicity(
        np.concatenate([part.period for part in parts]),
        np.concatenate([part.peak for part in parts]),
        np.concatenate([part.confirmation for part in parts]),
    )
