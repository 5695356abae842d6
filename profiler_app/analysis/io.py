"""A pod's disk and network rates: their peaks, and whether a training GPU's stalls follow its
input (disk reads, network receives) more often than chance would have them.

Pure functions on numpy arrays. The input-bound hint is a correlation, not a measurement of
what the training loop waits on: it says that the GPU's stalls and the pod's read bursts line
up, and how much better than the same series shifted against each other (docs/analysis.md,
"Input-bound hint").
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from profiler_app.analysis.iteration import UTIL_PAUSE_SHARE
from profiler_app.core.model import (
    DISK_READ,
    IO_FIELDS,
    NETWORK_FIELDS,
    NETWORK_RECEIVE,
    IoRates,
    PodIoSeries,
    RateStats,
)

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

# The input a stall can wait on. Writes and transmits are left out on purpose: a checkpoint
# stalls the GPU while it writes, and that is not the input pipeline.
INPUT_DIRECTIONS = ((DISK_READ, "disk reads"), (NETWORK_RECEIVE, "network receives"))
# Fewer aligned samples than this cannot tell a rhythm from chance.
MIN_SAMPLES = 12
# A stall: utilisation at most this share of the GPU's 95th percentile (as iteration pauses).
STALL_SHARE = UTIL_PAUSE_SHARE
# A GPU whose 95th percentile is below this never computes enough to stall meaningfully.
MIN_BUSY_PERCENT = 20.0
# Stalls must be a part of the window, not most of it (then the GPU is idle, not input-bound).
MAX_STALL_FRACTION = 0.8
# A burst: the rate at least this share of the way from its median to its peak, the peak at
# least MIN_BURST_BYTES per second and BURST_CONTRAST times the median. Steady streaming has
# no bursts: nothing to line up.
BURST_SHARE = 0.5
MIN_BURST_BYTES = 2.0**20
BURST_CONTRAST = 2.0
# "Follow": the burst in the same sample as the stall or the sample before.
LAG_SAMPLES = 1
# The hint needs at least this share of stall samples beside a burst, this much more than the
# mean share over every shift of the bursts against the stalls, and this many stall episodes.
MIN_COINCIDENCE = 0.6
MIN_LIFT = 0.3
MIN_EPISODES = 3


def io_rates(series: PodIoSeries) -> IoRates | None:
    """Peak and 95th percentile of each measured direction; None when none has a reading."""
    stats = {}
    for direction in IO_FIELDS:
        rates = series.rates.get(direction)
        if rates is None:
            continue
        finite = np.asarray(rates, dtype=np.float64)
        finite = finite[np.isfinite(finite)]
        if finite.size:
            stats[direction] = RateStats(
                max=float(finite.max()), p95=float(np.percentile(finite, 95))
            )
    if not stats and series.network_attributable:
        return None
    return IoRates(stats, network_attributable=series.network_attributable)


def on_grid(times: FloatArray, values: FloatArray, grid: FloatArray) -> FloatArray:
    """``values`` (at ``times``) on ``grid``: each grid sample gets the largest reading of the
    interval it closes, ``(grid[j-1], grid[j]]`` (a burst between two coarse GPU samples is not
    lost); a grid sample without one keeps the latest reading up to two of its spacing earlier
    (a coarser input series); NaN otherwise."""
    grid = np.asarray(grid, dtype=np.float64)
    result = np.full(grid.size, np.nan)
    readable = np.isfinite(times) & np.isfinite(values)
    order = np.argsort(np.asarray(times, dtype=np.float64)[readable], kind="stable")
    times = np.asarray(times, dtype=np.float64)[readable][order]
    values = np.asarray(values, dtype=np.float64)[readable][order]
    if grid.size == 0 or times.size == 0:
        return result
    spacing = float(np.median(np.diff(grid))) if grid.size > 1 else 1.0
    inside = (times > grid[0] - spacing) & (times <= grid[-1])
    np.fmax.at(result, np.searchsorted(grid, times[inside], side="left"), values[inside])
    latest = np.searchsorted(times, grid, side="right") - 1
    fresh = (latest >= 0) & (grid - times[np.maximum(latest, 0)] <= 2 * spacing)
    fill = np.isnan(result) & fresh
    result[fill] = values[latest[fill]]
    return result


def _runs(flags: BoolArray) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Starts and (exclusive) ends of the runs of True in ``flags``."""
    edges = np.diff(np.concatenate(([0], flags.astype(np.int8), [0])))
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)


def _bursts(rates: FloatArray, valid: BoolArray) -> BoolArray:
    values = rates[valid]
    median = float(np.median(values))
    peak = float(values.max())
    if peak < MIN_BURST_BYTES or peak < BURST_CONTRAST * median:
        return np.zeros(rates.size, dtype=bool)
    return valid & (np.nan_to_num(rates) >= median + BURST_SHARE * (peak - median))


def _shifted_shares(onsets: BoolArray, near: BoolArray) -> FloatArray:
    """For every circular shift ``k`` of ``near`` against ``onsets``, the share of stall onsets
    beside a shifted burst (FFT cross-correlation: no loop over shifts)."""
    size = onsets.size
    counts = np.fft.irfft(
        np.fft.rfft(onsets.astype(np.float64)) * np.conj(np.fft.rfft(near.astype(np.float64))),
        size,
    )
    # counts[k] = sum_s onsets[s] * near[s - k]
    return np.rint(counts) / max(int(onsets.sum()), 1)


def coincidence(util: FloatArray, rates: FloatArray) -> tuple[float, float, int] | None:
    """(share of stall onsets beside an input burst, the mean share with the bursts shifted
    against the stalls, how many onsets are beside a burst) for one GPU row and one input
    series on the same grid; None when the two cannot be compared (too few samples, no
    stalls, no bursts). A stall's onset is beside a burst when the burst holds that sample or
    one of the ``LAG_SAMPLES`` before it."""
    util = np.asarray(util, dtype=np.float64)
    rates = np.asarray(rates, dtype=np.float64)
    valid = np.isfinite(util) & np.isfinite(rates)
    if int(valid.sum()) < MIN_SAMPLES:
        return None
    busy = float(np.percentile(util[valid], 95))
    if busy < MIN_BUSY_PERCENT:
        return None
    stalls = valid & (np.nan_to_num(util) <= STALL_SHARE * busy)
    if not stalls.any() or stalls.sum() > MAX_STALL_FRACTION * valid.sum():
        return None
    bursts = _bursts(rates, valid)
    if not bursts.any():
        return None
    near = bursts.copy()
    for lag in range(1, LAG_SAMPLES + 1):  # a burst counts for the samples that follow it
        near[lag:] |= bursts[:-lag]
    onsets = np.zeros(stalls.size, dtype=bool)
    onsets[_runs(stalls)[0]] = True
    beside = int((onsets & near).sum())
    observed = beside / int(onsets.sum())
    # Shifts within a burst's length still overlap it: only farther ones say what chance
    # alignment looks like.
    burst_starts, burst_ends = _runs(near)
    guard = int((burst_ends - burst_starts).max())
    shifts = np.arange(stalls.size)
    far = np.minimum(shifts, stalls.size - shifts) > guard
    if not far.any():
        return None
    chance = float(_shifted_shares(onsets, near)[far].mean())
    return observed, chance, beside


def input_bound_reason(util: FloatArray, grid: FloatArray, io: PodIoSeries) -> str | None:
    """The reason "stalls follow disk reads: likely input-bound" (or network receives) when a
    training GPU's stalls (utilisation samples ``util`` at ``grid``) line up with the pod's
    input bursts well beyond chance; None otherwise."""
    for direction, words in INPUT_DIRECTIONS:
        if direction in NETWORK_FIELDS and not io.network_attributable:
            continue
        rates = io.rates.get(direction)
        if rates is None:
            continue
        found = coincidence(util, on_grid(io.timestamps, rates, grid))
        if found is None:
            continue
        observed, chance, episodes = found
        lifted = observed - chance >= MIN_LIFT
        if observed >= MIN_COINCIDENCE and lifted and episodes >= MIN_EPISODES:
            return (
                f"stalls follow {words}: likely input-bound "
                f"({observed:.0%} of stalls, {chance:.0%} shifted)"
            )
    return None
