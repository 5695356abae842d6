"""The Alnair profiler's "cyclic pattern" rule, re-implemented for comparison only.

The rule, per series (one GPU's utilisation over the window):

- if the maximum is not above 0, the GPU is idle (nothing else is idle);
- otherwise take the autocorrelation at every lag from 0 up to half the window (pandas'
  ``Series.autocorr``: the Pearson correlation of the series with itself shifted by the lag);
- treat those autocorrelations as normally distributed and take the 97.5 % quantile of a
  normal with their mean and standard deviation as the critical value (a two-sided 95 % test);
- lags whose autocorrelation exceeds it are significant; more than two significant lags
  mean a cyclic (training) workload, whose period is the median spacing between them;
- anything else is sustained (inference) work. The rule has no notion of bursts.

``alnair_autocorrelations`` computes what ``Series.autocorr`` does for every lag, with numpy
(tests check they agree); bench_analysis.py times pandas itself, one call per lag as the
reference does, as the speed baseline.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Signal = npt.NDArray[np.float64]

# The 97.5 % quantile of the standard normal: norm.ppf(1 - 0.05 / 2).
NORMAL_975 = 1.959963984540054


def _cross_sums(first: Signal, second: Signal, lags: int) -> Signal:
    """``sum_i first[i] * second[i + lag]`` for lag 0 .. lags - 1, by FFT."""
    size = 2 * first.size
    product = np.conj(np.fft.rfft(first, size)) * np.fft.rfft(second, size)
    sums: Signal = np.fft.irfft(product, size)[:lags]
    return sums


def alnair_autocorrelations(values: Signal) -> Signal:
    """``Series.autocorr(lag)`` for every lag 0 .. n/2 - 1: the Pearson correlation of
    ``values[:-lag]`` with ``values[lag:]`` over the pairs where both are present.

    Each sum the correlation needs (pair count, sums and sums of squares of both sides,
    cross products) is a cross-correlation of the values or of their presence mask, so all
    lags come from a few FFTs and the comparison on the corpus takes well under a second.
    """
    lags = values.size // 2
    present = np.isfinite(values).astype(np.float64)
    x = np.where(present > 0, values, 0.0)
    pairs = np.round(_cross_sums(present, present, lags))
    sum_earlier, sum_later = _cross_sums(x, present, lags), _cross_sums(present, x, lags)
    with np.errstate(divide="ignore", invalid="ignore"):
        covariance = _cross_sums(x, x, lags) - sum_earlier * sum_later / pairs
        spread_earlier = _cross_sums(x * x, present, lags) - sum_earlier**2 / pairs
        spread_later = _cross_sums(present, x * x, lags) - sum_later**2 / pairs
        # FFT round-off leaves ~1e-9 where a constant stretch has exactly zero spread.
        floor = 1e-9 * max(1.0, float(np.max(x * x, initial=0.0))) * values.size
        defined = (pairs >= 2) & (spread_earlier > floor) & (spread_later > floor)
        correlations: Signal = np.where(
            defined, covariance / np.sqrt(spread_earlier * spread_later), np.nan
        )
    return correlations


def alnair_classify(values: Signal, step_seconds: float) -> tuple[str, float | None]:
    """(job type, period in seconds or None) under the reference rule."""
    if not np.nanmax(values, initial=0.0) > 0:
        return "idle", None
    correlations = alnair_autocorrelations(values)
    if correlations.size == 0:
        return "inference", None
    # np.mean/np.std propagate NaN (a constant series), which then makes no lag significant.
    critical = correlations.mean() + NORMAL_975 * correlations.std()
    significant = np.flatnonzero(correlations > critical)
    if significant.size > 2:
        return "training", float(np.median(np.diff(significant))) * step_seconds
    return "inference", None
