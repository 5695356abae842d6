"""The report's events grouped as ``nsys stats`` lists them, with numpy (``grouping``):

- ``kernel_groups``: kernels per (device, process, name) with the figures of ``nsys stats``'
  ``cuda_gpu_kern_sum``, each joined to the CUDA API calls that launched it (same
  ``correlationId`` in the same process) for launch counts and launch API time; kernels of a
  CUDA graph share one graph launch call, counted by name instead (``Kernels.correlation``).
- ``memory_groups``: copies per (device, process, copy kind, pageable host memory or not), and
  memsets.
- ``api_groups``: timed CUDA API calls per (process, function).

The launch join sums the calls per (process, correlationId) once, into a table indexed by the
pair's code when the ids are dense (CUPTI numbers them from 1), else into a sorted array
searched by each kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from profiler_app.trace import schema
from profiler_app.trace.columns import MISSING
from profiler_app.trace.events import MEMSET_KIND, Calls, Kernels, Memory
from profiler_app.trace.grouping import Durations, IntArray, combine, durations, factorise, sums

_CORRELATION_BITS = 32  # CUPTI's ids are unsigned 32-bit: used as codes as they are
# A launch table indexed by key is built when no larger than this, or 4 entries per row.
_DENSE_KEYS = 1 << 16


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
    name_id: int
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
    name_id: int
    durations: DurationStats


def _stats(d: Durations, group: int) -> DurationStats:
    return DurationStats(
        count=int(d.count[group]),
        total_ns=int(d.total[group]),
        min_ns=int(d.low[group]),
        max_ns=int(d.high[group]),
        sum_squares=float(d.squares[group]),
        first_start=int(d.first[group]),
        last_end=int(d.last[group]),
    )


def _pid(value: int) -> int | None:
    return None if value == MISSING else int(value)


def kernel_groups(
    kernels: Kernels, calls: Calls | None, short_ns: int, *, same_process: bool
) -> list[KernelGroup]:
    """``same_process``: the kernel table names each kernel's process, and a launch call must
    come from it (else any process's call with the kernel's correlationId counts)."""
    if not len(kernels):
        return []
    codes, (device, pid, name) = combine(kernels.device, kernels.pid, kernels.name)
    count = len(device)
    length = kernels.end - kernels.start
    stats = durations(codes, count, kernels.start, kernels.end, length)
    short = np.bincount(codes[length < short_ns], minlength=count)
    launch_calls, launch_ns = _launches(kernels, calls, same_process=same_process)
    launches = sums(codes, count, launch_calls)
    launch_time = sums(codes, count, launch_ns)
    return [
        KernelGroup(
            device=int(device[g]),
            pid=_pid(pid[g]),
            name_id=int(name[g]),
            durations=_stats(stats, g),
            short_count=int(short[g]),
            launches=int(launches[g]),
            launch_ns=int(launch_time[g]),
        )
        for g in range(count)
    ]


def _launches(
    kernels: Kernels, calls: Calls | None, *, same_process: bool
) -> tuple[IntArray, IntArray]:
    """Per kernel: the calls sharing its (process, correlationId), and their summed time."""
    size = len(kernels)
    found, found_ns = np.zeros(size, np.int64), np.zeros(size, np.int64)
    if calls is None or not size:
        return found, found_ns
    kernel_ok = kernels.correlation != MISSING
    call_ok = calls.correlation != MISSING
    if same_process:
        kernel_ok &= kernels.pid != MISSING
        call_ok &= calls.pid != MISSING
    kernel_rows, call_rows = np.flatnonzero(kernel_ok), np.flatnonzero(call_ok)
    if not kernel_rows.size or not call_rows.size:
        return found, found_ns
    both = np.concatenate([kernels.correlation[kernel_rows], calls.correlation[call_rows]])
    low, high = int(both.min()), int(both.max())
    if low >= 0 and high < 1 << _CORRELATION_BITS:
        correlation, radix = both, high + 1
    else:
        correlation, uniques = factorise(both)
        radix = len(uniques)
    if same_process:
        pids = np.concatenate([kernels.pid[kernel_rows], calls.pid[call_rows]])
        process, _ = factorise(pids)
        key = process * radix + correlation
    else:
        key = correlation
    kernel_key, call_key = key[: kernel_rows.size], key[kernel_rows.size :]
    call_ns = (calls.end - calls.start)[call_rows]
    keys = int(key.max()) + 1
    if keys <= max(_DENSE_KEYS, 4 * key.size):
        per_key = np.bincount(call_key, minlength=keys).astype(np.int64)
        ns_per_key = sums(call_key, keys, call_ns)
        found[kernel_rows] = per_key[kernel_key]
        found_ns[kernel_rows] = ns_per_key[kernel_key]
        return found, found_ns
    codes, uniques = factorise(call_key)
    per_key = np.bincount(codes, minlength=uniques.size).astype(np.int64)
    ns_per_key = sums(codes, uniques.size, call_ns)
    where = np.minimum(np.searchsorted(uniques, kernel_key), uniques.size - 1)
    matched = uniques[where] == kernel_key
    found[kernel_rows[matched]] = per_key[where[matched]]
    found_ns[kernel_rows[matched]] = ns_per_key[where[matched]]
    return found, found_ns


def memory_groups(memory: Memory) -> list[MemoryGroup]:
    if not len(memory):
        return []
    pageable = memory.pageable.astype(np.int64)
    codes, (device, pid, kind, paged) = combine(memory.device, memory.pid, memory.kind, pageable)
    count = len(device)
    stats = durations(codes, count, memory.start, memory.end)
    size = sums(codes, count, memory.bytes)
    return [
        MemoryGroup(
            device=int(device[g]),
            pid=_pid(pid[g]),
            kind=schema.MEMSET_KIND
            if kind[g] == MEMSET_KIND
            else schema.MEMCPY_KINDS.get(int(kind[g]), f"kind {kind[g]}"),
            pageable=bool(paged[g]),
            durations=_stats(stats, g),
            bytes=int(size[g]),
        )
        for g in range(count)
    ]


def api_groups(calls: Calls | None) -> list[ApiGroup]:
    if calls is None or not calls.timed.any():
        return []
    timed = calls.timed
    codes, (pid, name) = combine(calls.pid[timed], calls.name[timed])
    count = len(pid)
    stats = durations(codes, count, calls.start[timed], calls.end[timed])
    return [
        ApiGroup(pid=_pid(pid[g]), name_id=int(name[g]), durations=_stats(stats, g))
        for g in range(count)
    ]
