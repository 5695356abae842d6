"""Nsight Systems SQLite export files: written from a ``ReportBuilder``, and altered afterwards.

Tables exist only when their data does, as in real exports: ``write_export`` creates a table
only when rows were added to it (or ``omit`` removes one). Rows are written in a shuffled order
(``shuffle=True``), since exports do not guarantee time order; ``shuffle=False`` keeps the order
they were added in, and ``time_order=True`` sorts them by start (as Nsight Systems appears to
write them).

``tamper`` then alters a written export the way a damaged or hand-made one could be: values
Nsight Systems never writes (NULL or reals where integers belong), with the table's NOT NULL
constraints dropped where needed.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from tests.support.nsys.schema import (
    ALWAYS,
    MEMCPY_KINDS,
    MEMORY_KINDS,
    NVTX,
    NVTX_EVENT_TYPES,
    PRODUCT_VERSION,
    TABLES,
)

if TYPE_CHECKING:
    from tests.support.nsys.builder import ReportBuilder


def write_export(
    builder: ReportBuilder,
    path: Path,
    *,
    shuffle: bool,
    time_order: bool,
    omit: Iterable[str],
    metadata: Sequence[tuple[str, str]] | None,
    metadata_table: str,
    seed: int,
) -> Path:
    """Write ``builder``'s export to ``path`` (replacing it) and return the path, its
    metadata table named ``metadata_table`` (``EXPORT_META_DATA`` before export schema 3)."""
    path.unlink(missing_ok=True)
    rows: dict[str, list[tuple[Any, ...]]] = {
        "StringIds": [(i, value) for value, i in builder.strings.items()],
        "ENUM_CUDA_MEMCPY_OPER": list(MEMCPY_KINDS),
        "ENUM_CUDA_MEM_KIND": list(MEMORY_KINDS),
        "TARGET_INFO_GPU": [
            (
                0,
                gpu,
                name,
                f"0000:{gpu + 7:02x}:00.0",
                f"GPU-{gpu:08d}-test-double",
                builder.cuda_devices.get(gpu),
            )
            for gpu, name in builder.gpus.items()
        ],
        "TARGET_INFO_CUDA_DEVICE": [
            (gpu, cuda, pid, None, 132) for pid, cuda, gpu in builder.process_devices
        ],
    }
    if NVTX in builder.batches:
        rows["ENUM_NSYS_EVENT_TYPE"] = list(NVTX_EVENT_TYPES)
    if metadata is None:
        metadata = [("EXPORT_PRODUCT_VERSION", PRODUCT_VERSION)]
        if builder.schema_version is not None:
            metadata.append(("EXPORT_SCHEMA_VERSION", builder.schema_version))
    rows["META_DATA_EXPORT"] = list(metadata)
    if builder.session_start_utc_ns is not None:
        rows["TARGET_INFO_SESSION_START_TIME"] = [(builder.session_start_utc_ns, None, None)]
    columns = {
        "TARGET_INFO_GPU": "(vmId, id, name, busLocation, uuid, cuDevice)",
        "TARGET_INFO_SESSION_START_TIME": "(utcEpochNs, utcTime, localTime)",
    }
    rng = np.random.default_rng(seed)
    connection = sqlite3.connect(path)
    try:
        for table, definition in TABLES.items():
            present = bool(rows.get(table)) or table in builder.batches
            if table in omit or not (present or table in ALWAYS):
                continue
            name = metadata_table if table == "META_DATA_EXPORT" else table
            connection.execute(f"CREATE TABLE {name} ({definition})")
            if table in builder.batches:
                _insert(
                    connection, table, builder.batches[table], rng if shuffle else None, time_order
                )
            elif rows.get(table):
                values = rows[table]
                marks = ",".join("?" * len(values[0]))
                target = f"{name} {columns.get(table, '')}"
                connection.executemany(f"INSERT INTO {target} VALUES ({marks})", values)
        connection.commit()
    finally:
        connection.close()
    return path


def _insert(
    connection: sqlite3.Connection,
    table: str,
    batches: list[dict[str, npt.NDArray[Any]]],
    rng: np.random.Generator | None,
    time_order: bool,
) -> None:
    names = sorted(set().union(*(batch.keys() for batch in batches)))
    size = sum(len(next(iter(batch.values()))) for batch in batches)
    if rng is not None:
        order = rng.permutation(size)
    elif time_order:
        order = np.argsort(np.concatenate([batch["start"] for batch in batches]), kind="stable")
    else:
        order = np.arange(size)
    data = []
    for name in names:
        parts = [
            batch.get(name, np.full(len(next(iter(batch.values()))), None, dtype=object))
            for batch in batches
        ]
        data.append(np.concatenate(parts)[order].tolist())
    marks = ",".join("?" * len(names))
    connection.executemany(
        f"INSERT INTO {table} ({','.join(names)}) VALUES ({marks})", zip(*data, strict=True)
    )


def tamper(path: Path, *statements: str, loosen: Iterable[str] = ()) -> Path:
    """Run SQL ``statements`` on the export at ``path``, after recreating each table of
    ``loosen`` without its NOT NULL constraints (a hostile or damaged export's rows: NULL or
    real values where Nsight Systems writes integers)."""
    connection = sqlite3.connect(path)
    try:
        for table in loosen:
            connection.execute(f"ALTER TABLE {table} RENAME TO strict_{table}")
            connection.execute(f"CREATE TABLE {table} ({_without_not_null(TABLES[table])})")
            connection.execute(f"INSERT INTO {table} SELECT * FROM strict_{table}")
            connection.execute(f"DROP TABLE strict_{table}")
        for statement in statements:
            connection.execute(statement)
        connection.commit()
    finally:
        connection.close()
    return path


def _without_not_null(definition: str) -> str:
    return definition.replace(" NOT NULL", "")
