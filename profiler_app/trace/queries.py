"""The SQL for what is not one row per event: names, NVTX ranges, the capture start, the GPUs.

- ``strings``: the ``StringIds`` text of the ids the groups name; ``string_ids``: the ids of CUDA
  API functions by name (any ``_vNNNN`` version suffix).
- ``nvtx_names`` and ``nvtx_spacings``: NVTX ranges by name, and the start-to-start spacing of
  one name's ranges on each thread; by default not the ranges of communication libraries (their
  NVTX domains or names, ``schema.LIBRARY_NVTX_*``: each an MPI or NCCL call, not a step).
- ``session_start_utc_ns`` and ``gpu_names``: the capture's start and the GPU behind each
  device id.

Events themselves (kernels, copies, memsets, CUDA API calls) are read in bulk and reduced with
numpy: ``events``, ``groups``, ``timeline``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from profiler_app.trace import schema
from profiler_app.trace.export import Export


def _int(value: object) -> int:
    """An integer read back from SQLite; anything else (NULL, a real out of range, text) 0."""
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and abs(value) < 2**63:
        return int(value)
    return 0


def strings(export: Export, ids: Iterable[int]) -> dict[int, str]:
    """The ``StringIds`` text of ``ids`` (those it holds)."""
    wanted = sorted(set(ids))
    found: dict[int, str] = {}
    for first in range(0, len(wanted), 500):  # SQLite's limit on bound parameters
        chunk = wanted[first : first + 500]
        rows = export.connection.execute(
            f"SELECT id, value FROM {schema.STRINGS} WHERE id IN ({','.join('?' * len(chunk))})",
            chunk,
        )
        found.update((int(i), str(value)) for i, value in rows if isinstance(i, int))
    return found


def string_ids(export: Export, names: Iterable[str]) -> list[int]:
    """The ``StringIds`` ids of ``names``, each also with any ``_vNNNN`` version suffix."""
    names = sorted(names)
    if not names:
        return []
    match = " OR ".join(
        ["value IN ({})".format(",".join("?" * len(names)))] + ["value GLOB ?" for _ in names]
    )
    rows = export.connection.execute(
        f"SELECT id FROM {schema.STRINGS} WHERE {match}",
        [*names, *(f"{name}_v[0-9]*" for name in names)],
    )
    return [i for (i,) in rows if isinstance(i, int)]


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
        f"WHERE e.eventType IN ({types}) AND typeof(e.start) = 'integer' "
        f"AND typeof(e.end) = 'integer' AND e.end > e.start{not_library}"
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
    value = row[0] if row else None
    return value if isinstance(value, int) and value > 0 else None  # else unknown


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
