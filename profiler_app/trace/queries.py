"""The SQL that summarises an export: SQLite aggregates every event row, Python sees only groups.

- ``kernel_groups``: kernels per (device, process, name) with the figures of ``nsys stats``'
  ``cuda_gpu_kern_sum``, each joined to the CUDA API call that launched it (same
  ``correlationId`` in the same process, summed once per id in ``LAUNCH_TABLE``) for launch
  counts and launch API time; kernels of a CUDA graph (``graphNodeId`` set) share one graph
  launch call, counted by name instead.
- ``kernel_groups`` and ``api_groups`` group by upsert into integer-keyed temp tables
  (``grouping``: no sort of the million rows; processes by their slot among ``api_callers``),
  by ``GROUP BY`` where a row falls outside the packed key's bounds.
- ``memory_groups``: copies per (device, process, copy kind, pageable host memory or not), and
  memsets.
- ``api_groups``: CUDA API calls per (process, function).
- ``build_gaps``: the union of kernel, copy and memset intervals of every GPU, by a window
  function (the running maximum of earlier end times; a row starting after it opens an idle
  gap), into a temp table keyed by time, so that per-GPU totals, the longest gaps and the gaps
  that began during a synchronising call are index range scans.
- ``idle_by_bin``: idle time per time bin, from the gap table by key ranges: the GPU's busy
  fraction per bin (a utilisation signal) follows exactly.
- ``nvtx_names`` and ``nvtx_spacings``: NVTX ranges by name, and the start-to-start spacing of
  one name's ranges on each thread; by default not the ranges of communication libraries (their
  NVTX domains or names, ``schema.LIBRARY_NVTX_*``: each an MPI or NCCL call, not a step).

Times are nanoseconds on the report's timeline. Rows with ``start = end = 0`` carry no timestamp
(CUPTI's convention) and rows that end before they start are skipped. CUDA backtrace rows of
the runtime table (``schema.CUDA_BACKTRACE_EVENT_CLASSES``) are not calls and are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from profiler_app.trace import grouping, schema
from profiler_app.trace.export import Export

# Each GPU's events are keyed by device * DEVICE_STRIDE_NS + (time - origin), so one ordered
# pass covers every GPU; 2^48 ns is 78 hours, longer than any trace.
DEVICE_STRIDE_NS = 1 << 48
GAP_TABLE = "temp.trace_gap"
SYNC_TABLE = "temp.trace_sync"
KERNEL_GROUPS = "temp.trace_kernel_groups"
API_GROUPS = "temp.trace_api_groups"
LAUNCH_TABLE = "temp.trace_launch"


@dataclass(frozen=True)
class DurationStats:
    """Count, total, extremes and sum of squares of a group's durations, and its time range."""

    count: int
    total_ns: int
    min_ns: int
    max_ns: int
    sum_squares: float
    first_start: int
    last_end: int


@dataclass(frozen=True)
class KernelGroup:
    device: int
    pid: int | None
    name: str
    durations: DurationStats
    short_count: int  # kernels shorter than the ``short_ns`` asked for
    launches: int  # kernels (outside CUDA graphs) whose launching API call is in the report
    launch_ns: int  # time spent in those calls


@dataclass(frozen=True)
class MemoryGroup:
    device: int
    pid: int | None
    kind: str  # "HtoD", "DtoH", ..., "memset"
    pageable: bool
    durations: DurationStats
    bytes: int


@dataclass(frozen=True)
class ApiGroup:
    pid: int | None
    name: str  # as stored, e.g. cudaLaunchKernel_v7000
    durations: DurationStats  # first_start and last_end 0: not collected, nothing reads them


@dataclass(frozen=True)
class GapTotals:
    count: int
    total_ns: int
    longest_ns: int
    large_count: int  # gaps of at least the ``large_ns`` asked for
    large_ns: int


def _timed(alias: str) -> str:
    return f"{alias}.end >= {alias}.start AND NOT ({alias}.start = 0 AND {alias}.end = 0)"


def _duration_columns(alias: str) -> str:
    length = f"({alias}.end - {alias}.start)"
    return (
        f"count(*) AS n, sum({length}) AS total, min({length}) AS low, max({length}) AS high, "
        f"sum({length} * 1.0 * {length}) AS squares, min({alias}.start) AS first, "
        f"max({alias}.end) AS last"
    )


_DURATIONS = "g.n, g.total, g.low, g.high, g.squares, g.first, g.last"
_DURATIONS_WITHOUT_SPAN = "g.n, g.total, g.low, g.high, g.squares, NULL, NULL"


def _duration_aggregates(alias: str, *, span: bool = True) -> list[grouping.Column]:
    """``_duration_columns`` as upsert columns (``grouping``); ``span``: first and last too."""
    length = f"({alias}.end - {alias}.start)"
    return [
        grouping.Column("n", "1", "sum"),
        grouping.Column("total", length, "sum"),
        grouping.Column("low", length, "min"),
        grouping.Column("high", length, "max"),
        grouping.Column("squares", f"{length} * 1.0 * {length}", "sum"),
        *(
            [
                grouping.Column("first", f"{alias}.start", "min"),
                grouping.Column("last", f"{alias}.end", "max"),
            ]
            if span
            else []
        ),
    ]


def _durations(row: Sequence[object]) -> DurationStats:
    count, total, low, high, squares, first, last = row
    return DurationStats(
        count=_int(count),
        total_ns=_int(total),
        min_ns=_int(low),
        max_ns=_int(high),
        sum_squares=float(squares) if isinstance(squares, int | float) else 0.0,
        first_start=_int(first),
        last_end=_int(last),
    )


def _int(value: object) -> int:
    return int(value) if isinstance(value, int | float) else 0


def _pid(value: object) -> int | None:
    return value if isinstance(value, int) else None


def _call(export: Export, alias: str) -> str:
    """Runtime-table row ``alias`` is a CUDA API call, not a CUDA backtrace around one."""
    if not export.has_column(schema.RUNTIME, "eventClass"):
        return "true"
    classes = schema.CUDA_BACKTRACE_EVENT_CLASSES
    return f"{alias}.eventClass NOT BETWEEN {classes[0]} AND {classes[-1]}"


def _pid_column(export: Export, table: str, alias: str) -> str:
    return f"{alias}.globalPid" if export.has_column(table, "globalPid") else "NULL"


def kernel_groups(export: Export, short_ns: int, callers: Callers | None) -> list[KernelGroup]:
    """Kernels per (device, process, name), keyed exactly by the device (8 bits), the
    process's slot (6 bits) and the 32-bit name id (``grouping``), by ``GROUP BY`` beyond."""
    if not export.has(schema.KERNEL):
        return []
    name = "demangledName" if export.has_column(schema.KERNEL, "demangledName") else "shortName"
    pid = _pid_column(export, schema.KERNEL, "k")
    launch = _launch_join(export, pid, callers)
    columns = [
        *_duration_aggregates("k"),
        grouping.Column("short", "k.end - k.start < :short", "sum"),
        grouping.Column("launches", launch.calls if launch else "0", "sum"),
        grouping.Column("launch_ns", launch.ns if launch else "0", "sum"),
    ]
    pids = _kernel_processes(export, pid, callers)
    slot = "0" if pid == "NULL" else _slot(pid, pids or [])
    device = f"CASE WHEN k.deviceId BETWEEN 0 AND {_DEVICE_MAX} THEN k.deviceId END"
    name_id = f"CASE WHEN k.{name} BETWEEN 0 AND {_ID_MAX} THEN k.{name} END"
    key = f"coalesce({grouping.packed_key((device, 8), (slot, 6), (name_id, 32))}, 0.5)"
    source = f"FROM {schema.KERNEL} AS k {launch.join if launch else ''} WHERE {_timed('k')}"
    parameters = {"short": short_ns}
    if pids is not None and grouping.aggregate(
        export, table=KERNEL_GROUPS, key=key, columns=columns, source=source, parameters=parameters
    ):
        group = ("g.key >> 38", _process_of_slot("(g.key >> 32) & 63", pids), f"g.key & {_ID_MAX}")
    else:
        _group_kernels_by_sorting(export, name, pid, launch, parameters)
        group = ("g.device", "g.pid", "g.name_id")
    sql = f"""
        SELECT {group[0]}, {group[1]}, coalesce(s.value, 'kernel #' || {group[2]}), {_DURATIONS},
               g.short, g.launches, g.launch_ns
        FROM {KERNEL_GROUPS} AS g LEFT JOIN {schema.STRINGS} AS s ON s.id = {group[2]}
    """
    return [
        KernelGroup(
            device=_int(row[0]),
            pid=_pid(row[1]),
            name=str(row[2]),
            durations=_durations(row[3:10]),
            short_count=_int(row[10]),
            launches=_int(row[11]),
            launch_ns=_int(row[12]),
        )
        for row in export.connection.execute(sql)
    ]


def _kernel_processes(export: Export, pid: str, callers: Callers | None) -> list[int] | None:
    """The processes whose kernels the report holds, for their slots: those calling the CUDA
    API (a kernel's process launched it), else read from the kernel table."""
    if pid == "NULL":
        return []
    if callers is not None and callers.processes is not None:
        return callers.processes
    (found,) = export.connection.execute(
        f"SELECT json_group_array(DISTINCT {pid}) FROM {schema.KERNEL} AS k"
    ).fetchone()
    return _processes(found)


@dataclass(frozen=True)
class _LaunchJoin:
    join: str  # joins each kernel ``k`` to ``r``: its launch calls, counted and timed
    calls: str
    ns: str


def _launch_join(export: Export, pid: str, callers: Callers | None) -> _LaunchJoin | None:
    """Each kernel's launch calls, through ``LAUNCH_TABLE``: the API calls' count and time keyed
    by process and ``correlationId``, built once, so each kernel finds them by one key lookup.

    The key is the process's slot among the report's few processes and the 32-bit correlation
    id (CUPTI's is unsigned 32-bit). None without a runtime table; an export outside those
    bounds is joined straight to the runtime table (SQLite then builds a temporary index, much
    slower on unsorted rows).
    """
    if callers is None:
        return None
    caller = _CALLER
    # Graph kernels share their graph launch's call: that time is counted once, by name.
    single = (
        " AND coalesce(k.graphNodeId, 0) = 0"
        if export.has_column(schema.KERNEL, "graphNodeId")
        else ""
    )
    same_process = pid != "NULL"
    # none needed when calls match kernels of any process
    pids = (callers.processes if same_process else []) if callers.correlation_ids_fit else None
    call_slot, kernel_slot = (
        (_slot(caller, pids or []), _slot(pid, pids or [])) if same_process else ("0", "0")
    )
    # Calls without an id or of no known process share key -1, which no kernel looks up (no
    # WHERE on the key: SQLite would compute it twice per row).
    key = f"coalesce({grouping.packed_key((call_slot, 32), ('r.correlationId', 32))}, -1)"
    source = f"FROM {schema.RUNTIME} AS r WHERE {_call(export, 'r')}"
    if pids is not None and grouping.aggregate(
        export,
        table=LAUNCH_TABLE,
        key=key,
        columns=[
            grouping.Column("calls", "1", "sum"),
            grouping.Column("ns", "r.end - r.start", "sum"),
        ],
        source=source,
    ):
        kernel_key = grouping.packed_key((kernel_slot, 32), ("k.correlationId", 32))
        return _LaunchJoin(
            f"LEFT JOIN {LAUNCH_TABLE} AS r ON r.key = {kernel_key} "
            f"AND k.correlationId BETWEEN 0 AND {_CORRELATION_MAX}{single}",
            "coalesce(r.calls, 0)",
            "coalesce(r.ns, 0)",
        )
    process = f" AND ({caller}) = {pid}" if same_process else ""
    return _LaunchJoin(
        f"LEFT JOIN {schema.RUNTIME} AS r ON r.correlationId = k.correlationId{process}{single} "
        f"AND {_call(export, 'r')}",
        "r.start IS NOT NULL",
        "coalesce(r.end - r.start, 0)",
    )


_CORRELATION_MAX = (1 << 32) - 1
_ID_MAX = (1 << 32) - 1  # of a string id in a packed key
_DEVICE_MAX = (1 << 8) - 1
_MAX_PROCESSES = 64
_CALLER = f"r.globalTid & {schema.PROCESS_MASK}"  # the calling process of API call ``r``


@dataclass(frozen=True)
class Callers:
    """What the packed keys of ``api_groups`` and ``LAUNCH_TABLE`` need of the CUDA API table,
    read in one pass: the calling processes (``globalPid``s; None beyond ``_MAX_PROCESSES`` or
    when not integers) and whether every ``correlationId`` fits 32 bits."""

    processes: list[int] | None
    correlation_ids_fit: bool


def api_callers(export: Export) -> Callers | None:
    """None without a CUDA API table."""
    if not export.has(schema.RUNTIME):
        return None
    low, high, callers = export.connection.execute(
        f"""SELECT min(r.correlationId), max(r.correlationId),
                   json_group_array(DISTINCT {_CALLER})
            FROM {schema.RUNTIME} AS r"""
    ).fetchone()
    fit = low is None or (
        isinstance(low, int) and isinstance(high, int) and 0 <= low <= high <= _CORRELATION_MAX
    )
    return Callers(_processes(callers), fit)


def _processes(found_json: str) -> list[int] | None:
    """The distinct processes of a ``json_group_array``, in order (so are the groups); None
    beyond ``_MAX_PROCESSES`` or when one is not an integer."""
    found = json.loads(found_json)
    pids = sorted(value for value in found if isinstance(value, int))
    known = len(pids) <= _MAX_PROCESSES and len(pids) + found.count(None) == len(found)
    return pids if known else None


def _slot(pid: str, pids: list[int]) -> str:
    """The index of process ``pid`` in ``pids``, NULL for another."""
    if not pids:
        return "NULL"
    cases = " ".join(f"WHEN {value} THEN {i}" for i, value in enumerate(pids))
    return f"CASE {pid} {cases} END"


def _process_of_slot(slot: str, pids: list[int]) -> str:
    """The process in ``pids`` at index ``slot``: ``_slot`` undone."""
    cases = " ".join(f"WHEN {i} THEN {value}" for i, value in enumerate(pids))
    return f"CASE {slot} {cases} END" if pids else "NULL"


def _group_kernels_by_sorting(
    export: Export, name: str, pid: str, launch: _LaunchJoin | None, parameters: dict[str, int]
) -> None:
    """``KERNEL_GROUPS`` by ``GROUP BY``, where a row falls outside the packed key's bounds."""
    connection = export.connection
    connection.execute(f"DROP TABLE IF EXISTS {KERNEL_GROUPS}")
    calls, ns = (f"sum({launch.calls})", f"sum({launch.ns})") if launch else ("0", "0")
    connection.execute(
        f"""CREATE TABLE {KERNEL_GROUPS} AS
            SELECT k.deviceId AS device, {pid} AS pid, k.{name} AS name_id,
                   {_duration_columns("k")}, sum(k.end - k.start < :short) AS short,
                   {calls} AS launches, {ns} AS launch_ns
            FROM {schema.KERNEL} AS k {launch.join if launch else ""}
            WHERE {_timed("k")}
            GROUP BY 1, 2, 3""",
        parameters,
    )


def memory_groups(export: Export) -> list[MemoryGroup]:
    parts = []
    if export.has(schema.MEMCPY):
        kinds = [
            column for column in ("srcKind", "dstKind") if export.has_column(schema.MEMCPY, column)
        ]
        pageable = " OR ".join(f"m.{column} = {schema.PAGEABLE_MEMORY}" for column in kinds) or "0"
        parts.append(
            f"""SELECT m.deviceId, {_pid_column(export, schema.MEMCPY, "m")}, m.copyKind,
                       ({pageable}) AS pageable, {_duration_columns("m")}, sum(m.bytes)
                FROM {schema.MEMCPY} AS m WHERE {_timed("m")} GROUP BY 1, 2, 3, 4"""
        )
    if export.has(schema.MEMSET):
        parts.append(
            f"""SELECT m.deviceId, {_pid_column(export, schema.MEMSET, "m")}, NULL, 0,
                       {_duration_columns("m")}, sum(m.bytes)
                FROM {schema.MEMSET} AS m WHERE {_timed("m")} GROUP BY 1, 2"""
        )
    groups = []
    for part in parts:
        for row in export.connection.execute(part):
            kind = (
                schema.MEMSET_KIND
                if row[2] is None
                else schema.MEMCPY_KINDS.get(_int(row[2]), f"kind {row[2]}")
            )
            groups.append(
                MemoryGroup(
                    device=_int(row[0]),
                    pid=_pid(row[1]),
                    kind=kind,
                    pageable=bool(row[3]),
                    durations=_durations(row[4:11]),
                    bytes=_int(row[11]),
                )
            )
    return groups


def api_groups(export: Export, callers: Callers | None) -> list[ApiGroup]:
    """CUDA API calls per (process, function), keyed exactly by the process's slot among
    ``callers`` and the 32-bit name id (``grouping``), by ``GROUP BY`` beyond those bounds."""
    if callers is None:
        return []
    pids = callers.processes
    name_id = f"CASE WHEN r.nameId BETWEEN 0 AND {_ID_MAX} THEN r.nameId END"
    key = f"coalesce({grouping.packed_key((_slot(_CALLER, pids or []), 32), (name_id, 32))}, 0.5)"
    source = f"FROM {schema.RUNTIME} AS r WHERE {_timed('r')} AND {_call(export, 'r')}"
    columns = _duration_aggregates("r", span=False)
    if pids is not None and grouping.aggregate(
        export, table=API_GROUPS, key=key, columns=columns, source=source
    ):
        pid, name = _process_of_slot("g.key >> 32", pids), f"g.key & {_ID_MAX}"
    else:
        pid, name = "g.pid", "g.name_id"
        export.connection.execute(f"DROP TABLE IF EXISTS {API_GROUPS}")
        export.connection.execute(
            f"""CREATE TABLE {API_GROUPS} AS
                SELECT {_CALLER} AS pid, r.nameId AS name_id, {_duration_columns("r")}
                {source} GROUP BY 1, 2"""
        )
    sql = f"""
        SELECT {pid}, coalesce(s.value, 'function #' || {name}), {_DURATIONS_WITHOUT_SPAN}
        FROM {API_GROUPS} AS g LEFT JOIN {schema.STRINGS} AS s ON s.id = {name}
    """
    return [
        ApiGroup(pid=_pid(row[0]), name=str(row[1]), durations=_durations(row[2:9]))
        for row in export.connection.execute(sql)
    ]


def _activity(export: Export) -> str:
    """Every timed GPU interval as (key, end key) with the device in the key's high bits."""
    return " UNION ALL ".join(
        f"SELECT a.deviceId * {DEVICE_STRIDE_NS} + (a.start - :origin) AS k, "
        f"a.deviceId * {DEVICE_STRIDE_NS} + (a.end - :origin) AS e "
        f"FROM {table} AS a WHERE a.end > a.start AND NOT (a.start = 0 AND a.end = 0)"
        for table in schema.GPU_ACTIVITY_TABLES
        if export.has(table)
    )


def build_gaps(export: Export, origin: int) -> None:
    """Fill ``GAP_TABLE`` with every idle gap: key = device stride + gap start, and length.

    Rows are ordered by key; ``busy_until`` is the latest end among the rows before. A row that
    starts after it begins a busy stretch, and the gap before it runs from ``busy_until``. A
    device's first row sees only other devices' (smaller) keys and opens no gap.
    """
    connection = export.connection
    connection.execute(f"DROP TABLE IF EXISTS {GAP_TABLE}")
    connection.execute(f"CREATE TABLE {GAP_TABLE} (k INTEGER PRIMARY KEY, length INTEGER)")
    activity = _activity(export)
    if not activity:
        return
    connection.execute(
        f"""
        INSERT INTO {GAP_TABLE} (k, length)
        SELECT busy_until, k - busy_until FROM (
            SELECT k, max(e) OVER (
                ORDER BY k ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
            ) AS busy_until
            FROM ({activity})
        )
        WHERE k > busy_until AND busy_until >= (k / {DEVICE_STRIDE_NS}) * {DEVICE_STRIDE_NS}
        """,
        {"origin": origin},
    )


def _device_range(device: int) -> dict[str, int]:
    low = device * DEVICE_STRIDE_NS
    return {"low": low, "high": low + DEVICE_STRIDE_NS}


def gap_totals(export: Export, device: int, large_ns: int) -> GapTotals:
    row = export.connection.execute(
        f"""SELECT count(*), coalesce(sum(length), 0), coalesce(max(length), 0),
                   count(*) FILTER (WHERE length >= :large),
                   coalesce(sum(length) FILTER (WHERE length >= :large), 0)
            FROM {GAP_TABLE} WHERE k >= :low AND k < :high""",
        {**_device_range(device), "large": large_ns},
    ).fetchone()
    return GapTotals(*(_int(value) for value in row))


def longest_gaps(export: Export, device: int, origin: int, limit: int) -> list[tuple[int, int]]:
    """(start on the report's timeline, length) of the ``limit`` longest gaps, longest first."""
    rows = export.connection.execute(
        f"""SELECT k - :low + :origin, length FROM {GAP_TABLE}
            WHERE k >= :low AND k < :high ORDER BY length DESC, k LIMIT :limit""",
        {**_device_range(device), "origin": origin, "limit": limit},
    )
    return [(_int(start), _int(length)) for start, length in rows]


def build_sync_calls(export: Export, origin: int, names: Iterable[str]) -> None:
    """Fill ``SYNC_TABLE`` with the calls to ``names`` (any ``_vNNNN`` version suffix)."""
    connection = export.connection
    connection.execute(f"DROP TABLE IF EXISTS {SYNC_TABLE}")
    connection.execute(f"CREATE TABLE {SYNC_TABLE} (pid INTEGER, start INTEGER, end INTEGER)")
    if not export.has(schema.RUNTIME):
        return
    names = sorted(names)
    match = " OR ".join(
        ["value IN ({})".format(",".join("?" * len(names)))] + ["value GLOB ?" for _ in names]
    )
    connection.execute(
        f"""INSERT INTO {SYNC_TABLE}
            SELECT {_CALLER}, r.start - ?, r.end - ?
            FROM {schema.RUNTIME} AS r
            WHERE {_timed("r")} AND {_call(export, "r")}
                  AND r.nameId IN (SELECT id FROM {schema.STRINGS} WHERE {match})""",
        [origin, origin, *names, *(f"{name}_v[0-9]*" for name in names)],
    )


def gaps_during_sync(
    export: Export, device: int, pids: Sequence[int | None], below_ns: int, slack_ns: int
) -> tuple[int, int]:
    """Count and total of gaps shorter than ``below_ns`` that began while a process of this
    GPU was blocked in a synchronising call (up to ``slack_ns`` after the call returned).

    CROSS JOIN keeps the calls outside: each is one key range of the gap table (the planner,
    without statistics on temp tables, would otherwise scan every gap for every call).
    """
    known = [pid for pid in pids if pid is not None]
    process = f"s.pid IN ({','.join('?' * len(known))}) AND" if known and None not in pids else ""
    low = device * DEVICE_STRIDE_NS
    row = export.connection.execute(
        f"""SELECT count(*), coalesce(sum(length), 0) FROM (
                SELECT DISTINCT g.k, g.length FROM {SYNC_TABLE} AS s
                CROSS JOIN {GAP_TABLE} AS g ON g.k BETWEEN ? + s.start AND ? + s.end + ?
                WHERE {process} g.length < ?
            )""",
        [low, low, slack_ns, *(known if process else []), below_ns],
    ).fetchone()
    return _int(row[0]), _int(row[1])


def idle_by_bin(export: Export, device: int, first: int, width_ns: int, bins: int) -> list[int]:
    """Idle nanoseconds in each of ``bins`` bins of ``width_ns`` from ``first`` (ns after the
    origin): the GPU's busy fraction per bin (a utilisation signal) follows exactly.

    Gaps never overlap, so a bin's idle time is that of the gaps starting in it (cut at its end)
    plus the part inside it of the one gap before it, if that gap runs into it. Each bin is a
    key range of the gap table and one lookup of the gap before it: no pass sorts the gaps.
    """
    low = device * DEVICE_STRIDE_NS + first
    rows = export.connection.execute(
        f"""WITH RECURSIVE bin (b, lo, hi) AS (
                SELECT 0, :low, :low + :width
                UNION ALL SELECT b + 1, hi, hi + :width FROM bin WHERE b + 1 < :bins
            )
            SELECT coalesce((SELECT sum(min(g.length, bin.hi - g.k)) FROM {GAP_TABLE} AS g
                             WHERE g.k >= bin.lo AND g.k < bin.hi), 0)
                 + coalesce((SELECT max(min(g.k + g.length, bin.hi) - bin.lo, 0)
                             FROM {GAP_TABLE} AS g WHERE g.k < bin.lo AND g.k >= :device
                             ORDER BY g.k DESC LIMIT 1), 0)
            FROM bin""",
        {"low": low, "width": width_ns, "bins": bins, "device": device * DEVICE_STRIDE_NS},
    )
    return [_int(idle) for (idle,) in rows]


def _nvtx_text(export: Export, alias: str) -> tuple[str, str] | None:
    """(name expression, join) of NVTX event ``alias``'s text, inline or registered."""
    has_text = export.has_column(schema.NVTX, "text")
    has_id = export.has_column(schema.NVTX, "textId") and export.has(schema.STRINGS)
    strings = f"{alias}_text"
    join = f"LEFT JOIN {schema.STRINGS} AS {strings} ON {strings}.id = {alias}.textId"
    if has_text and has_id:
        return f"coalesce({alias}.text, {strings}.value)", join
    if has_id:
        return f"{strings}.value", join
    if has_text:
        return f"{alias}.text", ""
    return None


def _nvtx_ranges(export: Export, *, user_only: bool) -> str:
    """NVTX ranges (name, start, length, thread); ``user_only``: not those of the domains of
    ``schema.LIBRARY_NVTX_DOMAINS`` or named as ``schema.LIBRARY_NVTX_RANGES`` (each range a
    library call)."""
    text = _nvtx_text(export, "e") if export.has(schema.NVTX) else None
    if text is None:
        return ""
    name, join = text
    thread = "e.globalTid" if export.has_column(schema.NVTX, "globalTid") else "NULL"
    types = ",".join(str(value) for value in schema.NVTX_RANGE_TYPES)
    not_library = ""
    if user_only:
        calls = " OR ".join(f"{name} GLOB '{pattern}'" for pattern in schema.LIBRARY_NVTX_RANGES)
        not_library = f" AND NOT ({calls})"
    if user_only and export.has_column(schema.NVTX, "domainId"):
        domain_name, domain_join = _nvtx_text(export, "d") or ("NULL", "")
        libraries = ",".join(f"'{domain}'" for domain in schema.LIBRARY_NVTX_DOMAINS)
        not_library += (
            f" AND coalesce(e.domainId, 0) NOT IN (SELECT d.domainId FROM {schema.NVTX} AS d "
            f"{domain_join} WHERE d.eventType = {schema.NVTX_DOMAIN_CREATE} "
            f"AND d.domainId IS NOT NULL AND {domain_name} IN ({libraries}))"
        )
    return (
        f"SELECT {name} AS name, e.start AS start, e.end - e.start AS length, {thread} AS thread "
        f"FROM {schema.NVTX} AS e {join} "
        f"WHERE e.eventType IN ({types}) AND e.end > e.start{not_library}"
    )


def nvtx_names(
    export: Export, min_count: int, *, user_only: bool = True
) -> list[tuple[str, int, int, int]]:
    """(name, ranges, total ns, threads) of range names seen at least ``min_count`` times."""
    ranges = _nvtx_ranges(export, user_only=user_only)
    if not ranges:
        return []
    rows = export.connection.execute(
        f"""SELECT name, count(*), sum(length), count(DISTINCT thread) FROM ({ranges})
            WHERE name IS NOT NULL GROUP BY name HAVING count(*) >= ?""",
        (min_count,),
    )
    return [
        (str(name), _int(count), _int(total), max(1, _int(threads)))
        for name, count, total, threads in rows
    ]


def nvtx_spacings(export: Export, name: str, *, user_only: bool = True) -> list[int]:
    """Start-to-start spacing of consecutive ``name`` ranges on each thread."""
    ranges = _nvtx_ranges(export, user_only=user_only)
    if not ranges:
        return []
    rows = export.connection.execute(
        f"""SELECT spacing FROM (
                SELECT start - lag(start) OVER (PARTITION BY thread ORDER BY start) AS spacing
                FROM ({ranges}) WHERE name = ?
            ) WHERE spacing IS NOT NULL""",
        (name,),
    )
    return [_int(spacing) for (spacing,) in rows]


def session_start_utc_ns(export: Export) -> int | None:
    if not export.has_column(schema.SESSION_START, "utcEpochNs"):
        return None
    row = export.connection.execute(
        f"SELECT utcEpochNs FROM {schema.SESSION_START} LIMIT 1"
    ).fetchone()
    return _int(row[0]) if row and row[0] else None


@dataclass(frozen=True)
class GpuNames:
    """Device id -> (name, UUID); ``shared``: device ids that stand for different GPUs in
    different processes (each set its own ``CUDA_VISIBLE_DEVICES``), so their figures merge."""

    by_device: dict[int, tuple[str | None, str | None]]
    shared: list[int]


def gpu_names(export: Export) -> GpuNames:
    """The GPU behind each device id the activity tables carry (a CUDA device id).

    TARGET_INFO_GPU's own ``id`` is not that id (on a real four-GPU node, CUDA device 0 was
    id 3): TARGET_INFO_CUDA_DEVICE maps each process's CUDA device to a GPU id, as Nsight
    Systems' own reports join; without it, TARGET_INFO_GPU's ``cuDevice`` is the CUDA device;
    without that, ``id`` is taken for it.
    """
    if not export.has_column(schema.GPUS, "id"):
        return GpuNames({}, [])
    name = "g.name" if export.has_column(schema.GPUS, "name") else "NULL"
    uuid = "g.uuid" if export.has_column(schema.GPUS, "uuid") else "NULL"
    if (
        export.has_column(schema.CUDA_DEVICES, "gpuId")
        and export.connection.execute(f"SELECT 1 FROM {schema.CUDA_DEVICES} LIMIT 1").fetchone()
    ):
        sql = f"""SELECT d.cudaId, count(DISTINCT d.gpuId), min({name}), max({name}), min({uuid})
                  FROM {schema.CUDA_DEVICES} AS d LEFT JOIN {schema.GPUS} AS g ON g.id = d.gpuId
                  GROUP BY d.cudaId"""
    else:
        cuda = "g.cuDevice" if export.has_column(schema.GPUS, "cuDevice") else "NULL"
        (any_cuda,) = export.connection.execute(
            f"SELECT count({cuda}) FROM {schema.GPUS} AS g"
        ).fetchone()
        device = cuda if any_cuda else "g.id"
        sql = f"""SELECT {device}, 1, {name}, {name}, {uuid} FROM {schema.GPUS} AS g
                  WHERE {device} IS NOT NULL"""
    by_device: dict[int, tuple[str | None, str | None]] = {}
    shared = []
    for device, gpus, low, high, ident in export.connection.execute(sql):
        if gpus > 1:  # one id, several GPUs: a name only if they share it, no UUID
            shared.append(_int(device))
        named = str(low) if low and low == high else None
        by_device[_int(device)] = (named, str(ident) if ident and gpus == 1 else None)
    return GpuNames(by_device, sorted(shared))
