"""Event columns read in bulk: SQLite joins each column's values into one text, numpy parses it.

A Python object per value (``fetchall`` of six kernel columns) costs about 1.5 s per million
rows; one ``group_concat`` per column, parsed by numpy's text reader, about 0.1 s per column
(measured on the benchmark's export). Tables are read in chunks of ``CHUNK_ROWS`` rowids, so no
text grows past SQLite's length limit.

Every value comes back as a 64-bit integer. NULL is read as ``MISSING`` (``coalesce``, so no
value drops out of a column and the columns stay aligned). A chunk whose text does not parse
into exactly one integer per row holds a value that is not an integer (a real such as 9e999,
text, a blob): that chunk is read again with every value that is not an integer replaced by
``MISSING``. Rows missing a required column are then dropped and counted in ``Rows.skipped``.
"""

from __future__ import annotations

import sqlite3
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from profiler_app.trace.export import Export

IntArray = npt.NDArray[np.int64]
MISSING = int(np.iinfo(np.int64).min)  # NULL, or not an integer
# Rows per query: texts of a few hundred kB, which the allocator reuses from chunk to chunk
# (chunks of 2^18 rows took a quarter more CPU time, in page faults).
CHUNK_ROWS = 1 << 16
_MAX_ROWID = (1 << 63) - 1


@dataclass(frozen=True)
class Column:
    name: str  # the table's column, or the name of ``expression``'s values
    required: bool = True  # a row without an integer here is skipped
    expression: str | None = None  # SQL over the table's columns, instead of the column

    @property
    def sql(self) -> str:
        return self.expression or self.name


@dataclass(frozen=True)
class Rows:
    """Each column's values, aligned; ``skipped``: rows dropped for a required column."""

    values: dict[str, IntArray]
    skipped: int

    def __getitem__(self, name: str) -> IntArray:
        return self.values[name]

    def __len__(self) -> int:
        return len(next(iter(self.values.values()))) if self.values else 0


def read(export: Export, table: str, columns: Sequence[Column], where: str = "") -> Rows:
    """``columns`` of ``table``'s rows matching ``where`` (SQL over the table's columns).

    A column the table lacks reads as ``MISSING`` (callers check required columns first).
    ``where`` must hold on rows of any type: it is applied to the raw values.
    """
    present = [c for c in columns if c.expression or export.has_column(table, c.name)]
    parts: dict[str, list[IntArray]] = {c.name: [] for c in present}
    for bounds in _chunks(export, table):
        for name, chunk in _read_chunk(export, table, present, where, bounds).items():
            parts[name].append(chunk)
    values: dict[str, IntArray] = {
        name: np.concatenate(chunks) if chunks else np.empty(0, np.int64)
        for name, chunks in parts.items()
    }
    size = len(next(iter(values.values()))) if values else 0
    keep = np.ones(size, dtype=bool)
    for column in present:
        if column.required:
            keep &= values[column.name] != MISSING
    skipped = size - int(np.count_nonzero(keep))
    if skipped:
        values = {name: array[keep] for name, array in values.items()}
    for column in columns:
        if column.name not in values:
            values[column.name] = np.full(size - skipped, MISSING, dtype=np.int64)
    return Rows(values, skipped)


def _chunks(export: Export, table: str) -> Iterator[tuple[int, int] | None]:
    """Rowid ranges of ``CHUNK_ROWS``, each starting at a row (rowids far apart cost one seek
    each, not a range each); one unbounded chunk for a table without rowids."""
    try:
        (first,) = export.connection.execute(f"SELECT min(rowid) FROM {table}").fetchone()
    except sqlite3.OperationalError:  # WITHOUT ROWID: read whole
        yield None
        return
    while isinstance(first, int):
        last = min(first + CHUNK_ROWS - 1, _MAX_ROWID)
        yield first, last
        if last == _MAX_ROWID:
            return
        (first,) = export.connection.execute(
            f"SELECT min(rowid) FROM {table} WHERE rowid > ?", (last,)
        ).fetchone()


def _read_chunk(
    export: Export,
    table: str,
    columns: Sequence[Column],
    where: str,
    bounds: tuple[int, int] | None,
) -> dict[str, IntArray]:
    conditions = [f"({where})"] if where else []
    parameters: list[int] = []
    if bounds is not None:
        conditions.append("rowid BETWEEN ? AND ?")
        parameters.extend(bounds)
    filtered = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    for careful in (False, True):
        values = ", ".join(
            f"group_concat({_careful(c.sql) if careful else f'coalesce({c.sql}, {MISSING})'})"
            for c in columns
        )
        sql = f"SELECT count(*){', ' if columns else ''}{values} FROM {table}{filtered}"
        try:
            row = export.connection.execute(sql, parameters).fetchone()
        except sqlite3.OperationalError:
            if careful:
                raise
            continue  # text that is not UTF-8: read again, carefully
        count = int(row[0])
        parsed = [_parse(text, count) for text in row[1:]]
        if all(array is not None for array in parsed):
            return {
                c.name: array for c, array in zip(columns, parsed, strict=True) if array is not None
            }
    raise AssertionError("the careful reading yields integers only")  # pragma: no cover


def _careful(expression: str) -> str:
    return f"CASE WHEN typeof({expression}) = 'integer' THEN {expression} ELSE {MISSING} END"


def _parse(text: object, count: int) -> IntArray | None:
    """``count`` integers from ``text``, or None when it holds anything else."""
    if text is None:
        return np.empty(0, np.int64) if count == 0 else None
    if not isinstance(text, str):
        return None
    with warnings.catch_warnings():
        # numpy warns (DeprecationWarning; ValueError in later releases) on an unparsed tail
        warnings.simplefilter("error", DeprecationWarning)
        try:
            values = np.fromstring(text, dtype=np.int64, sep=",")
        except (ValueError, DeprecationWarning):
            return None
    return values if values.size == count else None
