"""Evidence beyond a row's own utilisation loop: a loop in power (or SM activity) when
utilisation is flat, waiting (high utilisation at near-idle power), and sibling rows of one job.

All functions work on whole matrices (or the subset of rows that needs them), like the rest of
the analysis.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from profiler_app.analysis.context import Context
from profiler_app.analysis.coupling import Coupling
from profiler_app.analysis.periodicity import MIN_PERIOD_SAMPLES, find_periods
from profiler_app.analysis.power import power_fraction
from profiler_app.analysis.recurrence import drop_irregular
from profiler_app.analysis.stats import BoolArray, FloatArray, IntArray, Summary
from profiler_app.core.arrays import distinct
from profiler_app.core.model import FloatMatrix

# Power (or SM activity) is searched for a loop only where utilisation is flat: a standard
# deviation of at most this many points (ranks of a data-parallel job read a flat 90-100 %).
# Where utilisation moves, its own loop search has already looked.
MAX_FLAT_UTIL_STD = 10.0
# A loop in the second signal counts only if the signal really swings: its standard deviation
# reaches this share of the GPU's power range (or of 100 % SM activity). Thermal and clock
# wobble at a steady load stays far below.
MIN_SIGNAL_SWING = 0.05
# Waiting: utilisation at least this high (a kernel is resident all the time) ...
WAITING_UTIL_PERCENT = 90.0
# ... while the GPU draws at most this share of its power range above the idle floor,
MAX_WAITING_POWER_FRACTION = 0.25
# ... or at most this many of its SMs have a warp (DCGM_FI_PROF_SM_ACTIVE): one spinning kernel,
# typically a collective (NCCL) waiting for a peer. Compute keeps most SMs busy.
MAX_WAITING_SM_ACTIVE = 0.3
# Waiting counts only in runs lasting at least this long, and at least two samples: utilisation
# and power are not sampled at exactly the same instant, so the sample at the end of a busy
# burst can read high utilisation and low power once. A rank blocked in a collective waits for
# seconds at a time.
MIN_WAITING_RUN_SECONDS = 3.0
MIN_WAITING_RUN_SAMPLES = 2
# Sustained waiting adding up to this long within the window is evidence of a distributed job.
MIN_WAITING_SECONDS = 10.0
# Without power to judge a sample: a GPU pinned at this utilisation or more while a coupled
# GPU of the same job (analysis.coupling) is stalled at this much or less is blocked waiting
# for it, as ranks in a collective wait for a rank writing a checkpoint.
MIN_PINNED_UTIL = 95.0
MAX_STALLED_UTIL = 10.0


@dataclass(frozen=True)
class SignalLoops:
    """Loops found in the second signal (power, else SM activity, else memory-copy
    utilisation) of rows whose utilisation has none."""

    period: FloatArray  # samples; NaN where none
    strength: FloatArray
    signal: list[str]  # per row: "power", "sm-active", "mem-copy" or "" (none)


def second_signal(context: Context, rows: IntArray) -> tuple[FloatMatrix, list[str]]:
    """For ``rows``: power where a row has any sample, else SM activity in percent, else
    memory-copy utilisation, else NaN; and which signal each row got."""
    signal: FloatMatrix | None = None
    names = [""] * rows.size
    for name, matrix, scale in (  # the later wins where a row has several
        ("mem-copy", context.mem_copy, 1.0),
        ("sm-active", context.sm_active, 100.0),
        ("power", context.power, 1.0),
    ):
        if matrix is None:
            continue
        part = matrix[rows] * scale if scale != 1.0 else matrix[rows]
        has = np.isfinite(part).any(axis=1)
        if signal is None:
            signal = part
        else:
            signal[has] = part[has]
        for position in np.flatnonzero(has).tolist():
            names[position] = name
    assert signal is not None  # callers check that a second signal exists
    return signal, names


def row_std(matrix: FloatMatrix) -> FloatArray:
    """Standard deviation of each row's valid samples (NaN for rows without any)."""
    valid = np.isfinite(matrix)
    counts = valid.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.sum(matrix, axis=1, where=valid) / counts
        deviation = np.where(valid, matrix - mean[:, None], 0.0)
        spread: FloatArray = np.sqrt(np.einsum("ij,ij->i", deviation, deviation) / counts)
    return spread


def _spans(rows: IntArray, signal: FloatMatrix, names: list[str], context: Context) -> FloatArray:
    """What a swing of ``signal`` (the second signal of ``rows``) is measured against: the
    power range where known, else the window's highest reading; 100 for the percentages (SM
    activity, memory copy)."""
    span = np.full(rows.size, 100.0)
    is_power = np.array([name == "power" for name in names], dtype=bool)
    if not is_power.any():
        return span
    with np.errstate(all="ignore"):
        span[is_power] = np.nanmax(signal[is_power], axis=1, initial=0.0)
    if context.power_floor is not None and context.power_limit is not None:
        width = (context.power_limit - context.power_floor)[rows]
        known = is_power & np.isfinite(width)
        span[known] = width[known]
    spans: FloatArray = np.maximum(span, 1e-9)
    return spans


def signal_loops(
    util: FloatMatrix, summary: Summary, candidates: BoolArray, context: Context
) -> SignalLoops:
    """Periods in the second signal of ``candidates`` (busy rows without a utilisation loop)
    whose utilisation is flat (``MAX_FLAT_UTIL_STD``).

    A loop counts when the signal swings (``MIN_SIGNAL_SWING``) and, where utilisation has idle
    stretches, utilisation is busy in every iteration, as for utilisation loops.
    """
    count = util.shape[0]
    period = np.full(count, np.nan)
    strength = np.zeros(count)
    names = [""] * count
    if context.power is None and context.sm_active is None and context.mem_copy is None:
        return SignalLoops(period, strength, names)
    rows = np.flatnonzero(candidates)
    rows = rows[row_std(util[rows]) <= MAX_FLAT_UTIL_STD]
    if rows.size:
        signal, found_names = second_signal(context, rows)
        for row, name in zip(rows.tolist(), found_names, strict=True):
            names[row] = name
        enough = np.isfinite(signal).sum(axis=1) >= 3 * MIN_PERIOD_SAMPLES
        swinging = enough & (
            row_std(signal) >= MIN_SIGNAL_SWING * _spans(rows, signal, found_names, context)
        )
        if swinging.any():
            found, found_strength = find_periods(signal[swinging])
            period[rows[swinging]], strength[rows[swinging]] = found, found_strength
    # Bursts that happen to line up: the same recurrence test as for utilisation loops.
    drop_irregular(util, summary.idle_fraction, summary.p95, period, strength)
    return SignalLoops(period, strength, names)


@dataclass(frozen=True)
class Waiting:
    """Per row: how long it waited (sustained runs only), and what those samples looked like."""

    seconds: FloatArray  # 0 where nothing can tell (no absolute power range, no SM activity)
    share: FloatArray  # of the row's valid samples
    util: FloatArray  # mean utilisation while waiting (percent); NaN when it never waited
    power_fraction: FloatArray  # mean share of the power range while waiting; NaN if unknown
    sm_active: FloatArray  # mean SM activity while waiting; NaN if unknown
    peer: IntArray  # the stalled GPU a row waited for (coupled peers, no power), -1 if none

    @property
    def evident(self) -> BoolArray:
        found: BoolArray = self.seconds >= MIN_WAITING_SECONDS
        return found


def sustained(flags: BoolArray, length: int) -> BoolArray:
    """``flags`` kept only where they belong to a run of at least ``length`` in their row."""
    rows, columns = flags.shape
    if length <= 1 or columns == 0:
        return flags
    if length > columns:
        return np.zeros_like(flags)
    running = np.zeros((rows, columns + 1), dtype=np.int32)
    np.cumsum(flags, axis=1, out=running[:, 1:])
    # starts[j]: the run of ``length`` beginning at column j is all set.
    starts = (running[:, length:] - running[:, :-length]) == length
    covered = np.zeros((rows, columns + 1), dtype=np.int32)
    np.cumsum(np.pad(starts, ((0, 0), (0, length - 1))), axis=1, out=covered[:, 1:])
    # Column i is covered when some start in [i - length + 1, i] is set.
    lower = np.maximum(np.arange(columns) - length + 1, 0)
    kept: BoolArray = (covered[:, 1:] - covered[:, lower]) > 0
    return kept


def _range(context: Context) -> tuple[FloatArray, FloatArray]:
    """Each row's idle floor (0 where not given) and power limit (NaN where unknown)."""
    limit = np.asarray(context.power_limit, dtype=np.float64)
    floor = (
        np.zeros_like(limit)
        if context.power_floor is None
        else np.nan_to_num(np.asarray(context.power_floor, dtype=np.float64))
    )
    return floor, limit


def _peer_waiting(
    util: FloatMatrix, waiters: BoolArray, context: Context, coupling: Coupling, groups: IntArray
) -> tuple[IntArray, BoolArray, IntArray]:
    """Where a row is pinned while a coupled GPU of its job is stalled, and power cannot judge
    the sample: the rows that ever are (ascending), their flags, and each one's peer.

    Only the rows of coupled pairs are read: a cluster of independent GPUs pays nothing."""
    same = (groups[coupling.left] >= 0) & (groups[coupling.left] == groups[coupling.right])
    waiter = np.concatenate((coupling.left[same], coupling.right[same]))
    stalled = np.concatenate((coupling.right[same], coupling.left[same]))
    keep = waiters[waiter]
    waiter, stalled = waiter[keep], stalled[keep]
    involved = distinct(np.concatenate((waiter, stalled)))
    part = util[involved]
    with np.errstate(invalid="ignore"):
        pinned = part >= MIN_PINNED_UTIL
        if context.power is not None and context.power_limit is not None:
            # Where power can judge a sample, the power rule does.
            limit = np.asarray(context.power_limit, dtype=np.float64)[involved]
            pinned &= ~(np.isfinite(context.power[involved]) & np.isfinite(limit)[:, None])
        stall = part <= MAX_STALLED_UTIL
    order = np.argsort(waiter, kind="stable")
    waiter, stalled = waiter[order], stalled[order]
    found = pinned[np.searchsorted(involved, waiter)] & stall[np.searchsorted(involved, stalled)]
    some = found.any(axis=1)
    waiter, stalled, found = waiter[some], stalled[some], found[some]
    if waiter.size == 0:
        empty = np.zeros(0, dtype=np.intp)
        return empty, np.zeros((0, util.shape[1]), dtype=bool), empty
    first = np.flatnonzero(np.r_[True, waiter[1:] != waiter[:-1]])
    flags: BoolArray = np.logical_or.reduceat(found, first, axis=0)
    return waiter[first], flags, stalled[first]  # the first pair of each row names the peer


def waiting(
    util: FloatMatrix,
    rows: BoolArray,
    context: Context,
    step_seconds: float,
    *,
    coupling: Coupling | None = None,
    groups: IntArray | None = None,
    steady: BoolArray | None = None,
) -> Waiting:
    """High utilisation with the GPU's power near its idle floor, or few SMs active, or (where
    power cannot tell) while a coupled GPU of the same job is stalled; sustained.

    Only rows with an absolute power range (``Context.power_limit``) are judged by power: in
    the window's own range the lowest reading is "idle" by construction. Only ``steady`` rows
    (rarely idle; all of ``rows`` where not given) wait for a peer: a rank of a synchronous job
    computes or waits, while a serving GPU that takes a request its peer did not is idle most of
    the time.
    """
    count = util.shape[0]
    result = Waiting(
        seconds=np.zeros(count),
        share=np.zeros(count),
        util=np.full(count, np.nan),
        power_fraction=np.full(count, np.nan),
        sm_active=np.full(count, np.nan),
        peer=np.full(count, -1, dtype=np.intp),
    )
    judged = context.power_limit is not None or context.sm_active is not None
    peers = coupling is not None and groups is not None and coupling.left.size > 0
    if not rows.any() or not (judged or peers):
        return result
    selected = np.zeros(0, dtype=np.intp)
    flags = np.zeros((0, util.shape[1]), dtype=bool)
    if judged:
        with np.errstate(invalid="ignore"):
            low = np.zeros(util.shape, dtype=bool)
            if context.power is not None and context.power_limit is not None:
                floor, limit = _range(context)
                ceiling = floor + MAX_WAITING_POWER_FRACTION * (limit - floor)  # NaN: never low
                low |= context.power <= ceiling[:, None]
            if context.sm_active is not None:
                low |= context.sm_active <= MAX_WAITING_SM_ACTIVE
            everywhere = low & (util >= WAITING_UTIL_PERCENT) & rows[:, None]
        # Only the few rows that ever look like waiting pay for the run test and the means.
        selected = np.flatnonzero(everywhere.any(axis=1))
        flags = everywhere[selected]
    if coupling is not None and groups is not None and peers:
        eligible = rows if steady is None else rows & steady
        waiters, peer_flags, peer = _peer_waiting(util, eligible, context, coupling, groups)
        result.peer[waiters] = peer
        merged = distinct(np.concatenate((selected, waiters)))  # np.union1d loads numpy.ma
        both = np.zeros((merged.size, util.shape[1]), dtype=bool)
        both[np.searchsorted(merged, selected)] = flags
        both[np.searchsorted(merged, waiters)] |= peer_flags
        selected, flags = merged, both
    if selected.size == 0:
        return result
    run = max(MIN_WAITING_RUN_SAMPLES, int(np.ceil(MIN_WAITING_RUN_SECONDS / step_seconds)))
    flags = sustained(flags, run)
    waited = flags.sum(axis=1)
    util_rows = util[selected]
    result.seconds[selected] = waited * step_seconds
    result.share[selected] = waited / np.maximum(np.isfinite(util_rows).sum(axis=1), 1)
    some = waited > 0
    divisor = np.maximum(waited, 1)
    result.util[selected[some]] = (np.sum(util_rows, axis=1, where=flags) / divisor)[some]
    parts: list[tuple[FloatArray, FloatMatrix | None]] = [
        (result.sm_active, None if context.sm_active is None else context.sm_active[selected])
    ]
    if context.power is not None and context.power_limit is not None:
        floor, limit = _range(context)
        fraction = power_fraction(context.power[selected], floor[selected], limit[selected])
        parts.append((result.power_fraction, fraction))
    for target, part in parts:
        if part is None:
            continue
        usable = flags & np.isfinite(part)
        mean = np.sum(part, axis=1, where=usable) / np.maximum(usable.sum(axis=1), 1)
        target[selected[some]] = np.where(usable.any(axis=1), mean, np.nan)[some]
    return result


@dataclass(frozen=True)
class Siblings:
    """Per row, the sibling whose evidence it takes (-1 for none)."""

    source: IntArray


def siblings(groups: IntArray | None, sources: BoolArray, weight: FloatArray) -> Siblings:
    """For each row, the strongest row of its group among ``sources`` (by ``weight``); -1 when
    the row has no group or its group has no source. A source row points at itself."""
    rows = sources.shape[0]
    source = np.full(rows, -1, dtype=np.intp)
    if groups is None or not sources.any():
        return Siblings(source)
    grouped = sources & (groups >= 0)
    if not grouped.any():
        return Siblings(source)
    candidates = np.flatnonzero(grouped)
    # Strongest first within each group, then the first row of each group wins.
    order = candidates[np.lexsort((-weight[candidates], groups[candidates]))]
    group_ids, first = np.unique(groups[order], return_index=True)
    best = order[first]
    position = np.searchsorted(group_ids, groups)
    position = np.clip(position, 0, max(group_ids.size - 1, 0))
    member = (groups >= 0) & (group_ids[position] == groups)
    source[member] = best[position[member]]
    return Siblings(source)
