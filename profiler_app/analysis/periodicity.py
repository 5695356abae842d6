"""Finding the iteration period of each row with one FFT-based autocorrelation per matrix."""

from __future__ import annotations

import numpy as np

from profiler_app.analysis.gaps import fill_gaps
from profiler_app.analysis.stats import BoolArray, FloatArray, IntArray
from profiler_app.core.model import FloatMatrix

MIN_PERIOD_SAMPLES = 4  # shorter "periods" are indistinguishable from noise
MAX_PERIOD_FRACTION = 1 / 3  # at least three iterations must fit in the window
MIN_PEAK = 0.35  # autocorrelation at the period
MIN_PROMINENCE = 0.3  # rise of that peak above the lowest autocorrelation before it
HARMONIC_RATIO = 0.85  # the first peak this close to the highest one is the fundamental
MIN_CONFIRMATION = 0.2  # autocorrelation near twice the period (the next iteration)
CONFIRMATION_TOLERANCE = 0.1  # relative search width around twice the period
# A local peak this high relative to the chosen one, near a half, third, fourth or fifth of its
# lag, may be the true period between two samples: search again on a lag grid this many times
# finer.
FRACTIONAL_PEAK_RATIO = 0.3
FINE_RESOLUTION = 4
# On the finer grid the signal is smoothed first (a [1, 2, 1] / 4 moving average), so the
# two halves of a sampled 12.5-sample iteration, which differ only at their sharp edges, look
# alike; halves that really differ (a forward and a lighter backward pass) still do not.
FINE_HARMONIC_RATIO = 0.8
SAMPLES_PER_CHUNK = 2_000_000  # rows x columns per FFT batch: bounds its working memory
FLAT_ENERGY = 1e-12  # mean squared deviation (percent squared) below which a row is constant


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
    # A constant row leaves only rounding error: make it exactly flat (no autocorrelation).
    work[np.einsum("ij,ij->i", work, work) <= FLAT_ENERGY * columns] = 0.0
    return work


def _power_spectrum(matrix: FloatMatrix, max_lag: int) -> tuple[FloatMatrix, int]:
    """Power spectrum of each row, zero-padded to at least ``columns + max_lag`` so that the
    autocorrelation up to ``max_lag`` does not wrap around; and that padded length."""
    size = _fast_length(matrix.shape[1] + max_lag)
    spectrum = np.fft.rfft(matrix, size, axis=1)
    power: FloatMatrix = np.square(spectrum.real)
    power += np.square(spectrum.imag)
    return power, size


def _autocorrelation(power: FloatMatrix, size: int, max_index: int) -> FloatMatrix:
    """Normalised autocorrelation at indexes 0..max_index of the inverse FFT of ``power``.

    With ``size`` the padded length the indexes are lags in samples; with a multiple of it
    the spectrum is zero-padded further, which interpolates the autocorrelation between
    samples (band-limited) so a period between two whole samples shows its full peak.
    It is the biased estimate (every lag divided by the full length): a lag covered by fewer
    pairs of samples gets proportionally less weight, so a coincidence between two bursts
    far apart cannot pass for a period. Rows with zero variance get 0 everywhere.
    """
    covariance = np.fft.irfft(power, size, axis=1)[:, : max_index + 1]
    variance = covariance[:, 0]
    scale = np.zeros_like(variance)
    np.divide(1.0, variance, out=scale, where=variance > 0)
    normalised: FloatMatrix = covariance * scale[:, None]
    return normalised


def _first_fundamental(
    acf: FloatMatrix, columns: int, resolution: int, harmonic_ratio: float
) -> IntArray:
    """Index of the fundamental peak per row (0 when none).

    ``acf`` is sampled ``resolution`` times per sample of lag.
    """
    rows = acf.shape[0]
    longest = int(columns * MAX_PERIOD_FRACTION * resolution)
    if longest < MIN_PERIOD_SAMPLES * resolution or acf.shape[1] < longest + 2:
        return np.zeros(rows, dtype=np.intp)
    lags = np.arange(1, longest + 1)
    here = acf[:, 1 : longest + 1]
    is_peak = (here > acf[:, :longest]) & (here >= acf[:, 2 : longest + 2])
    trough = np.minimum.accumulate(acf[:, : longest + 1], axis=1)[:, 1:]
    candidate = (
        is_peak
        & (lags >= MIN_PERIOD_SAMPLES * resolution)
        & (here >= MIN_PEAK)
        & (here - trough >= MIN_PROMINENCE)
    )
    heights = np.where(candidate, here, -np.inf)
    best = heights.max(axis=1)
    fundamental = candidate & (here >= harmonic_ratio * best[:, None])
    found = fundamental.any(axis=1)
    lag: IntArray = np.where(found, lags[np.argmax(fundamental, axis=1)], 0)
    return lag


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


def _search(
    acf: FloatMatrix, columns: int, resolution: int = 1, harmonic_ratio: float = HARMONIC_RATIO
) -> tuple[FloatArray, FloatArray]:
    """Periods (in samples, NaN for none) found in autocorrelations sampled ``resolution``
    times per lag, and the autocorrelation at each (0 where there is none): how clearly the
    row repeats."""
    lag = _first_fundamental(acf, columns, resolution, harmonic_ratio)
    position = _refine(acf, lag)
    confirmation = np.where(lag > 0, _confirmation(acf, position), -np.inf)
    periodic = (lag > 0) & (confirmation >= MIN_CONFIRMATION)
    period: FloatArray = np.where(periodic, position / resolution, np.nan)
    height = np.take_along_axis(acf, lag[:, None], axis=1)[:, 0]
    strength: FloatArray = np.where(periodic, np.clip(height, 0.0, 1.0), 0.0)
    return period, strength


def _fractional_harmonic(acf: FloatMatrix, period: FloatArray) -> BoolArray:
    """Rows with a local autocorrelation peak near a half or a third of their period.

    When the true period falls between two samples (12.5), the samples at lags 12 and 13
    straddle its peak and read lower than at 25, where the sampled pattern repeats exactly:
    the search can then pick the double. Such rows are searched again on a finer lag grid.
    """
    last = acf.shape[1] - 1
    whole = np.nan_to_num(period, nan=0.0)
    best = np.take_along_axis(acf, np.clip(np.round(whole), 0, last).astype(np.intp)[:, None], 1)
    suspect = np.zeros(period.shape, dtype=bool)
    for divisor in (2, 3, 4, 5):
        near = np.floor(whole / divisor).astype(np.intp)[:, None] + np.arange(0, 2)
        at = np.clip(near, 1, last - 1)
        here = np.take_along_axis(acf, at, axis=1)
        peak = (here > np.take_along_axis(acf, at - 1, axis=1)) & (
            here >= np.take_along_axis(acf, at + 1, axis=1)
        )
        strong = here >= FRACTIONAL_PEAK_RATIO * best
        usable = near >= MIN_PERIOD_SAMPLES - 1
        suspect |= (peak & strong & usable).any(axis=1)
    return suspect & np.isfinite(period)


def _chunk_periods(chunk: FloatMatrix) -> tuple[FloatArray, FloatArray]:
    columns = chunk.shape[1]
    longest = int(columns * MAX_PERIOD_FRACTION)
    # Lags needed: the peak search (up to ``longest`` + 1) and the confirmation near 2x.
    max_lag = min(columns - 1, int(2 * (longest + 1) * (1 + CONFIRMATION_TOLERANCE)) + 2)
    power, size = _power_spectrum(detrended(chunk), max_lag)
    acf = _autocorrelation(power, size, max_lag)
    found, strength = _search(acf, columns)
    again = _fractional_harmonic(acf, found)
    if not again.any():
        return found, strength
    smoothing = np.cos(np.pi * np.arange(power.shape[1]) / size) ** 4
    fine_acf = _autocorrelation(
        power[again] * smoothing, FINE_RESOLUTION * size, FINE_RESOLUTION * max_lag
    )
    fine, fine_strength = _search(fine_acf, columns, FINE_RESOLUTION, FINE_HARMONIC_RATIO)
    kept = np.isfinite(fine)
    rows = np.flatnonzero(again)[kept]
    found[rows] = fine[kept]
    strength[rows] = fine_strength[kept]
    return found, strength


def find_periods(matrix: FloatMatrix) -> tuple[FloatArray, FloatArray]:
    """The period (in samples) of each row, NaN where there is none, and its strength: the
    autocorrelation at that period (0 to 1; 0 where there is none).

    Missing samples (NaN) are filled by linear interpolation first, a chunk of rows at a time.

    A row is periodic when its autocorrelation has a clear peak between ``MIN_PERIOD_SAMPLES``
    and a third of the window (high enough, prominent over the dip before it), the earliest
    such peak nearly as high as the best one is taken as the fundamental (not a multiple), and
    the next iteration confirms it with a peak near twice that lag. Rows whose period may lie
    between two whole samples are searched again on a finer lag grid.
    """
    rows, columns = matrix.shape
    if rows == 0 or columns < 3 * MIN_PERIOD_SAMPLES:
        return np.full(rows, np.nan), np.zeros(rows)
    rows_per_chunk = max(1, SAMPLES_PER_CHUNK // columns)
    chunks = [
        _chunk_periods(matrix[start : start + rows_per_chunk])
        for start in range(0, rows, rows_per_chunk)
    ]
    return (
        np.concatenate([period for period, _ in chunks]),
        np.concatenate([strength for _, strength in chunks]),
    )


def autocorrelation_near(matrix: FloatMatrix, lags: FloatArray, tolerance: float) -> FloatArray:
    """The highest autocorrelation of each row (gaps filled, detrended, normalised as above)
    within ``tolerance`` (a share) of its lag in ``lags`` (samples); -inf where that range
    holds no lag of the row."""
    rows, columns = matrix.shape
    if rows == 0 or columns < 2:
        return np.full(rows, -np.inf)
    low = np.floor(lags * (1 - tolerance))
    high = np.ceil(lags * (1 + tolerance))
    max_lag = int(min(columns - 1, max(1.0, float(high.max()))))
    power, size = _power_spectrum(detrended(matrix), max_lag)
    acf = _autocorrelation(power, size, max_lag)
    offsets = np.arange(max_lag + 1)
    inside = (offsets >= np.maximum(low, 1)[:, None]) & (offsets <= high[:, None])
    highest: FloatArray = np.where(inside, acf, -np.inf).max(axis=1)
    return highest
