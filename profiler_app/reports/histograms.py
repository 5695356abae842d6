"""``report --by rightsize``'s histograms: every workload's, merged in one numpy array from the
packed rows (``sinks/store/packing.py``), the row-form rows and the raw rows at the range's
edges, and their quantiles read for all workloads at once."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from profiler_app.sinks.store.activity import BUCKETS
from profiler_app.sinks.store.packing import CELLS, METRIC_ORDER, cell, unpack

_PENDING = 100_000  # single cells kept before they are added to the array


class Histograms:
    """Per workload (a row number the caller gives), every metric's 1 %-wide histogram."""

    def __init__(self) -> None:
        self.seconds: npt.NDArray[np.float64] = np.zeros((16, CELLS))
        self._rows: list[int] = []
        self._cells: list[int] = []
        self._values: list[float] = []

    def _room(self, rows: int) -> None:
        if rows > len(self.seconds):
            grown = np.zeros((max(rows, 2 * len(self.seconds)), CELLS))
            grown[: len(self.seconds)] = self.seconds
            self.seconds = grown

    def bin(self, row: int, metric: str, percent: int, seconds: float) -> None:
        """One row-form histogram row's (or raw row's) seconds."""
        at = cell(metric, percent)
        if at is None:
            return
        self._rows.append(row)
        self._cells.append(at)
        self._values.append(seconds)
        if len(self._rows) >= _PENDING:
            self.flush()

    def packed(self, rows: Iterable[tuple[int, Any]], share: float = 1.0) -> None:
        """Packed rows: (workload's row, ``histograms``) each."""
        owners, blobs = [], []
        for owner, blob in rows:
            owners.append(owner)
            blobs.append(blob)
        if not owners:
            return
        counts, records = unpack(blobs)
        rows = np.repeat(np.asarray(owners, dtype=np.int64), counts)
        self._room(int(rows.max()) + 1)
        seconds = records["seconds"] * share if share != 1.0 else records["seconds"]
        np.add.at(self.seconds, (rows, records["cell"].astype(np.int64)), seconds)

    def flush(self) -> None:
        if not self._rows:
            return
        rows = np.asarray(self._rows, dtype=np.int64)
        self._room(int(rows.max()) + 1)
        np.add.at(self.seconds, (rows, np.asarray(self._cells)), np.asarray(self._values))
        self._rows, self._cells, self._values = [], [], []

    def quantiles(self, workloads: int, metric: str, q: float) -> npt.NDArray[np.float64]:
        """The ``q`` quantile of ``metric`` for rows ``0 .. workloads - 1``: NaN where a row
        holds no time."""
        self.flush()
        self._room(workloads)
        start = METRIC_ORDER.index(metric) * BUCKETS
        return quantiles(self.seconds[:workloads, start : start + BUCKETS], q)


def quantiles(histograms: npt.NDArray[np.float64], q: float) -> npt.NDArray[np.float64]:
    """Per row of 1 %-wide bucket histograms, what ``histogram_quantile`` gives: the lower edge
    of the first bucket where the running time reaches ``q`` of the total (summed as it sums,
    ``math.fsum`` for the total and in bucket order for the running time); NaN for no time."""
    kept = np.where(histograms > 0, histograms, 0.0)
    totals = np.fromiter((math.fsum(row) for row in kept), np.float64, len(kept))
    running = np.cumsum(kept, axis=1)
    # Only a bucket holding time can be the answer, as in histogram_quantile: where q times the
    # total underflows to 0 (a total of a few subnormals), an empty first bucket reaches it.
    reached = (running >= (q * totals)[:, None]) & (kept > 0)
    first = np.argmax(reached, axis=1)
    # Never reached (rounding): the last bucket holding time, as histogram_quantile falls back.
    last = kept.shape[1] - 1 - np.argmax(kept[:, ::-1] > 0, axis=1)
    index = np.where(reached.any(axis=1), first, last)
    return np.where(totals > 0, index / 100, math.nan)
