"""The writer's SQL, built from column names (as in models.py) in the driver's placeholders.

The daemon writes through the DB-API drivers (``dbapi.py``), not SQLAlchemy; the store tests run
every statement built here against the migrated schema on SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum

from profiler_app.sinks.store.dbapi import Database


class Merge(Enum):
    """How an upsert combines the stored value of a column with the new one."""

    ADD = "add"  # sums: covered seconds
    LARGER = "larger"  # peaks, last seen
    SMALLER = "smaller"  # first seen, shortest period
    KNOWN = "known"  # the new value unless it is NULL (a workload learnt later)


def insert_statement(database: Database, table: str, columns: Iterable[str]) -> str:
    """INSERT of one row with these columns, in the driver's placeholders."""
    names = list(columns)
    values = ", ".join(database.param(name) for name in names)
    return f"INSERT INTO {table} ({', '.join(names)}) VALUES ({values})"  # noqa: S608


def merged(database: Database, table: str, column: str, how: Merge) -> str:
    """The SQL of the stored and new (``excluded``) value of ``column`` combined; NULL only when
    both are, so a missing value never erases a known one."""
    stored, new = f"{table}.{column}", f"excluded.{column}"
    if how is Merge.ADD:
        return f"{stored} + {new}"
    if how is Merge.KNOWN:
        return f"coalesce({new}, {stored})"
    larger = how is Merge.LARGER
    if database.backend == "postgresql":  # GREATEST and LEAST skip NULLs
        return f"{'greatest' if larger else 'least'}({stored}, {new})"
    return f"{'max' if larger else 'min'}(coalesce({stored}, {new}), coalesce({new}, {stored}))"


def upsert_statement(
    database: Database,
    table: str,
    columns: Iterable[str],
    key: Iterable[str],
    updates: Mapping[str, str],
) -> str:
    """INSERT ... ON CONFLICT (key) DO UPDATE SET column = SQL, for each of ``updates``."""
    assignments = ", ".join(f"{column} = {value}" for column, value in updates.items())
    return (
        f"{insert_statement(database, table, columns)}"
        f" ON CONFLICT ({', '.join(key)}) DO UPDATE SET {assignments}"
    )
