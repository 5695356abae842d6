"""Nsight Systems SQLite exports built in the tests (test doubles: no GPU or nsys exists here).

A ``ReportBuilder`` writes a file with the tables, columns and enum values of a real
``nsys export --type sqlite`` report. The schema is the one NVIDIA documents and ships:

- table and column definitions as exported by Nsight Systems 2024.6.2 (export schema 3.16.1),
  the version whose ``.schema`` the statements below reproduce (columns this tool does not read
  are kept, so a query that relies on column order or ``SELECT *`` would notice);
- enum values from the Nsight Systems Post-Collection Analysis Guide, "SQLite Schema Event
  Values" (docs.nvidia.com/nsight-systems/AnalysisGuide): ``ENUM_CUDA_MEMCPY_OPER`` 0-13
  (1 = HtoD, 2 = DtoH, 8 = DtoD, ...), ``ENUM_CUDA_MEM_KIND`` 0-7 (0 = pageable, 1 = pinned),
  NVTX event types 59 (push/pop range) and 60 (start/end range);
- CUDA API names as the export stores them, with their ``_vNNNN`` suffix
  (``cudaLaunchKernel_v7000``); ``globalTid``/``globalPid`` serialised as
  ``(pid << 24) | tid`` (hardware and VM ids 0), so ``globalTid & ~0xFFFFFF`` is the process;
- NCCL kernels (``add_collectives``) named and launched as a real PyTorch capture on two H100s
  shows them (Nsight Systems 2026.2, public test data of the nsys-ai project);
- shapes seen in real exports (Nsight Systems 2022.2 and 2024.5, public test data of the pipit
  project): the metadata table's older name ``EXPORT_META_DATA`` (schema 2.9.1), CUDA
  backtrace rows (``add_cuda_backtraces``), NVTX ranges in a named domain, such as the
  ``MPI`` domain of Nsight Systems' MPI trace (``add_ranges(domain=...)``), and GPUs whose
  ``TARGET_INFO_GPU`` id is not their CUDA device id (``cuda_devices``, ``process_devices``).

``tamper`` then alters a written export the way a damaged or hand-made one could be: values
Nsight Systems never writes (NULL or reals where integers belong), with the table's NOT NULL
constraints dropped where needed.

Tables exist only when their data does, as in real exports: ``write`` creates a table only
when rows were added to it (or ``omit`` removes one). Rows are written in a shuffled order
(``shuffle=True``), since exports do not guarantee time order; ``shuffle=False`` keeps the order
they were added in, and ``time_order=True`` sorts them by start (as Nsight Systems appears to
write them). The ``add_*`` methods take numpy
arrays (or scalars), so benchmark-sized reports (a million kernels) are built in seconds; NOT
NULL columns the tests do not vary get the constants in ``CONSTANTS``.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

SCHEMA_VERSION = "3.16.1"
PRODUCT_VERSION = "2024.6.2.225"
PID = 4242
GLOBAL_PID = PID << 24

HTOD, DTOH, DTOD, PTOP = 1, 2, 8, 10
PAGEABLE, PINNED, DEVICE = 0, 1, 2
NVTX_PUSH_POP, NVTX_START_END = 59, 60
NVTX_DOMAIN_CREATE = 75
CUDA_RUNTIME, CUDA_BACKTRACE = 0, 67  # ENUM_NSYS_EVENT_CLASS
# NCCL kernels as Nsight Systems names them: SendRecv as a real PyTorch capture on two H100s
# shows it (the nsys-ai project's export), AllReduce as public profiles of NCCL 2.19 and later
# show it, and the ncclKernel_ names of older NCCL releases (in an `nsys stats` table).
NCCL_SEND_RECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<(unsigned long)4096>)"
NCCL_ALL_REDUCE = (
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)"
)
NCCL_OLD_ALL_REDUCE = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm *, ncclWorkElem)"
NCCL_LAUNCH = "cuLaunchKernelEx"  # how the real capture's NCCL kernels were launched

MEMCPY_KINDS = [
    (0, "CUDA_MEMCPY_KIND_UNKNOWN", "Unknown"),
    (1, "CUDA_MEMCPY_KIND_HTOD", "Host-to-Device"),
    (2, "CUDA_MEMCPY_KIND_DTOH", "Device-to-Host"),
    (3, "CUDA_MEMCPY_KIND_HTOA", "Host-to-Array"),
    (4, "CUDA_MEMCPY_KIND_ATOH", "Array-to-Host"),
    (5, "CUDA_MEMCPY_KIND_ATOA", "Array-to-Array"),
    (6, "CUDA_MEMCPY_KIND_ATOD", "Array-to-Device"),
    (7, "CUDA_MEMCPY_KIND_DTOA", "Device-to-Array"),
    (8, "CUDA_MEMCPY_KIND_DTOD", "Device-to-Device"),
    (9, "CUDA_MEMCPY_KIND_HTOH", "Host-to-Host"),
    (10, "CUDA_MEMCPY_KIND_PTOP", "Peer-to-Peer"),
    (11, "CUDA_MEMCPY_KIND_UVM_HTOD", "Unified Host-to-Device"),
    (12, "CUDA_MEMCPY_KIND_UVM_DTOH", "Unified Device-to-Host"),
    (13, "CUDA_MEMCPY_KIND_UVM_DTOD", "Unified Device-to-Device"),
]
MEMORY_KINDS = [
    (0, "CUDA_MEMOPR_MEMORY_KIND_PAGEABLE", "Pageable"),
    (1, "CUDA_MEMOPR_MEMORY_KIND_PINNED", "Pinned"),
    (2, "CUDA_MEMOPR_MEMORY_KIND_DEVICE", "Device"),
    (3, "CUDA_MEMOPR_MEMORY_KIND_ARRAY", "Array"),
    (4, "CUDA_MEMOPR_MEMORY_KIND_MANAGED", "Managed"),
    (5, "CUDA_MEMOPR_MEMORY_KIND_DEVICE_STATIC", "Device Static"),
    (6, "CUDA_MEMOPR_MEMORY_KIND_MANAGED_STATIC", "Managed Static"),
    (7, "CUDA_MEMOPR_MEMORY_KIND_UNKNOWN", "Unknown"),
]
NVTX_EVENT_TYPES = [
    (34, "NvtxMark", "NvtxMark"),
    (59, "NvtxPushPopRange", "NvtxPushPopRange"),
    (60, "NvtxStartEndRange", "NvtxStartEndRange"),
]

# CREATE statements as Nsight Systems 2024.6.2 exports them (its help-text comments dropped).
TABLES: dict[str, str] = {
    "StringIds": "id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL",
    "META_DATA_EXPORT": "name TEXT NOT NULL, value TEXT",
    "TARGET_INFO_SESSION_START_TIME": "utcEpochNs INTEGER, utcTime TEXT, localTime TEXT",
    "TARGET_INFO_GPU": (
        "vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT, busLocation TEXT, "
        "isDiscrete INTEGER, l2CacheSize INTEGER, totalMemory INTEGER, memoryBandwidth INTEGER, "
        "clockRate INTEGER, smCount INTEGER, pwGpuId INTEGER, uuid TEXT, luid INTEGER, "
        "chipName TEXT, cuDevice INTEGER, ctxswDevPath TEXT, ctrlDevPath TEXT, revision INTEGER, "
        "nodeMask INTEGER, constantMemory INTEGER, maxIPC INTEGER, maxRegistersPerBlock INTEGER, "
        "maxShmemPerBlock INTEGER, maxShmemPerBlockOptin INTEGER, maxShmemPerSm INTEGER, "
        "maxRegistersPerSm INTEGER, threadsPerWarp INTEGER, asyncEngines INTEGER, "
        "maxWarpsPerSm INTEGER, maxBlocksPerSm INTEGER, maxThreadsPerBlock INTEGER, "
        "maxBlockDimX INTEGER, maxBlockDimY INTEGER, maxBlockDimZ INTEGER, maxGridDimX INTEGER, "
        "maxGridDimY INTEGER, maxGridDimZ INTEGER, computeMajor INTEGER, computeMinor INTEGER, "
        "smMajor INTEGER, smMinor INTEGER"
    ),
    "TARGET_INFO_CUDA_DEVICE": (
        "gpuId INTEGER, cudaId INTEGER NOT NULL, pid INTEGER NOT NULL, uuid TEXT, "
        "numMultiprocessors INTEGER"
    ),
    "CUPTI_ACTIVITY_KIND_KERNEL": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
        "contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, "
        "correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL, "
        "shortName INTEGER NOT NULL, mangledName INTEGER, launchType INTEGER, "
        "cacheConfig INTEGER, registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL, "
        "gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL, "
        "blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL, staticSharedMemory INTEGER NOT NULL, "
        "dynamicSharedMemory INTEGER NOT NULL, localMemoryPerThread INTEGER NOT NULL, "
        "localMemoryTotal INTEGER NOT NULL, gridId INTEGER NOT NULL, "
        "sharedMemoryExecuted INTEGER, graphNodeId INTEGER, sharedMemoryLimitConfig INTEGER"
    ),
    "CUPTI_ACTIVITY_KIND_MEMCPY": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
        "contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, "
        "correlationId INTEGER, globalPid INTEGER, bytes INTEGER NOT NULL, "
        "copyKind INTEGER NOT NULL, deprecatedSrcId INTEGER, srcKind INTEGER, dstKind INTEGER, "
        "srcDeviceId INTEGER, srcContextId INTEGER, dstDeviceId INTEGER, dstContextId INTEGER, "
        "migrationCause INTEGER, graphNodeId INTEGER, virtualAddress INTEGER"
    ),
    "CUPTI_ACTIVITY_KIND_MEMSET": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
        "contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, "
        "correlationId INTEGER, globalPid INTEGER, value INTEGER NOT NULL, "
        "bytes INTEGER NOT NULL, graphNodeId INTEGER, memKind INTEGER"
    ),
    "CUPTI_ACTIVITY_KIND_RUNTIME": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL, "
        "globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, "
        "returnValue INTEGER NOT NULL, callchainId INTEGER"
    ),
    "NVTX_EVENTS": (
        "start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, "
        "category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, "
        "textId INTEGER, domainId INTEGER, uint64Value INTEGER, int64Value INTEGER, "
        "doubleValue REAL, uint32Value INTEGER, int32Value INTEGER, floatValue REAL, "
        "jsonTextId INTEGER, jsonText TEXT, binaryData TEXT"
    ),
    "ENUM_CUDA_MEMCPY_OPER": "id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT",
    "ENUM_CUDA_MEM_KIND": "id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT",
    "ENUM_NSYS_EVENT_TYPE": "id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT",
}
# Written whether or not rows were added, as every real export has them.
ALWAYS = ("StringIds", "META_DATA_EXPORT", "ENUM_CUDA_MEMCPY_OPER", "ENUM_CUDA_MEM_KIND")
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
NVTX = "NVTX_EVENTS"
# NOT NULL columns (and a few informative ones) the builder writes the same value into.
CONSTANTS: dict[str, dict[str, Any]] = {
    KERNEL: {
        "contextId": 1,
        "launchType": 1,
        "cacheConfig": 0,
        "registersPerThread": 32,
        "gridX": 128,
        "gridY": 1,
        "gridZ": 1,
        "blockX": 256,
        "blockY": 1,
        "blockZ": 1,
        "staticSharedMemory": 0,
        "dynamicSharedMemory": 0,
        "localMemoryPerThread": 0,
        "localMemoryTotal": 0,
    },
    MEMCPY: {"contextId": 1},
    MEMSET: {"contextId": 1, "value": 0, "memKind": DEVICE},
    RUNTIME: {"eventClass": CUDA_RUNTIME, "returnValue": 0},
    NVTX: {},
}

IntArray = npt.NDArray[np.int64]


def _base_name(name: str) -> str:
    """``void at::foo<float>(int)`` -> ``at::foo``: what nsys stores as ``shortName``."""
    return re.split(r"[<(]", name.removeprefix("void "), maxsplit=1)[0]


def _column(values: Any, size: int) -> npt.NDArray[Any]:
    array = np.asarray(values)
    return np.broadcast_to(array, (size,)) if array.ndim == 0 else array


@dataclass
class ReportBuilder:
    """An export under construction; times are nanoseconds on the report's timeline."""

    schema_version: str | None = SCHEMA_VERSION
    session_start_utc_ns: int | None = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
    # TARGET_INFO_GPU: id -> name; ``cuda_devices``: id -> its cuDevice (unset: NULL, as in
    # tests that need not tell them apart); ``process_devices``: TARGET_INFO_CUDA_DEVICE rows
    # (pid, CUDA device id, GPU id)
    gpus: dict[int, str] = field(default_factory=lambda: {0: "NVIDIA A100-SXM4-80GB"})
    cuda_devices: dict[int, int] = field(default_factory=dict)
    process_devices: list[tuple[int, int, int]] = field(default_factory=list)
    # table -> batches of rows, each a column name -> array mapping
    batches: dict[str, list[dict[str, npt.NDArray[Any]]]] = field(default_factory=dict)
    strings: dict[str, int] = field(default_factory=dict)
    next_correlation: int = 1
    nvtx_domains: dict[str, int] = field(default_factory=dict)

    def string(self, value: str) -> int:
        """The StringIds id of ``value``, added on first use."""
        return self.strings.setdefault(value, len(self.strings) + 1)

    def correlation_ids(self, count: int) -> IntArray:
        first = self.next_correlation
        self.next_correlation += count
        return np.arange(first, first + count, dtype=np.int64)

    def _add(self, table: str, size: int, **columns: Any) -> None:
        values = {**CONSTANTS[table], **columns}
        batch = {name: _column(value, size) for name, value in values.items() if value is not None}
        self.batches.setdefault(table, []).append(batch)

    def _operations(
        self,
        table: str,
        starts: Any,
        durations: Any,
        *,
        device: int,
        stream: int,
        pid: int,
        api: str | None,
        api_ns: Any,
        lead_ns: Any,
        **columns: Any,
    ) -> None:
        """GPU operations in ``table``, each started by an ``api`` call (same correlationId)
        that lasts ``api_ns`` and ends ``lead_ns`` before the operation starts."""
        start = np.asarray(starts, dtype=np.int64)
        size = start.size
        correlation = self.correlation_ids(size)
        self._add(
            table,
            size,
            start=start,
            end=start + _column(durations, size),
            deviceId=device,
            streamId=stream,
            correlationId=correlation,
            globalPid=pid << 24,
            **columns,
        )
        if api is not None:
            api_end = start - _column(lead_ns, size)
            self.add_api_calls(api, api_end - _column(api_ns, size), api_end, correlation, pid=pid)

    def add_kernels(
        self,
        name: str,
        starts: Any,
        durations: Any,
        *,
        device: int = 0,
        stream: int = 7,
        launch: str | None = "cudaLaunchKernel_v7000",
        launch_ns: Any = 4_000,
        launch_lead_ns: Any = 2_000,
        pid: int = PID,
    ) -> None:
        """Kernels named ``name``, each launched by a ``launch`` call that lasts ``launch_ns``
        and ends ``launch_lead_ns`` before the kernel starts, from process ``pid``."""
        self._operations(
            KERNEL,
            starts,
            durations,
            device=device,
            stream=stream,
            pid=pid,
            api=launch,
            api_ns=launch_ns,
            lead_ns=launch_lead_ns,
            demangledName=self.string(name),
            shortName=self.string(_base_name(name)),
            gridId=np.arange(np.size(starts)) + 1,
        )

    def add_collectives(
        self,
        name: str,
        starts: Any,
        durations: Any,
        *,
        device: int = 0,
        stream: int = 7,
        pid: int = PID,
    ) -> None:
        """NCCL kernels ``name`` (``NCCL_*``), launched as the real capture's were: by the
        driver's ``cuLaunchKernelEx``, on the compute stream unless ``stream`` says otherwise
        (PyTorch puts collectives on a stream of their own when it overlaps them)."""
        self.add_kernels(
            name, starts, durations, device=device, stream=stream, launch=NCCL_LAUNCH, pid=pid
        )

    def add_graph(
        self,
        names: Sequence[str],
        starts: Any,
        durations: Any,
        *,
        launch_start: int,
        launch_ns: int,
        device: int = 0,
        stream: int = 7,
        pid: int = PID,
    ) -> None:
        """One ``cudaGraphLaunch`` call whose graph runs kernel ``names[i]`` at ``starts[i]``:
        the kernels share the call's correlationId and carry a graphNodeId."""
        start = np.asarray(starts, dtype=np.int64)
        size = start.size
        correlation = self.correlation_ids(1)
        self._add(
            KERNEL,
            size,
            start=start,
            end=start + _column(durations, size),
            deviceId=device,
            streamId=stream,
            correlationId=correlation[0],
            demangledName=np.array([self.string(name) for name in names]),
            shortName=np.array([self.string(_base_name(name)) for name in names]),
            gridId=np.arange(size) + 1,
            graphNodeId=np.arange(size) + 1,
            globalPid=pid << 24,
        )
        self.add_api_calls(
            "cudaGraphLaunch_v10000",
            [launch_start],
            [launch_start + launch_ns],
            correlation,
            pid=pid,
        )

    def add_api_calls(
        self,
        name: str,
        starts: Any,
        ends: Any,
        correlation: Any = None,
        *,
        pid: int = PID,
        thread: int | None = None,
    ) -> None:
        """CUDA API calls to ``name`` as stored, e.g. ``cudaStreamSynchronize_v3020``, from
        thread ``thread`` (default: the main thread, tid = pid) of process ``pid``."""
        start = np.asarray(starts, dtype=np.int64)
        size = start.size
        if correlation is None:
            correlation = self.correlation_ids(size)
        self._add(
            RUNTIME,
            size,
            start=start,
            end=_column(ends, size),
            globalTid=(pid << 24) | (pid if thread is None else thread),
            correlationId=correlation,
            nameId=self.string(name),
        )

    def add_cuda_backtraces(self, before_ns: int = 340, after_ns: int = 70) -> None:
        """A CUDA backtrace row around every CUDA API call added so far, as ``nsys profile
        --cudabacktrace`` writes them: event class 67, the call's correlationId and thread, its
        name without the version suffix, from ``before_ns`` before it to ``after_ns`` after."""
        names = {i: value for value, i in self.strings.items()}
        for batch in list(self.batches.get(RUNTIME, [])):
            size = batch["start"].size
            self._add(
                RUNTIME,
                size,
                start=batch["start"] - before_ns,
                end=batch["end"] + after_ns,
                eventClass=CUDA_BACKTRACE,
                globalTid=batch["globalTid"],
                correlationId=batch["correlationId"],
                nameId=np.array(
                    [self.string(re.sub(r"_v\d+$", "", names[int(i)])) for i in batch["nameId"]]
                ),
            )

    def add_copies(
        self,
        kind: int,
        starts: Any,
        durations: Any,
        sizes: Any,
        *,
        device: int = 0,
        stream: int = 8,
        host_kind: int = PINNED,
        api: str | None = "cudaMemcpyAsync_v3020",
        api_ns: Any = 5_000,
    ) -> None:
        """Memory copies of ``kind`` (``HTOD``...) whose host side is ``host_kind`` memory."""
        self._operations(
            MEMCPY,
            starts,
            durations,
            device=device,
            stream=stream,
            pid=PID,
            api=api,
            api_ns=api_ns,
            lead_ns=1_000,
            bytes=_column(sizes, np.size(starts)),
            copyKind=kind,
            srcKind=host_kind if kind in (HTOD, 3, 9, 11) else DEVICE,
            dstKind=host_kind if kind in (DTOH, 4, 9, 12) else DEVICE,
            srcDeviceId=device,
            dstDeviceId=device,
        )

    def add_memsets(
        self,
        starts: Any,
        durations: Any,
        sizes: Any,
        *,
        device: int = 0,
        stream: int = 7,
        api_ns: Any = 4_000,
    ) -> None:
        self._operations(
            MEMSET,
            starts,
            durations,
            device=device,
            stream=stream,
            pid=PID,
            api="cudaMemsetAsync_v3020",
            api_ns=api_ns,
            lead_ns=1_000,
            bytes=_column(sizes, np.size(starts)),
        )

    def add_ranges(
        self,
        text: str,
        starts: Any,
        durations: Any,
        *,
        event_type: int = NVTX_PUSH_POP,
        registered: bool = False,
        pid: int = PID,
        domain: str | None = None,
    ) -> None:
        """NVTX ranges; ``registered`` stores the text through StringIds (``textId``);
        ``domain`` puts them in that NVTX domain (created on first use), else the default."""
        start = np.asarray(starts, dtype=np.int64)
        size = start.size
        self._add(
            NVTX,
            size,
            start=start,
            end=start + _column(durations, size),
            eventType=event_type,
            text=None if registered else np.full(size, text, dtype=object),
            textId=self.string(text) if registered else None,
            globalTid=(pid << 24) | pid,
            domainId=0 if domain is None else self._nvtx_domain(domain, start.min(), pid),
        )

    def _nvtx_domain(self, name: str, before: int, pid: int) -> int:
        """The domainId of NVTX domain ``name``, created (an event of type 75 naming it, as
        the MPI trace writes it) before time ``before`` on first use."""
        if name not in self.nvtx_domains:
            self.nvtx_domains[name] = len(self.nvtx_domains) + 1
            self._add(
                NVTX,
                1,
                start=np.array([max(before - 1, 0)]),
                eventType=NVTX_DOMAIN_CREATE,
                text=np.array([name], dtype=object),
                globalTid=(pid << 24) | pid,
                domainId=self.nvtx_domains[name],
            )
        return self.nvtx_domains[name]

    def write(
        self,
        path: Path,
        *,
        shuffle: bool = True,
        time_order: bool = False,
        omit: Iterable[str] = (),
        metadata: Sequence[tuple[str, str]] | None = None,
        metadata_table: str = "META_DATA_EXPORT",
        seed: int = 12,
    ) -> Path:
        """Write the export to ``path`` (replacing it) and return the path; ``metadata_table``
        ``EXPORT_META_DATA`` is that table's name before export schema 3."""
        path.unlink(missing_ok=True)
        rows: dict[str, list[tuple[Any, ...]]] = {
            "StringIds": [(i, value) for value, i in self.strings.items()],
            "ENUM_CUDA_MEMCPY_OPER": list(MEMCPY_KINDS),
            "ENUM_CUDA_MEM_KIND": list(MEMORY_KINDS),
            "TARGET_INFO_GPU": [
                (
                    0,
                    gpu,
                    name,
                    f"0000:{gpu + 7:02x}:00.0",
                    f"GPU-{gpu:08d}-test-double",
                    self.cuda_devices.get(gpu),
                )
                for gpu, name in self.gpus.items()
            ],
            "TARGET_INFO_CUDA_DEVICE": [
                (gpu, cuda, pid, None, 132) for pid, cuda, gpu in self.process_devices
            ],
        }
        if NVTX in self.batches:
            rows["ENUM_NSYS_EVENT_TYPE"] = list(NVTX_EVENT_TYPES)
        if metadata is None:
            metadata = [("EXPORT_PRODUCT_VERSION", PRODUCT_VERSION)]
            if self.schema_version is not None:
                metadata.append(("EXPORT_SCHEMA_VERSION", self.schema_version))
        rows["META_DATA_EXPORT"] = list(metadata)
        if self.session_start_utc_ns is not None:
            rows["TARGET_INFO_SESSION_START_TIME"] = [(self.session_start_utc_ns, None, None)]
        columns = {
            "TARGET_INFO_GPU": "(vmId, id, name, busLocation, uuid, cuDevice)",
            "TARGET_INFO_SESSION_START_TIME": "(utcEpochNs, utcTime, localTime)",
        }
        rng = np.random.default_rng(seed)
        connection = sqlite3.connect(path)
        try:
            for table, definition in TABLES.items():
                present = bool(rows.get(table)) or table in self.batches
                if table in omit or not (present or table in ALWAYS):
                    continue
                name = metadata_table if table == "META_DATA_EXPORT" else table
                connection.execute(f"CREATE TABLE {name} ({definition})")
                if table in self.batches:
                    self._insert(connection, table, rng if shuffle else None, time_order)
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
        self,
        connection: sqlite3.Connection,
        table: str,
        rng: np.random.Generator | None,
        time_order: bool,
    ) -> None:
        batches = self.batches[table]
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
