"""Grouping a million rows without sorting them: SQLite's ``GROUP BY`` sorts every row first
(about 1.5 s for a million kernels on one core), while an upsert into a temp table keyed by an
integer touches only the group's row (about 0.5 s), whatever the rows' order.

The integer key packs the group's columns into 63 bits (``packed_key``). Real exports fit (a
device index under 256, a process id of 24 bits, string and correlation ids under 2^31 or
2^32), but nothing in the format promises it, so each group also stores its columns and a row
whose key matches a group with other columns fails the ``ok`` check; a key that overflows 64 bits
fails too. ``aggregate`` then returns False and the caller groups the slower, general way.

A key can also be exact by construction, and then the group stores no identity columns (an
upsert's cost grows with the row it rewrites): a process's slot among the few processes seen,
a string id checked to fit its bits, and any row outside those bounds turned into a key that is
not an integer (0.5), which SQLite refuses ("datatype mismatch"), so the slower way runs.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from profiler_app.trace.export import Export

Combine = Literal["same", "sum", "min", "max"]

# CASE, not SQLite's min()/max() functions: a function call per row and column cost 15 % of
# an upsert of a million rows (measured). Inputs combined by min or max are never NULL.
_UPDATE: dict[Combine, str] = {
    "sum": "{c} + excluded.{c}",
    "min": "CASE WHEN excluded.{c} < {c} THEN excluded.{c} ELSE {c} END",
    "max": "CASE WHEN excluded.{c} > {c} THEN excluded.{c} ELSE {c} END",
}


@dataclass(frozen=True)
class Column:
    name: str
    expression: str  # over the source's rows
    combine: Combine  # "same": part of the group's identity


def packed_key(*fields: tuple[str, int]) -> str:
    """An SQL integer of ``(expression, bits)`` fields, the first in the highest bits."""
    key = ""
    for expression, bits in fields:
        key = f"({key}) * {1 << bits} + ({expression})" if key else f"({expression})"
    return key


def aggregate(
    export: Export,
    *,
    table: str,
    key: str,
    columns: Sequence[Column],
    source: str,
    parameters: Mapping[str, object] | None = None,
) -> bool:
    """Fill ``table`` (``temp.`` something: key, ok, columns...) with one row per key over
    ``source``; False when two groups share a key or a key is not an integer (the table is then
    incomplete). Without "same" columns the key must be exact by construction (no ``ok``).

    ``source`` is ``FROM ... WHERE ...``: an upsert's SELECT needs its WHERE (SQLite's syntax).
    """
    connection = export.connection
    connection.execute(f"DROP TABLE IF EXISTS {table}")
    same = " AND ".join(f"{c.name} IS excluded.{c.name}" for c in columns if c.combine == "same")
    ok = ["ok INTEGER NOT NULL CHECK (ok)"] if same else []
    connection.execute(
        f"CREATE TABLE {table} (key INTEGER PRIMARY KEY, "
        f"{', '.join(ok + [column.name for column in columns])})"
    )
    updates = ", ".join(
        ([f"ok = ({same})"] if same else [])
        + [
            f"{c.name} = " + _UPDATE[c.combine].format(c=c.name)
            for c in columns
            if c.combine != "same"
        ]
    )
    values = ", ".join(column.expression for column in columns)
    try:
        connection.execute(
            f"INSERT INTO {table} SELECT {key}, {'1, ' if same else ''}{values} {source} "
            f"ON CONFLICT (key) DO UPDATE SET {updates}",
            dict(parameters or {}),
        )
    except sqlite3.IntegrityError:
        return False
    return True
