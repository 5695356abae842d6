"""Coupled stalls: the GPUs of one synchronous job stall and resume together.

The ranks of a data-parallel job meet in a collective at every step, so when one stalls (a
checkpoint, a slow batch, a hung peer) every other rank stalls with it: rank 0 drops to near
zero while its peers spin at 100 % utilisation (and near-idle power). Independent jobs on one
node depart from their usual level at unrelated moments. So two busy GPUs whose departures
coincide, again and again, run one job, whatever labels (or none) the exporter gave them.

A departure is a sample at least ``MIN_UTIL_DEPARTURE`` points of utilisation (or, where power
is known and utilisation is flat, ``MIN_POWER_DEPARTURE`` of the GPU's power range), and a
quarter of the row's own spread, away from the row's median. Two rows
are coupled when the phi coefficient of their departure flags reaches ``MIN_COUPLING`` (or
``-MIN_COUPLING``: a rank stalled most of the window has its stall level as its median, so it
departs exactly when its peers do not) over at least ``MIN_COUPLING_SAMPLES`` samples, and they
depart together in at least ``MIN_JOINT_STALLS`` separate stretches: one shared lull (a traffic
dip, two jobs launched together) is not enough.

Only rows that may share a job are compared: rows of one node (``Context.nodes``), else rows of
one known job (``Context.groups``); a node's eight GPUs are eight rows, so this stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from profiler_app.analysis.context import Context
from profiler_app.analysis.stats import BoolArray, FloatArray, IntArray
from profiler_app.core.arrays import distinct
from profiler_app.core.model import FloatMatrix

MIN_UTIL_DEPARTURE = 3.0  # percentage points; steady compute wobbles by one or two
MIN_POWER_DEPARTURE = 0.05  # of the power range (as evidence.MIN_SIGNAL_SWING)
# ... and at least this share of the row's own spread: a rank stalled most of the window sits
# at a jittery near-zero median, and only its busy stretches depart from it.
RANGE_SHARE = 0.25
LEVEL_SAMPLES = 256
# Power is read for departures only where utilisation spreads at most this much (5th to 95th
# percentile): where utilisation moves, its own departures show the stalls.
MAX_FLAT_UTIL_SPREAD = 20.0
MIN_COUPLING = 0.5
MIN_JOINT_STALLS = 3
MIN_COUPLING_SAMPLES = 60


@dataclass(frozen=True)
class Coupling:
    """Coupled pairs of rows (``left`` < ``right``) with the phi of their departures."""

    left: IntArray
    right: IntArray
    strength: FloatArray

    @classmethod
    def none(cls) -> Coupling:
        empty = np.zeros(0, dtype=np.intp)
        return cls(empty, empty.copy(), np.zeros(0))

    def partners(self, rows: int) -> IntArray:
        """Each row's most strongly coupled row, -1 for none."""
        partner = np.full(rows, -1, dtype=np.intp)
        best = np.zeros(rows)
        for a, b, phi in zip(
            self.left.tolist(), self.right.tolist(), self.strength.tolist(), strict=True
        ):
            for row, other in ((a, b), (b, a)):
                if phi > best[row]:
                    best[row], partner[row] = phi, other
        return partner


def _departures(values: FloatMatrix, least: FloatArray) -> tuple[BoolArray, FloatArray]:
    """Samples away from the row's median by ``least`` (per row) or by ``RANGE_SHARE`` of the
    row's spread (5th to 95th percentile), whichever is more (missing samples never); and each
    row's spread."""
    # The levels come from at most LEVEL_SAMPLES evenly spaced samples: a median needs no more,
    # and this keeps the cost of a whole cluster's matrix small.
    sample = values[:, :: max(1, values.shape[1] // LEVEL_SAMPLES)]
    missing = ~np.isfinite(sample)
    if missing.any():
        with np.errstate(invalid="ignore"):
            mean = np.sum(sample, axis=1, where=~missing) / np.maximum((~missing).sum(axis=1), 1)
        sample = np.where(missing, mean[:, None], sample)
    # Sorting a few hundred samples per row (vectorised) beats np.percentile's partitions.
    ordered = np.sort(sample, axis=1)
    last = ordered.shape[1] - 1
    low, level, high = (ordered[:, round(share * last)] for share in (0.05, 0.5, 0.95))
    threshold = np.maximum(least, RANGE_SHARE * (high - low))
    # Two comparisons rather than |values - level|: no temporary matrix of floats. NaN compares
    # False, so a missing sample never departs.
    with np.errstate(invalid="ignore"):
        away: BoolArray = values >= (level + threshold)[:, None]
        away |= values <= (level - threshold)[:, None]
    spread: FloatArray = high - low
    return away, spread


def _blocks(context: Context, rows: int) -> IntArray | None:
    blocks = context.nodes if context.nodes is not None else context.groups
    return None if blocks is None else np.asarray(blocks, dtype=np.intp).reshape(rows)


def _power_spans(context: Context, rows: IntArray, power: FloatMatrix) -> FloatArray:
    """The power range of ``rows`` where known, else the window's highest reading."""
    span = np.full(rows.size, np.nan)
    if context.power_floor is not None and context.power_limit is not None:
        span = np.asarray(context.power_limit - context.power_floor, dtype=np.float64)[rows]
    unknown = ~np.isfinite(span)
    if unknown.any():
        part = power[unknown]
        with np.errstate(all="ignore"):
            span[unknown] = np.max(part, axis=1, where=np.isfinite(part), initial=0.0)
    spans: FloatArray = np.maximum(span, 1e-9)
    return spans


def departures(util: FloatMatrix, rows: IntArray, context: Context) -> BoolArray:
    """Departure flags of ``rows``: in utilisation, and in power where the row has power and
    its utilisation is flat (a rank computing at 100 % stalls in power alone)."""
    if rows.size * 2 > util.shape[0]:  # most rows: flag them all and pick, no float copy
        flags, spread = _departures(util, np.full(util.shape[0], MIN_UTIL_DEPARTURE))
        flags, spread = flags[rows], spread[rows]
    else:
        flags, spread = _departures(util[rows], np.full(rows.size, MIN_UTIL_DEPARTURE))
    flat = np.flatnonzero(spread <= MAX_FLAT_UTIL_SPREAD)
    if context.power is not None and flat.size:
        power = context.power[rows[flat]]
        spans = _power_spans(context, rows[flat], power)
        flags[flat] |= _departures(power, MIN_POWER_DEPARTURE * spans)[0]
    return flags


def _phi(flags: FloatMatrix) -> FloatMatrix:
    """Phi coefficient between every two rows of each block: (blocks, size, size)."""
    both = (flags @ flags.transpose(0, 2, 1)) / flags.shape[2]  # batched BLAS
    share = np.diagonal(both, axis1=1, axis2=2)  # flags are 0 or 1: a row with itself
    spread = np.sqrt(share * (1.0 - share))
    with np.errstate(invalid="ignore", divide="ignore"):
        phi = (both - share[:, :, None] * share[:, None, :]) / (
            spread[:, :, None] * spread[:, None, :]
        )
    found: FloatMatrix = np.nan_to_num(phi, nan=0.0)
    return found


def _joint_stalls(flags: BoolArray) -> tuple[FloatMatrix, FloatMatrix]:
    """How many separate stretches every two rows of each block depart together, and how many
    the first departs while the second does not: (blocks, size, size) each.

    A joint stretch starts at t when both depart at t but not both at t - 1, so the count is
    sum(a_t b_t) - sum(a_t a_t-1 b_t b_t-1): batched products instead of a pass per pair.
    """
    quiet = ~flags
    parts = [
        part.astype(np.float32)
        for part in (
            flags,
            quiet,
            flags[..., 1:] & flags[..., :-1],
            quiet[..., 1:] & quiet[..., :-1],
        )
    ]
    departs, still, departs_on, still_on = parts
    swap = (0, 2, 1)
    same: FloatMatrix = departs @ departs.transpose(swap) - departs_on @ departs_on.transpose(swap)
    opposite: FloatMatrix = departs @ still.transpose(swap) - departs_on @ still_on.transpose(swap)
    return same, opposite


def coupled_pairs(
    util: FloatMatrix, busy: BoolArray, context: Context, valid_counts: IntArray | None = None
) -> Coupling:
    """The pairs of busy rows, within one block (node, else job), whose stalls coincide.
    ``valid_counts`` (each row's valid samples) saves counting them again."""
    rows_total = util.shape[0]
    blocks = _blocks(context, rows_total)
    if blocks is None:
        return Coupling.none()
    if valid_counts is None:
        valid_counts = np.isfinite(util).sum(axis=1)
    eligible = busy & (blocks >= 0) & (valid_counts >= MIN_COUPLING_SAMPLES)
    ids, counts = np.unique(blocks[eligible], return_counts=True)
    shared = ids[counts >= 2]
    rows = np.flatnonzero(eligible & np.isin(blocks, shared))
    if rows.size == 0:
        return Coupling.none()
    # Rows in block order (stable), so each block's rows are consecutive; flags stay in the
    # order of ``rows`` and are picked by position.
    rows = rows[np.argsort(blocks[rows], kind="stable")]
    flags = departures(util, rows, context)
    # Batch the blocks by size: one product per size, no loop per block.
    block_of = blocks[rows]
    boundaries = np.flatnonzero(np.diff(block_of)) + 1
    starts = np.concatenate(([0], boundaries))
    sizes = np.diff(np.concatenate((starts, [rows.size])))
    lefts, rights, strengths = [], [], []
    for size in distinct(sizes).tolist():
        first = starts[sizes == size]
        positions = first[:, None] + np.arange(size)[None, :]  # (blocks, size) into ``rows``
        block_flags = flags[positions]
        phi = _phi(block_flags.astype(np.float32))
        i, j = np.triu_indices(size, k=1)
        strong = np.abs(phi[:, i, j]) >= MIN_COUPLING
        block_index, pair = np.nonzero(strong)
        left, right = positions[block_index, i[pair]], positions[block_index, j[pair]]
        found = phi[block_index, i[pair], j[pair]].astype(np.float64)
        with_pairs = distinct(block_index)  # the blocks with a strong pair
        same, opposite = _joint_stalls(block_flags[with_pairs])
        slot = np.searchsorted(with_pairs, block_index)
        joint = np.where(found < 0, opposite[slot, i[pair], j[pair]], same[slot, i[pair], j[pair]])
        enough = joint >= MIN_JOINT_STALLS - 0.5  # float32 counts
        lefts.append(rows[left[enough]])
        rights.append(rows[right[enough]])
        strengths.append(np.abs(found[enough]))
    left_rows, right_rows = np.concatenate(lefts), np.concatenate(rights)
    low, high = np.minimum(left_rows, right_rows), np.maximum(left_rows, right_rows)
    return Coupling(low, high, np.concatenate(strengths))


def join(groups: IntArray | None, coupling: Coupling, rows: int) -> IntArray:
    """Job ids: the known ones, and for rows of no known job one id per set of coupled rows
    (a coupled row with a known job does not pull others into it: a pod is its own job)."""
    joined = np.full(rows, -1, dtype=np.intp) if groups is None else np.array(groups, np.intp)
    loose = (joined[coupling.left] < 0) & (joined[coupling.right] < 0)
    if not loose.any():
        return joined
    parent = list(range(rows))

    def root(row: int) -> int:
        while parent[row] != row:
            parent[row] = parent[parent[row]]
            row = parent[row]
        return row

    for a, b in zip(coupling.left[loose].tolist(), coupling.right[loose].tolist(), strict=True):
        parent[root(a)] = root(b)
    members = distinct(np.concatenate((coupling.left[loose], coupling.right[loose])))
    roots = np.array([root(row) for row in members.tolist()], dtype=np.intp)
    _, component = np.unique(roots, return_inverse=True)
    joined[members] = int(joined.max(initial=-1)) + 1 + component
    return joined
