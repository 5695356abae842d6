"""Each GPU's busy time and idle gaps: the union of its kernel, copy and memset intervals.

Intervals are sorted by (GPU, start) (one ``argsort`` of a key that puts each GPU's times in
its own range), and the running maximum of the end times before each row (``np.maximum.
accumulate``) is how long the GPU was busy; a row starting after it opens an idle gap from that
time. Work overlapping on several streams thus counts once. ``Gaps`` then answers every figure
from the gaps by array operations: totals, the longest, those that began during a
synchronising call, and the idle time per time bin (the busy signal of the iteration finder).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from profiler_app.trace.grouping import IntArray, factorise


@dataclass(frozen=True)
class GapTotals:
    count: int
    total_ns: int
    longest_ns: int
    large_count: int  # gaps of at least the ``large_ns`` asked for
    large_ns: int


@dataclass(frozen=True)
class Gaps:
    """One GPU's idle gaps in time order: start (ns after the report's origin) and length."""

    starts: IntArray
    lengths: IntArray

    def totals(self, large_ns: int) -> GapTotals:
        large = self.lengths >= large_ns
        return GapTotals(
            count=int(self.lengths.size),
            total_ns=int(self.lengths.sum()),
            longest_ns=int(self.lengths.max()) if self.lengths.size else 0,
            large_count=int(np.count_nonzero(large)),
            large_ns=int(self.lengths[large].sum()),
        )

    def longest(self, limit: int) -> list[tuple[int, int]]:
        """(start, length) of the ``limit`` longest, longest first, earlier first among equals."""
        if self.lengths.size <= limit:
            chosen = np.arange(self.lengths.size)
        else:
            threshold = np.partition(self.lengths, self.lengths.size - limit)[-limit]
            above = np.flatnonzero(self.lengths > threshold)
            equal = np.flatnonzero(self.lengths == threshold)[: limit - above.size]
            chosen = np.concatenate([above, equal])
        order = np.lexsort((self.starts[chosen], -self.lengths[chosen]))
        return [(int(self.starts[i]), int(self.lengths[i])) for i in chosen[order]]

    def during(
        self, starts: IntArray, ends: IntArray, slack_ns: int, below_ns: int
    ) -> tuple[int, int]:
        """Count and total of the gaps shorter than ``below_ns`` that began within any of the
        intervals [starts, ends + slack_ns] (each gap counted once)."""
        if not self.starts.size or not starts.size:
            return 0, 0
        first = np.searchsorted(self.starts, starts, side="left")
        after = np.searchsorted(self.starts, ends + slack_ns, side="right")
        size = self.starts.size + 1
        inside = (first < after).nonzero()
        depth = np.cumsum(
            np.bincount(first[inside], minlength=size) - np.bincount(after[inside], minlength=size)
        )[:-1]
        chosen = (depth > 0) & (self.lengths < below_ns)
        return int(np.count_nonzero(chosen)), int(self.lengths[chosen].sum())

    def idle_by_bin(self, first: int, width_ns: int, bins: int) -> IntArray:
        """Idle nanoseconds in each of ``bins`` bins of ``width_ns`` from ``first``: the GPU's
        busy fraction per bin (a utilisation signal) follows exactly."""
        edges = first + width_ns * np.arange(bins + 1, dtype=np.int64)
        idle_before = self._idle_before(edges)
        bins_idle: IntArray = np.diff(idle_before)
        return bins_idle

    def _idle_before(self, times: IntArray) -> IntArray:
        """Idle time before each of ``times``: whole gaps that began before the one each time
        falls in or after, plus the part of that gap before it."""
        if not self.starts.size:
            return np.zeros(times.size, np.int64)
        before = np.concatenate([[0], np.cumsum(self.lengths)])
        last = np.searchsorted(self.starts, times, side="right") - 1  # gap starting at or before
        clipped = np.maximum(last, 0)
        partial = np.clip(times - self.starts[clipped], 0, self.lengths[clipped])
        idle: IntArray = np.where(last >= 0, before[clipped] + partial, 0)
        return idle


@dataclass(frozen=True)
class Timeline:
    gaps: dict[int, Gaps]  # by device
    busy_ns: dict[int, int]  # by device: the union's length

    def of(self, device: int) -> Gaps:
        return self.gaps.get(device, Gaps(np.empty(0, np.int64), np.empty(0, np.int64)))


def build(device: IntArray, start: IntArray, end: IntArray, origin: int, span: int) -> Timeline:
    """The idle gaps of each device among intervals [start, end) (empty ones ignored); times
    within ``span`` of ``origin``."""
    nonempty = end > start
    if not nonempty.all():
        device, start, end = device[nonempty], start[nonempty], end[nonempty]
    start, end = start - origin, end - origin
    codes, devices = factorise(device)
    stride = span + 1  # each device's times in a range of their own
    key = codes * stride + start
    order = np.argsort(key)
    key, finish, codes = key[order], (codes * stride + end)[order], codes[order]
    busy_until = np.maximum.accumulate(finish)[:-1]
    opens = (key[1:] > busy_until) & (codes[1:] == codes[:-1])
    gap_codes = codes[1:][opens]
    gap_starts = busy_until[opens] - gap_codes * stride
    gap_lengths = key[1:][opens] - busy_until[opens]
    bounds = np.searchsorted(gap_codes, np.arange(devices.size + 1))
    rows = np.searchsorted(codes, np.arange(devices.size + 1))
    gaps, busy = {}, {}
    for i, value in enumerate(devices.tolist()):
        gaps[value] = Gaps(
            gap_starts[bounds[i] : bounds[i + 1]], gap_lengths[bounds[i] : bounds[i + 1]]
        )
        first = int(key[rows[i]]) - i * stride
        last = int(finish[rows[i] : rows[i + 1]].max()) - i * stride
        busy[value] = last - first - int(gaps[value].lengths.sum())
    return Timeline(gaps, busy)
