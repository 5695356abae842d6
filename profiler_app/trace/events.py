"""The report's events as checked numpy columns: GPU activity (kernels, copies, memsets) and CUDA
API calls, read in bulk (``columns``).

Rows that no GPU timeline can hold are skipped and counted in one warning per table:

- a start, end or deviceId (a kernel's name) that is NULL or not an integer, such as an end of
  9e999 (a real) or text;
- a deviceId outside 0-65535, negative ones included (CUDA device ids are small);
- a time beyond 2^61 ns (73 years) either side of zero, whose durations would overflow.

Rows with ``start = end = 0`` (no timestamp: CUPTI's convention) and rows that end before they
start are left out silently, as before. CUDA backtrace rows of the runtime table are not calls
(``schema.CUDA_BACKTRACE_EVENT_CLASSES``) and are not read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from profiler_app.trace import columns, schema
from profiler_app.trace.columns import MISSING, Column, IntArray
from profiler_app.trace.export import Export

BoolArray = npt.NDArray[np.bool_]
MAX_DEVICE = (1 << 16) - 1
TIME_LIMIT = 1 << 61
MEMSET_KIND = -1  # ``Memory.kind`` of a memset (copies carry ENUM_CUDA_MEMCPY_OPER)


@dataclass(frozen=True)
class Activity:
    """Timed rows of GPU activity tables (``end >= start``, not both 0), in table order."""

    device: IntArray
    start: IntArray
    end: IntArray
    pid: IntArray  # globalPid; MISSING where unknown

    def __len__(self) -> int:
        return int(self.start.size)


@dataclass(frozen=True)
class Kernels(Activity):
    name: IntArray  # StringIds id (demangledName, else shortName)
    correlation: IntArray  # MISSING for kernels of a CUDA graph, which share their launch


@dataclass(frozen=True)
class Memory(Activity):
    kind: IntArray  # ENUM_CUDA_MEMCPY_OPER, or MEMSET_KIND
    pageable: BoolArray  # from or to pageable host memory
    bytes: IntArray


@dataclass(frozen=True)
class Calls:
    """Every CUDA API call (timed or not: a launch counts whatever its timestamps)."""

    start: IntArray
    end: IntArray
    name: IntArray  # StringIds id
    pid: IntArray  # the calling process (globalTid's process bits); MISSING where unknown
    correlation: IntArray  # MISSING where NULL
    timed: BoolArray


@dataclass(frozen=True)
class Events:
    kernels: Kernels
    memory: Memory
    calls: Calls | None  # None without a CUDA API table


def load(export: Export) -> Events:
    """Every table's events; a warning on ``export`` for each table that had rows skipped."""
    return Events(_kernels(export), _memory(export), _calls(export))


def _kernels(export: Export) -> Kernels:
    table = schema.KERNEL
    name = "demangledName" if export.has_column(table, "demangledName") else "shortName"
    graph = export.has_column(table, "graphNodeId")
    correlation = (
        Column(
            "correlation",
            required=False,
            expression="CASE WHEN coalesce(graphNodeId, 0) = 0 THEN correlationId END",
        )
        if graph
        else Column("correlationId", required=False)
    )
    rows = _activity_rows(export, table, [Column(name), correlation])
    return Kernels(
        **rows.activity(),
        name=rows[name],
        correlation=rows[correlation.name],
    )


def _memory(export: Export) -> Memory:
    parts: list[Memory] = []
    if export.has(schema.MEMCPY):
        rows = _activity_rows(
            export,
            schema.MEMCPY,
            [
                Column("bytes", required=False),
                Column("copyKind", required=False),
                Column("srcKind", required=False),
                Column("dstKind", required=False),
            ],
        )
        kind = rows["copyKind"]
        parts.append(
            Memory(
                **rows.activity(),
                kind=np.where(kind == MISSING, 0, kind),  # 0: unknown
                pageable=(rows["srcKind"] == schema.PAGEABLE_MEMORY)
                | (rows["dstKind"] == schema.PAGEABLE_MEMORY),
                bytes=_zero_if_missing(rows["bytes"]),
            )
        )
    if export.has(schema.MEMSET):
        rows = _activity_rows(export, schema.MEMSET, [Column("bytes", required=False)])
        size = int(np.count_nonzero(rows.keep))
        parts.append(
            Memory(
                **rows.activity(),
                kind=np.full(size, MEMSET_KIND, np.int64),
                pageable=np.zeros(size, bool),
                bytes=_zero_if_missing(rows["bytes"]),
            )
        )
    if not parts:
        return Memory(
            device=_empty(),
            start=_empty(),
            end=_empty(),
            pid=_empty(),
            kind=_empty(),
            pageable=np.zeros(0, bool),
            bytes=_empty(),
        )
    return Memory(
        device=np.concatenate([p.device for p in parts]),
        start=np.concatenate([p.start for p in parts]),
        end=np.concatenate([p.end for p in parts]),
        pid=np.concatenate([p.pid for p in parts]),
        kind=np.concatenate([p.kind for p in parts]),
        pageable=np.concatenate([p.pageable for p in parts]),
        bytes=np.concatenate([p.bytes for p in parts]),
    )


def _calls(export: Export) -> Calls | None:
    table = schema.RUNTIME
    if not export.has(table):
        return None
    where = ""
    if export.has_column(table, "eventClass"):
        classes = schema.CUDA_BACKTRACE_EVENT_CLASSES
        where = f"eventClass NOT BETWEEN {classes[0]} AND {classes[-1]}"
    rows = columns.read(
        export,
        table,
        [
            Column("start"),
            Column("end"),
            Column("nameId"),
            Column("globalTid", required=False),
            Column("correlationId", required=False),
        ],
        where,
    )
    start, end = rows["start"], rows["end"]
    in_range = _within_limit(start) & _within_limit(end)
    out_of_range = int(start.size - np.count_nonzero(in_range))
    _warn(export, table, "start, end or nameId", (rows.skipped, 0, out_of_range))
    if not in_range.all():
        rows = columns.Rows({k: v[in_range] for k, v in rows.values.items()}, rows.skipped)
        start, end = rows["start"], rows["end"]
    thread = rows["globalTid"]
    return Calls(
        start=start,
        end=end,
        name=rows["nameId"],
        pid=np.where(thread == MISSING, MISSING, thread & schema.PROCESS_MASK),
        correlation=rows["correlationId"],
        timed=_timed(start, end),
    )


@dataclass(frozen=True)
class _ActivityRows:
    values: dict[str, IntArray]
    keep: BoolArray  # timed rows that a timeline can hold

    def __getitem__(self, name: str) -> IntArray:
        """Column ``name`` of the rows kept (no copy when all are)."""
        values = self.values[name]
        return values if self.keep_all else values[self.keep]

    @property
    def keep_all(self) -> bool:
        return bool(self.keep.all())

    def activity(self) -> dict[str, IntArray]:
        names = {"device": "deviceId", "start": "start", "end": "end", "pid": "globalPid"}
        return {field: self[column] for field, column in names.items()}


def _activity_rows(export: Export, table: str, extra: list[Column]) -> _ActivityRows:
    if not export.has(table):
        empty = {c: _empty() for c in ("start", "end", "deviceId", "globalPid")}
        return _ActivityRows({**empty, **{c.name: _empty() for c in extra}}, np.zeros(0, bool))
    rows = columns.read(
        export,
        table,
        [
            Column("start"),
            Column("end"),
            Column("deviceId"),
            Column("globalPid", required=False),
            *extra,
        ],
    )
    start, end, device = rows["start"], rows["end"], rows["deviceId"]
    device_ok = (device >= 0) & (device <= MAX_DEVICE)
    time_ok = _within_limit(start) & _within_limit(end)
    fields = "start, end, deviceId or name" if table == schema.KERNEL else "start, end or deviceId"
    bad_device = int(device.size - np.count_nonzero(device_ok))
    _warn(
        export,
        table,
        fields,
        (rows.skipped, bad_device, int(np.count_nonzero(device_ok & ~time_ok))),
    )
    return _ActivityRows(rows.values, device_ok & time_ok & _timed(start, end))


def _timed(start: IntArray, end: IntArray) -> BoolArray:
    timed: BoolArray = (end >= start) & ((start != 0) | (end != 0))
    return timed


def _within_limit(times: IntArray) -> BoolArray:
    inside: BoolArray = (times >= -TIME_LIMIT) & (times <= TIME_LIMIT)
    return inside


def _zero_if_missing(values: IntArray) -> IntArray:
    return np.where(values == MISSING, 0, values)


def _empty() -> IntArray:
    return np.empty(0, np.int64)


def _warn(
    export: Export,
    table: str,
    fields: str,
    counts: tuple[int, int, int],
) -> None:
    """One warning for ``table``'s skipped rows: ``counts`` of rows with a value in ``fields``
    that is not an integer, with a deviceId out of range, with a time out of range."""
    not_integer, bad_device, out_of_range = counts
    reasons = []
    if not_integer:
        reasons.append(
            f"{not_integer:,} with a {fields} that is NULL or not an integer (e.g. a real such "
            "as 9e999, or text)"
        )
    if bad_device:
        reasons.append(f"{bad_device:,} with a deviceId outside 0-{MAX_DEVICE}")
    if out_of_range:
        reasons.append(f"{out_of_range:,} with a time more than 2^61 ns from zero")
    if reasons:
        skipped = sum(counts)
        export.warnings.append(
            f"{skipped:,} row{'' if skipped == 1 else 's'} of {table} skipped: "
            f"{'; '.join(reasons)}; the figures leave them out"
        )
