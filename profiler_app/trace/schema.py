"""What this tool relies on in an Nsight Systems SQLite export (``nsys export --type sqlite``).

Sources, so a reader can check them:

- Table and column names: NVIDIA's "SQLite Export Schema Reference"
  (https://docs.nvidia.com/nsight-systems/2021.5/nsys-exporter/exported_data.html: "tables are
  created lazily", no indexes) and the ``.schema`` of an Nsight Systems 2024.6.2 export (schema
  version 3.16.1), whose statements ``tests/support/nsys/schema.py`` reproduces.
- Enum values: Post-Collection Analysis Guide, "SQLite Schema Event Values"
  (https://docs.nvidia.com/nsight-systems/AnalysisGuide/index.html): ``ENUM_CUDA_MEMCPY_OPER``
  and ``ENUM_CUDA_MEM_KIND`` (0 = pageable), NVTX event types 59 (push/pop), 60 (start/end).
- Column statistics: the report scripts shipped with Nsight Systems (``cuda_gpu_kern_sum``,
  ``cuda_api_sum``, ``cuda_gpu_mem_time_sum``), which the Analysis Guide documents.
- Schema versions: ``META_DATA_EXPORT`` row ``EXPORT_SCHEMA_VERSION`` ("3.16.1"), in a table
  named ``EXPORT_META_DATA`` before schema 3 (a real Nsight Systems 2022.2 export, schema 2.9.1,
  has every column read here). Nsight Systems' ``export_schema_version_notes.txt`` numbers them
  MAJOR.MINOR.MICRO: a major change breaks most queries, a minor one is localised, a micro one
  only adds tables or columns.
- CUDA backtraces: with ``nsys profile --cudabacktrace``, the runtime table also holds a row of
  event class 67 (``ENUM_NSYS_EVENT_CLASS``: TRACE_PROCESS_EVENT_CUDABACKTRACE) around a call,
  with the call's ``correlationId`` and its name without the version suffix (seen in a real
  export): not a call of its own.
- Joins: a CUDA API call and the kernel or copy it started share ``correlationId`` within a
  process; ``globalTid & 0xFFFFFFFFFF000000`` is the calling process's ``globalPid`` (the
  queries of ``nsys stats``' ``cuda_kern_exec_trace`` report join the same way). API names are
  stored with a version suffix (``cudaLaunchKernel_v7000``) that ``nsys stats`` strips.
"""

from __future__ import annotations

import re

KNOWN_SCHEMA_MAJORS = (2, 3)

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
NVTX = "NVTX_EVENTS"
STRINGS = "StringIds"
METADATA = "META_DATA_EXPORT"
OLD_METADATA = "EXPORT_META_DATA"  # its name before export schema 3
GPUS = "TARGET_INFO_GPU"
CUDA_DEVICES = "TARGET_INFO_CUDA_DEVICE"  # per process: CUDA device id -> TARGET_INFO_GPU id
SESSION_START = "TARGET_INFO_SESSION_START_TIME"

# Columns read from each table (beyond these, exports differ between versions harmlessly).
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    KERNEL: ("start", "end", "deviceId", "correlationId"),
    MEMCPY: ("start", "end", "deviceId", "bytes", "copyKind"),
    MEMSET: ("start", "end", "deviceId", "bytes"),
    RUNTIME: ("start", "end", "correlationId", "nameId", "globalTid"),
    NVTX: ("start", "end", "eventType"),
    STRINGS: ("id", "value"),
}
GPU_ACTIVITY_TABLES = (KERNEL, MEMCPY, MEMSET)

# ENUM_CUDA_MEMCPY_OPER: value -> the name nsys stats prints ("[CUDA memcpy HtoD]").
MEMCPY_KINDS = {
    0: "unknown",
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
    11: "Unified HtoD",
    12: "Unified DtoH",
    13: "Unified DtoD",
}
MEMSET_KIND = "memset"
# ENUM_NSYS_EVENT_CLASS of runtime-table rows that are CUDA backtraces (and their start and
# finish), not calls.
CUDA_BACKTRACE_EVENT_CLASSES = range(67, 70)
PAGEABLE_MEMORY = 0  # ENUM_CUDA_MEM_KIND: CUDA_MEMOPR_MEMORY_KIND_PAGEABLE
NVTX_RANGE_TYPES = (59, 60)  # NvtxPushPopRange, NvtxStartEndRange
NVTX_DOMAIN_CREATE = 75  # its text names the domain its domainId stands for
# NVTX domains that wrap communication library calls, made several times per iteration:
# "MPI" is Nsight Systems' own MPI trace (seen in a real export); NCCL names its ranges' domain
# "NCCL"; OpenSHMEM, NVSHMEM and UCX calls are traced the same way as MPI's.
LIBRARY_NVTX_DOMAINS = ("MPI", "NCCL", "OpenSHMEM", "NVSHMEM", "UCX")
# The same calls by name (GLOB), for a report whose capture began after the domain was created
# (real exports: MPI_Send, ncclGroupEnd).
LIBRARY_NVTX_RANGES = ("MPI_*", "nccl[A-Z]*")
# globalTid -> globalPid: clear the thread id (low 24 bits). 0xFFFFFFFFFF000000 as the signed
# 64-bit integer SQLite computes with (a bigger literal would turn into a float).
PROCESS_MASK = -(1 << 24)

# Calls that block the host until the GPU (or a stream, or an event) has caught up.
# cudaMemGetInfo is among them: it synchronises the device before reporting free memory.
SYNCHRONISING_CALLS = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventSynchronize",
        "cudaThreadSynchronize",
        "cudaMemGetInfo",
        "cuCtxSynchronize",
        "cuStreamSynchronize",
        "cuEventSynchronize",
        "cuMemGetInfo",
    }
)
# One call launches a whole CUDA graph: its kernels carry a graphNodeId, and their launch time
# is this call's, counted once (not once per kernel).
GRAPH_LAUNCH_CALLS = frozenset({"cudaGraphLaunch", "cuGraphLaunch"})
_VERSION_SUFFIX = re.compile(r"_v\d+$")


def api_name(stored: str) -> str:
    """``cudaLaunchKernel_v7000`` -> ``cudaLaunchKernel`` (as nsys stats prints it)."""
    return _VERSION_SUFFIX.sub("", stored)


def parse_schema_version(text: str) -> tuple[int, ...] | None:
    """``"3.16.1"`` -> ``(3, 16, 1)``; None when it is not dotted numbers."""
    parts = text.strip().split(".")
    if not all(part.isdigit() for part in parts):
        return None
    return tuple(int(part) for part in parts)
