"""``ReportBuilder``: an Nsight Systems SQLite export under construction (a test double: no GPU
or nsys exists here), its rows shaped as real exports store them:

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

The ``add_*`` methods take numpy arrays (or scalars), so benchmark-sized reports (a million
kernels) are built in seconds. ``write`` writes the file (see ``files``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tests.support.nsys.files import write_export
from tests.support.nsys.schema import (
    CONSTANTS,
    CUDA_BACKTRACE,
    DEVICE,
    DTOH,
    HTOD,
    KERNEL,
    MEMCPY,
    MEMSET,
    NVTX,
    NVTX_DOMAIN_CREATE,
    NVTX_PUSH_POP,
    PINNED,
    RUNTIME,
    SCHEMA_VERSION,
)

PID = 4242
GLOBAL_PID = PID << 24
# NCCL kernels as Nsight Systems names them: SendRecv as a real PyTorch capture on two H100s
# shows it (the nsys-ai project's export), AllReduce as public profiles of NCCL 2.19 and later
# show it, and the ncclKernel_ names of older NCCL releases (in an `nsys stats` table).
NCCL_SEND_RECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<(unsigned long)4096>)"
NCCL_ALL_REDUCE = (
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)"
)
NCCL_OLD_ALL_REDUCE = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm *, ncclWorkElem)"
NCCL_LAUNCH = "cuLaunchKernelEx"  # how the real capture's NCCL kernels were launched

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
        return write_export(
            self,
            path,
            shuffle=shuffle,
            time_order=time_order,
            omit=omit,
            metadata=metadata,
            metadata_table=metadata_table,
            seed=seed,
        )
