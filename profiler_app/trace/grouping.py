"""Grouping event rows by integer keys with numpy: no Python per row, no sort where avoidable.

A key column becomes dense codes (``factorise``): by a presence table when its values span a
small range (device and string ids), by ``np.unique`` otherwise (process ids); several keys
combine into one code per group (``combine``). ``durations`` then reduces each group's rows
with ``np.bincount`` and ``ufunc.at``, in the rows' order, so sums of floating-point squares
add up in the same order as SQLite's ``sum`` over the table would.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
# A presence table of this many entries (or 4 per row) is cheaper than sorting the rows.
_DENSE_RANGE = 1 << 16


def factorise(values: IntArray) -> tuple[IntArray, IntArray]:
    """``(codes, uniques)``: ``uniques`` sorted, ``values == uniques[codes]``."""
    if values.size == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    low, high = int(values.min()), int(values.max())
    if low == high:
        return np.zeros(values.size, np.int64), np.array([low], np.int64)
    if high - low < max(_DENSE_RANGE, 4 * values.size):
        offsets = values - low
        present = np.bincount(offsets, minlength=high - low + 1) > 0
        code_of = np.cumsum(present, dtype=np.int64) - 1
        return code_of[offsets], np.flatnonzero(present).astype(np.int64) + low
    uniques, codes = np.unique(values, return_inverse=True)
    return codes.astype(np.int64).reshape(-1), uniques.astype(np.int64)


def combine(*keys: IntArray) -> tuple[IntArray, list[IntArray]]:
    """One code per distinct combination of ``keys`` (aligned columns): ``(codes, values)``,
    ``values[j][g]`` being key ``j``'s value in group ``g``; groups ordered by the keys."""
    size = keys[0].size if keys else 0
    codes = np.zeros(size, np.int64)
    groups = 1
    for key in keys:
        if size and key.min() == key.max():  # one value: no digit of the code
            continue
        key_codes, key_uniques = factorise(key)
        radix = max(len(key_uniques), 1)
        if groups * radix >= 1 << 62:  # compact first: the product would overflow
            codes, compact = factorise(codes)
            groups = len(compact)
        codes = codes * radix + key_codes
        groups *= radix
    codes, _ = factorise(codes)
    count = int(codes.max()) + 1 if size else 0
    representative = np.zeros(count, np.int64)  # a row of each group
    representative[codes] = np.arange(size, dtype=np.int64)
    return codes, [key[representative] for key in keys]


@dataclass(frozen=True)
class Durations:
    """Per group: count, total, extremes and sum of squares of ``end - start``, and the
    group's first start and last end (all arrays, one entry per group)."""

    count: IntArray
    total: IntArray
    low: IntArray
    high: IntArray
    squares: FloatArray
    first: IntArray
    last: IntArray


def durations(
    codes: IntArray, groups: int, start: IntArray, end: IntArray, length: IntArray | None = None
) -> Durations:
    """``length``: ``end - start`` when the caller has it already."""
    if length is None:
        length = end - start
    low = np.full(groups, np.iinfo(np.int64).max, np.int64)
    high = np.full(groups, np.iinfo(np.int64).min, np.int64)
    first = low.copy()
    last = high.copy()
    np.minimum.at(low, codes, length)
    np.maximum.at(high, codes, length)
    np.minimum.at(first, codes, start)
    np.maximum.at(last, codes, end)
    squared = length.astype(np.float64)
    squares = np.bincount(codes, weights=squared * squared, minlength=groups).astype(np.float64)
    return Durations(
        count=np.bincount(codes, minlength=groups).astype(np.int64),
        total=sums(codes, groups, length),
        low=low,
        high=high,
        squares=squares,
        first=first,
        last=last,
    )


class SumOverflowError(ValueError):
    """Values whose sum could pass 64-bit integers: no capture holds so much time."""


def sums(codes: IntArray, groups: int, values: IntArray) -> IntArray:
    """Exact integer sums per group; ``SumOverflowError`` where one could overflow."""
    if values.size:
        largest = max(int(values.max()), -int(values.min()))
        # a cheap bound first; the sum of magnitudes only when it fails
        if largest * values.size >= _SUM_LIMIT and np.abs(values, dtype=np.float64).sum() >= (
            _SUM_LIMIT
        ):
            raise SumOverflowError("values add up past 2^62")
    total = np.zeros(groups, np.int64)
    np.add.at(total, codes, values)
    return total


_SUM_LIMIT = float(1 << 62)
