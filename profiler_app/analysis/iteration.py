"""Is a loop a training loop? A loop is evidence, not proof.

Offline inference repeats too: ``generate()`` called over and over climbs in a sawtooth whose
period follows the sequence, a server answers a steady stream of requests at a steady cadence,
and a model split layer by layer over several GPUs stalls and resumes on all of them together.
Three checks tell an iteration loop from such a cadence, each a pure function of the rows that
show a loop (``review`` runs them and adds what the workload says):

- **pauses** (``pause_share``): at one sample a second or coarser, an iteration loop is visible
  because the GPU stops between its steps (input, synchronisation, a checkpoint, evaluation): in
  most stretches one period long, utilisation falls to at most ``UTIL_PAUSE_SHARE`` of the
  stretch's peak, or power to at most ``POWER_PAUSE_SHARE`` of its peak above the idle floor. A
  loop that only modulates a busy level (a sequence that grows, requests of varying size) never
  pauses.
- **a stable period** (``half_periods``): an iteration takes the same time in both halves of the
  window; a period that drifts (generation over longer and longer sequences: another period in
  each half) is not an iteration period.
- **a job that computes** (``never_computes``): data-parallel ranks compute flat out between
  their synchronisations. GPUs of one job (a pod, or coupled stalls) none of which ever reaches
  ``COMPUTE_UTIL`` (nor half its power range) take turns: a model split layer by layer, whose
  stalls coincide like ranks'.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from profiler_app.analysis.context import Context
from profiler_app.analysis.evidence import second_signal
from profiler_app.analysis.gaps import fill_gaps
from profiler_app.analysis.periodicity import MIN_PEAK, autocorrelation_near, find_periods
from profiler_app.analysis.power import power_fraction
from profiler_app.analysis.stats import BoolArray, FloatArray, IntArray, Summary, summarise
from profiler_app.core.arrays import distinct
from profiler_app.core.model import FloatMatrix

# A stretch one period long pauses when utilisation falls to at most this share of the
# stretch's own peak (a local peak: a level that drifts over the window does not matter) ...
UTIL_PAUSE_SHARE = 0.5
# ... or power to at most this share of its peak above the idle floor: a GPU with nothing to do
# still draws a good part of its busy power for a second or two (a Titan X falls from 170 W to
# 90 W between its steps, an H100 from 560 W to 150 W during a checkpoint).
POWER_PAUSE_SHARE = 0.6
# An iteration loop pauses in at least this share of its period-long stretches (room for
# jitter: a stretch can straddle two shortened pauses).
MIN_PAUSING_SHARE = 0.5
# Each half of the window must show its own period within this share of the whole window's
# (or of its double or half: a half may pick the other harmonic), ...
HALF_TOLERANCE = 0.2
# ... where a half holds at least this many iterations (the whole window needs three).
MIN_HALF_ITERATIONS = 4
# Samples per iteration enough to confirm a period within the tolerance: longer loops are
# averaged down to about this many before the halves are searched.
SAMPLES_PER_ITERATION = 8
# A job of several busy GPUs whose busiest GPU's utilisation stays below this at its
# PEAK_PERCENTILE (a short busy phase in every iteration is a small share of the samples) ...
COMPUTE_UTIL = 50.0
PEAK_PERCENTILE = 99.0
# ... and its power below this share of its range at the 95th percentile (where known) never
# computes flat out: data-parallel ranks keep the GPU saturated while they compute.
COMPUTE_POWER = 0.5


def pause_share(
    util: FloatMatrix,
    rows: IntArray,
    period: FloatArray,
    second: FloatMatrix | None = None,
    *,
    floor: FloatArray | None = None,
    share: FloatArray | None = None,
) -> FloatArray:
    """For each of ``rows`` (of ``util``, and of ``second`` where given: whole matrices, read in
    place), the share of its consecutive stretches one period long (``period`` in samples, one
    per entry of ``rows``) that hold a pause: utilisation at most ``UTIL_PAUSE_SHARE`` of the
    stretch's peak, or ``second`` (power) at most ``share`` (per row; default
    ``POWER_PAUSE_SHARE``) of its peak above ``floor`` (per row; default 0).

    Missing samples (NaN) are skipped. The last stretch of a row also takes the samples left
    over. Rows whose stretches do not fit twice in the window get 1: nothing to judge.
    """
    columns = util.shape[1]
    result = np.ones(rows.size)
    if rows.size == 0 or columns == 0:
        return result
    length = np.clip(np.round(np.nan_to_num(period, nan=columns)), 1, columns).astype(np.intp)
    stretches = columns // length
    judged = np.flatnonzero(stretches >= 2)
    if judged.size == 0:
        return result
    counts = stretches[judged]
    owner = np.repeat(np.arange(judged.size), counts)
    index = np.arange(owner.size) - np.repeat(np.cumsum(counts) - counts, counts)
    starts = rows[judged][owner] * columns + index * length[judged][owner]
    # Each judged row's end is a boundary too, so its last stretch stops there.
    ends = (rows[judged] + 1) * columns
    boundaries = distinct(np.concatenate((starts, ends[ends < util.size])))
    at = np.searchsorted(boundaries, starts)

    def extremes(matrix: FloatMatrix) -> tuple[FloatMatrix, FloatMatrix]:
        flat = matrix.reshape(-1)
        with np.errstate(invalid="ignore"):
            return np.fmin.reduceat(flat, boundaries)[at], np.fmax.reduceat(flat, boundaries)[at]

    low, high = extremes(util)
    with np.errstate(invalid="ignore"):
        pausing = low <= UTIL_PAUSE_SHARE * high
    if second is not None:
        base = np.zeros(judged.size) if floor is None else np.nan_to_num(floor[judged])
        limit = np.full(judged.size, POWER_PAUSE_SHARE) if share is None else share[judged]
        second_low, second_high = extremes(second)
        with np.errstate(invalid="ignore"):
            second_low -= base[owner]
            second_high -= base[owner]
            pausing |= (second_high > 0) & (second_low <= limit[owner] * second_high)
    result[judged] = np.bincount(owner, weights=pausing, minlength=judged.size) / counts
    return result


@dataclass(frozen=True)
class Halves:
    """The period found in each half of the window, per row (samples; NaN where none or not
    checked), which rows were checked (each half holds ``MIN_HALF_ITERATIONS``), and whether
    each half still repeats at the window's period where its own search found none."""

    first: FloatArray
    second: FloatArray
    checked: BoolArray
    first_repeats: BoolArray
    second_repeats: BoolArray

    def agrees(self, period: FloatArray) -> BoolArray:
        """Rows whose halves both show ``period`` (or its double or half), or, where a half's
        own search found no period, still repeat at it (a restart or a long checkpoint can
        blur a half's peak without removing the loop); unchecked rows agree too."""
        both = np.ones(period.shape, dtype=bool)
        for half, repeats in ((self.first, self.first_repeats), (self.second, self.second_repeats)):
            close = ~np.isfinite(half) & repeats
            with np.errstate(invalid="ignore"):
                for multiple in (0.5, 1.0, 2.0):
                    target = multiple * period
                    close |= np.abs(half - target) <= HALF_TOLERANCE * target
            both &= close
        agreed: BoolArray = both | ~self.checked
        return agreed


def half_periods(signal: FloatMatrix, period: FloatArray) -> Halves:
    """The period of each half of every row of ``signal`` (no gaps) whose halves hold
    ``MIN_HALF_ITERATIONS`` of ``period`` (samples).

    A half only has to confirm the period within ``HALF_TOLERANCE``, which eight samples per
    iteration do as well as any more: rows with long periods are averaged over blocks of a power
    of two samples first (at most ``period`` / ``SAMPLES_PER_ITERATION``), one batched search
    per block size.
    """
    rows, columns = signal.shape
    half = columns // 2
    first, second = np.full(rows, np.nan), np.full(rows, np.nan)
    repeats = np.zeros((2, rows), dtype=bool)
    with np.errstate(invalid="ignore"):
        checked: BoolArray = MIN_HALF_ITERATIONS * period <= half
        exponent = np.floor(np.log2(np.maximum(period / SAMPLES_PER_ITERATION, 1.0)))
    block = np.where(checked, 2 ** np.nan_to_num(exponent), 0).astype(np.intp)
    for size in distinct(block[checked]).tolist():
        picked = np.flatnonzero(checked & (block == size))
        length = half // size * size
        averaged = np.vstack(
            [
                part.reshape(picked.size, length // size, size).mean(axis=2)
                for part in (signal[picked, :length], signal[picked, half : half + length])
            ]
        )
        found, _ = find_periods(averaged)
        first[picked], second[picked] = found[: picked.size] * size, found[picked.size :] * size
        # A half whose own search found nothing: does it still repeat at the window's period?
        blank = np.flatnonzero(~np.isfinite(found))
        if blank.size:
            lags = np.tile(period[picked] / size, 2)[blank]
            near = autocorrelation_near(averaged[blank], lags, HALF_TOLERANCE)
            which, row = np.divmod(blank, picked.size)
            repeats[which, picked[row]] = near >= MIN_PEAK
    return Halves(first, second, checked, repeats[0], repeats[1])


def never_computes(
    groups: IntArray, busy: BoolArray, util_peak: FloatArray, power_p95: FloatArray
) -> tuple[BoolArray, FloatArray, BoolArray]:
    """Busy rows of jobs (``groups``, -1 for none) of several busy GPUs none of which computes
    flat out: the peak utilisation of the job's busiest GPU (``util_peak``, a high percentile)
    stays below ``COMPUTE_UTIL`` and its power's 95th percentile (a share of its range,
    ``power_p95``; NaN where unknown) below ``COMPUTE_POWER``. Also each busy row's peak (its
    job's where it shares one) and which rows share a job.

    A lone GPU is never judged so: a burst shorter than a sample reads half its level in each
    of the two samples it straddles, so one GPU's level cannot tell a short step from no step;
    several GPUs that stall together and all stay low take turns."""
    peak = np.where(busy, util_peak, np.nan)
    power = np.where(busy, power_p95, np.nan)
    members = busy & (groups >= 0)
    shared = np.zeros(groups.shape[0], dtype=bool)
    if members.any():
        ids, position = np.unique(groups[members], return_inverse=True)
        count = np.bincount(position, minlength=ids.size)
        highest = np.full(ids.size, -np.inf)
        np.maximum.at(highest, position, np.nan_to_num(util_peak[members], nan=np.inf))
        powered = np.full(ids.size, -np.inf)
        np.maximum.at(powered, position, np.nan_to_num(power_p95[members], nan=-np.inf))
        rows = np.flatnonzero(members)
        several = count[position] >= 2
        shared[rows[several]] = True
        peak[rows[several]] = highest[position[several]]
        power[rows[several]] = np.where(
            np.isfinite(powered[position[several]]), powered[position[several]], np.nan
        )
    with np.errstate(invalid="ignore"):
        low: BoolArray = shared & (peak < COMPUTE_UTIL) & ~(power >= COMPUTE_POWER)
    return low, peak, shared


@dataclass(frozen=True)
class Review:
    """The checks of every row with a loop of its own, and what context says of it."""

    looped: BoolArray  # a loop of its own, in utilisation or the second signal
    period: FloatArray  # that loop's period in samples (NaN for none)
    signal: list[str]  # where the loop is: "util", "power", "sm-active", "mem-copy" or ""
    halves: Halves
    pausing: FloatArray  # share of period-long stretches with a pause (1 where not judged)
    low: BoolArray  # a job of several GPUs that never computes flat out (never_computes)
    peak: FloatArray  # the job's peak utilisation (its busiest GPU's) that says so
    serving: BoolArray  # the workload is a serving one (owner or engine)
    strong: BoolArray  # the job's ranks also wait in collectives: training even when serving

    @property
    def drifts(self) -> BoolArray:
        drifting: BoolArray = self.looped & ~self.halves.agrees(self.period)
        return drifting

    @property
    def pauses(self) -> BoolArray:
        pausing: BoolArray = self.pausing >= MIN_PAUSING_SHARE
        return pausing

    @property
    def iteration(self) -> BoolArray:
        """Loops that pass every check: an iteration period."""
        passed: BoolArray = self.looped & ~self.drifts & self.pauses & ~self.low
        return passed

    @property
    def accepted(self) -> BoolArray:
        """Iteration loops that count as training: outside a serving workload, or inside one
        with ranks waiting in collectives too."""
        counted: BoolArray = self.iteration & (~self.serving | self.strong)
        return counted


def _power_share_p95(context: Context, rows: IntArray) -> FloatArray:
    """95th percentile of power as a share of each row's range (NaN where unknown)."""
    share = np.full(rows.size, np.nan)
    if context.power is None or context.power_limit is None or rows.size == 0:
        return share
    limit = np.asarray(context.power_limit, dtype=np.float64)[rows]
    floor = (
        np.zeros(rows.size)
        if context.power_floor is None
        else np.nan_to_num(np.asarray(context.power_floor, dtype=np.float64)[rows])
    )
    known = np.isfinite(limit)
    if known.any():
        fraction = power_fraction(context.power[rows[known]], floor[known], limit[known])
        share[known] = summarise(fraction).p95
    return share


def review(
    util: FloatMatrix,
    summary: Summary,
    context: Context,
    *,
    looped: BoolArray,
    in_util: BoolArray,
    period: FloatArray,
    signal_names: list[str],
    groups: IntArray,
    busy: BoolArray,
    waiting: BoolArray,
    serving: BoolArray,
) -> Review:
    """Checks the loops of ``looped`` rows (``in_util``: found in utilisation, else in the second
    signal; ``period`` in samples) and, for every busy row, whether its job takes turns."""
    count = util.shape[0]
    rows = np.flatnonzero(looped)
    pausing = np.ones(count)
    halves = Halves(
        np.full(count, np.nan),
        np.full(count, np.nan),
        np.zeros(count, dtype=bool),
        np.zeros(count, dtype=bool),
        np.zeros(count, dtype=bool),
    )
    if rows.size:
        second, floor, share = _pause_signal(context, rows)
        pausing[rows] = pause_share(util, rows, period[rows], second, floor=floor, share=share)
        halves = _halves(util, context, rows[in_util[rows]], rows[~in_util[rows]], period)
    # The 95th percentile screens; the rows it leaves in doubt (and their jobs) are judged on
    # the 99th (a short busy phase in every iteration is a small share of the samples) and
    # on power.
    power_p95 = np.full(count, np.nan)
    low, peak, _ = never_computes(groups, busy, summary.p95, power_p95)
    if low.any():
        doubt = np.flatnonzero(low | job_any(groups, low))
        util_peak = summary.p95.copy()
        with warnings.catch_warnings():  # rows without a sample are busy nowhere: NaN is fine
            warnings.simplefilter("ignore", RuntimeWarning)
            util_peak[doubt] = np.nanpercentile(util[doubt], PEAK_PERCENTILE, axis=1)
        power_p95[doubt] = _power_share_p95(context, doubt)
        low, peak, _ = never_computes(groups, busy, util_peak, power_p95)
    strong = looped & (waiting | job_any(groups, waiting))
    names = [name if looped[row] else "" for row, name in enumerate(signal_names)]
    return Review(
        looped=looped,
        period=np.where(looped, period, np.nan),
        signal=names,
        halves=halves,
        pausing=pausing,
        low=low & ~waiting & ~job_any(groups, waiting),
        peak=peak,
        serving=serving,
        strong=strong,
    )


def _pause_signal(
    context: Context, rows: IntArray
) -> tuple[FloatMatrix | None, FloatArray, FloatArray]:
    """The signal besides utilisation in which a row may pause (power where exported, else SM
    activity, else memory copy), whole; and the floor and share ``rows`` pause at: power above
    the idle floor, the percentages from zero as utilisation."""
    if context.power is not None:
        floor = (
            np.zeros(rows.size)
            if context.power_floor is None
            else np.asarray(context.power_floor, dtype=np.float64)[rows]
        )
        return context.power, floor, np.full(rows.size, POWER_PAUSE_SHARE)
    signal = context.mem_copy
    if context.sm_active is not None:
        signal = context.sm_active * 100.0
    return signal, np.zeros(rows.size), np.full(rows.size, UTIL_PAUSE_SHARE)


def _halves(
    util: FloatMatrix,
    context: Context,
    in_util: IntArray,
    in_second: IntArray,
    period: FloatArray,
) -> Halves:
    """``half_periods`` for the loops of utilisation rows ``in_util`` and of second-signal rows
    ``in_second`` (all rows' entries; NaN and unchecked elsewhere). Only rows whose halves
    hold enough iterations are gathered."""
    count, columns = util.shape
    enough = MIN_HALF_ITERATIONS * np.nan_to_num(period, nan=np.inf) <= columns // 2
    in_util, in_second = in_util[enough[in_util]], in_second[enough[in_second]]
    rows = np.concatenate((in_util, in_second))
    signal = util[rows]  # a copy: its gaps are filled in place
    if in_second.size:
        signal[in_util.size :] = second_signal(context, in_second)[0]
    gapped = np.flatnonzero(~np.isfinite(signal).all(axis=1))
    if gapped.size:
        signal[gapped] = fill_gaps(signal[gapped])
    found = half_periods(signal, period[rows])
    first, second = np.full(count, np.nan), np.full(count, np.nan)
    checked = np.zeros(count, dtype=bool)
    repeats = np.zeros((2, count), dtype=bool)
    first[rows], second[rows], checked[rows] = found.first, found.second, found.checked
    repeats[0, rows], repeats[1, rows] = found.first_repeats, found.second_repeats
    return Halves(first, second, checked, repeats[0], repeats[1])


def job_any(groups: IntArray, flags: BoolArray) -> BoolArray:
    """Per row: some row of its job (same id >= 0) has the flag."""
    rows = groups.shape[0]
    member = groups >= 0
    if not (flags & member).any():
        return np.zeros(rows, dtype=bool)
    flagged = distinct(groups[flags & member])
    found: BoolArray = member & np.isin(groups, flagged)
    return found
