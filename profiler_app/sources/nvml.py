"""GPU metrics sampled on this machine through NVML, shaped like dcgm-exporter's.

A sampler thread reads every GPU each ``sample_interval`` into a ring buffer sized to the
window; ``read`` returns one ``SeriesMatrix`` per field with dcgm-exporter's field names and
labels, so the same analysis runs on local samples and on Prometheus data.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pynvml

from profiler_app.core.errors import UserError
from profiler_app.core.model import (
    FB_FREE,
    FB_USED,
    GPU_UTIL,
    MEM_COPY_UTIL,
    MIG_INSTANCE_LABEL,
    MIG_PROFILE_LABEL,
    FloatMatrix,
    Identity,
    SeriesMatrix,
)
from profiler_app.profiles.engines import ENGINE_LABEL, FRAMEWORK_LABEL
from profiler_app.sources.cgroups import ContainerRef, container_of_pid
from profiler_app.sources.nvml_samples import (
    MAX_SAMPLE_COVER_SECONDS,
    UtilisationSamples,
    buffered_step,
    covering,
    tick_floor,
)
from profiler_app.sources.processes import process_identity

log = logging.getLogger(__name__)

GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"
POWER_USAGE = "DCGM_FI_DEV_POWER_USAGE"
NVML_FIELDS = (GPU_UTIL, MEM_COPY_UTIL, FB_USED, FB_FREE, GPU_TEMP, POWER_USAGE)
_MIB = 1024 * 1024
POD_UID = "pod_uid"  # pods.POD_UID_LABEL: the pod whose processes use the GPU


class SampleRing:
    """Rows of samples on a fixed time grid (tick ``k`` is at ``origin + k * step``).

    Slots are reused modulo the capacity; a slot remembers its tick so that ticks that were
    never sampled (a stalled sampler) read back as NaN instead of stale values.
    """

    def __init__(self, capacity: int, row_shape: tuple[int, ...], step: float, origin: float):
        self.capacity = capacity
        self.step = step
        self.origin = origin
        self._rows = np.full((capacity, *row_shape), np.nan)
        self._ticks = np.full(capacity, -1, dtype=np.int64)
        self.last_tick = -1

    def tick_at(self, timestamp: float) -> int:
        return max(0, math.floor((timestamp - self.origin) / self.step + 0.5))

    def put(self, tick: int, row: FloatMatrix) -> None:
        slot = tick % self.capacity
        self._rows[slot] = row
        self._ticks[slot] = tick
        self.last_tick = max(self.last_tick, tick)

    def put_cells(self, ticks: npt.NDArray[np.int64], column: int, values: FloatMatrix) -> None:
        """Writes one column of ascending ``ticks`` (the other columns of a tick first written
        here read NaN until written): GPUs whose samples arrive apart fill their own column."""
        if ticks.size == 0:
            return
        ticks, values = ticks[-self.capacity :], values[-self.capacity :]
        slots = ticks % self.capacity
        fresh = self._ticks[slots] != ticks
        self._rows[slots[fresh]] = np.nan
        self._ticks[slots] = ticks
        self._rows[slots, column] = values
        self.last_tick = max(self.last_tick, int(ticks[-1]))

    def window(self, count: int) -> tuple[FloatMatrix, FloatMatrix]:
        """Timestamps and rows of the last ``count`` ticks up to the newest sample."""
        count = max(1, min(count, self.capacity))
        last = max(self.last_tick, 0)
        ticks = np.arange(last - count + 1, last + 1, dtype=np.int64)
        slots = ticks % self.capacity
        rows: FloatMatrix = self._rows[slots].copy()
        rows[self._ticks[slots] != ticks] = np.nan
        timestamps: FloatMatrix = (self.origin + ticks * self.step).astype(np.float64)
        return timestamps, rows


@dataclass
class GpuProcess:
    """A process seen on a GPU within the window, with its peaks."""

    pid: int
    container: ContainerRef | None
    last_seen: float
    used_memory_max_bytes: float = 0.0
    sm_util_max: float = 0.0
    identity: Identity | None = None  # what it runs (engines), read once from /proc


@dataclass(frozen=True)
class _Device:
    handle: Any
    index: str
    uuid: str
    model: str
    # A MIG instance: its GPU instance id and profile (labelled as dcgm-exporter labels them,
    # under its parent's index and UUID). NVML gives it framebuffer and processes, no
    # utilisation and no power of its own.
    mig_instance: str = ""
    mig_profile: str = ""

    @property
    def key(self) -> str:
        """The GPU's index, with a MIG instance's id: ``0``, ``0-mig-3``."""
        return f"{self.index}-mig-{self.mig_instance}" if self.mig_instance else self.index


def _mig_profile(name: str) -> str:
    """``NVIDIA A100-SXM4-80GB MIG 1g.10gb`` -> ``1g.10gb``."""
    return name.rsplit("MIG ", 1)[-1].strip() if "MIG " in name else ""


def mig_devices(nvml: Any, parent: _Device) -> list[_Device]:
    """The MIG instances of ``parent`` (nvmlDeviceGetMigMode, nvmlDeviceGetMaxMigDeviceCount,
    nvmlDeviceGetMigDeviceHandleByIndex); empty where MIG is off or not supported."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(parent.handle)
    except (nvml.NVMLError, AttributeError):  # not supported, or bindings without MIG calls
        return []
    if current != nvml.NVML_DEVICE_MIG_ENABLE:
        return []
    found = []
    for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(parent.handle)):
        try:
            handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent.handle, slot)
        except nvml.NVMLError_NotFound:
            continue  # an empty slot
        found.append(
            _Device(
                handle=handle,
                index=parent.index,
                uuid=parent.uuid,
                model=parent.model,
                mig_instance=str(nvml.nvmlDeviceGetGpuInstanceId(handle)),
                mig_profile=_mig_profile(_text(nvml.nvmlDeviceGetName(handle))),
            )
        )
    return sorted(found, key=lambda device: int(device.mig_instance))


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class NvmlSource:
    """Samples every GPU of this machine; a ``MetricsSource`` that never raises for lack of GPUs.

    ``nvml`` is the ``pynvml`` module (tests pass a stand-in). Without a driver, ``start``
    says ``no NVIDIA driver found: <reason>`` once and ``read`` returns no matrices.

    With ``buffered`` (the default), utilisation comes from the driver's buffered samples on a
    0.1 s grid wherever a GPU supports them (``nvml_samples``); every other field, and the
    utilisation of GPUs that do not, is one reading per ``sample_interval``.
    """

    def __init__(
        self,
        hostname: str,
        window_seconds: float,
        sample_interval: float,
        *,
        fields: Sequence[str] = (GPU_UTIL, MEM_COPY_UTIL, FB_USED),
        nvml: Any = None,
        proc_root: Path = Path("/proc"),
        clock: Callable[[], float] = time.time,
        buffered: bool = True,
    ) -> None:
        unknown = [name for name in fields if name not in NVML_FIELDS]
        if unknown:
            raise UserError(
                f"local NVML sampling cannot provide {', '.join(unknown)}; "
                f"it provides {', '.join(NVML_FIELDS)} (use --prometheus-url for other fields)"
            )
        self.hostname = hostname
        self.fields = tuple(fields)
        self.window_seconds = window_seconds
        self.sample_interval = sample_interval
        self.unavailable_reason: str | None = None
        self._nvml = pynvml if nvml is None else nvml
        self._proc_root = proc_root
        self._clock = clock
        self._devices: list[_Device] = []
        self._ring: SampleRing | None = None
        self._buffered = buffered and GPU_UTIL in self.fields
        self._samples: UtilisationSamples | None = None
        self._fine: SampleRing | None = None  # buffered utilisation, one column per GPU
        self._fine_filled: list[int] = []  # per GPU, the last tick of _fine written
        self._processes: dict[str, dict[int, GpuProcess]] = {}
        self._process_timestamps: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reported_errors: set[str] = set()

    @property
    def available(self) -> bool:
        return self._ring is not None

    @property
    def gpu_count(self) -> int:
        return len(self._devices)

    def open(self) -> bool:
        """Initialises NVML and lists the GPUs; False (said once) when there is no driver."""
        nvml = self._nvml
        try:
            nvml.nvmlInit()
            count = nvml.nvmlDeviceGetCount()
            devices = []
            for index in range(count):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                parent = _Device(
                    handle=handle,
                    index=str(index),
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    model=_text(nvml.nvmlDeviceGetName(handle)),
                )
                # A GPU in MIG mode is sampled per instance: the parent has no utilisation.
                devices.extend(mig_devices(nvml, parent) or [parent])
        except (nvml.NVMLError_LibraryNotFound, nvml.NVMLError_DriverNotLoaded) as error:
            self.unavailable_reason = f"no NVIDIA driver found: {error}"
        except nvml.NVMLError as error:
            self.unavailable_reason = f"NVML unavailable: {error}"
        else:
            self._devices = devices
            origin = self._clock()
            capacity = math.ceil(self.window_seconds / self.sample_interval) + 1
            self._ring = SampleRing(
                capacity, (len(self.fields), len(devices)), self.sample_interval, origin
            )
            self._processes = {device.key: {} for device in devices}
            instances = sum(1 for device in devices if device.mig_instance)
            log.info(
                "NVML: sampling %d GPU(s)%s every %gs",
                count,
                f" ({instances} MIG instances: framebuffer only, NVML has no utilisation there)"
                if instances
                else "",
                self.sample_interval,
            )
            self._open_buffered(origin)
            return True
        log.warning("%s; profiling the host only", self.unavailable_reason)
        return False

    def _open_buffered(self, origin: float) -> None:
        step = buffered_step(self.window_seconds, self.sample_interval)
        if not self._buffered or step is None or not self._devices:
            return
        samples = UtilisationSamples(self._nvml, len(self._devices))
        handles = [device.handle for device in self._devices]
        if not samples.probe(handles, [device.index for device in self._devices]):
            return
        self._samples = samples
        capacity = math.ceil(self.window_seconds / step) + 1
        self._fine = SampleRing(capacity, (len(self._devices),), step, origin)
        self._fine_filled = [-1] * len(self._devices)
        log.info("NVML: utilisation from the driver's buffered samples, every %gs", step)

    @property
    def utilisation_step(self) -> float:
        """The step of the utilisation series ``read`` returns."""
        return self._fine.step if self._fine is not None else self.sample_interval

    def start(self) -> None:
        """Opens NVML and starts the sampler thread (no thread without GPUs)."""
        if self.open() and self._devices:
            self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stops the sampler, then shuts NVML down; a sampler still inside an NVML call after
        2 s keeps NVML (shutting it down under the call could crash the process)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            if self._thread.is_alive():
                log.warning("the NVML sampler did not stop within 2s; leaving NVML initialised")
                return
        if self._ring is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as error:
                log.debug("nvmlShutdown: %s", error)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception as error:  # the sampler thread must outlive any NVML hiccup
                self._report("sampler", error)
            next_at += self.sample_interval
            now = time.monotonic()
            if next_at < now:  # fell behind: skip the missed ticks (they read back as NaN)
                next_at = now + self.sample_interval
            self._stop.wait(next_at - now)

    def sample(self) -> None:
        """Reads every GPU once into the tick of the current time."""
        ring = self._ring
        if ring is None:
            return
        now = self._clock()
        row = np.full((len(self.fields), len(self._devices)), np.nan)
        cells = []
        for column, device in enumerate(self._devices):
            readings = self._read_device(device)
            for position, name in enumerate(self.fields):
                row[position, column] = readings.get(name, np.nan)
            if self._fine is not None:
                cells.append(self._buffered_cells(column, device, now, readings))
            self._sample_processes(device, now)
        with self._lock:
            ring.put(ring.tick_at(now), row)
            for column, (ticks, values) in enumerate(cells):
                if self._fine is not None:
                    self._fine.put_cells(ticks, column, values)

    def _buffered_cells(
        self, column: int, device: _Device, now: float, readings: dict[str, float]
    ) -> tuple[npt.NDArray[np.int64], FloatMatrix]:
        """The ticks of the utilisation grid this GPU can fill now, and their values: each
        from the buffered sample that covers it; where none does (the GPU does not buffer
        samples, or none is that recent), the tick's own reading, held over the ticks since the
        last one, as one reading per tick would be."""
        fine, samples = self._fine, self._samples
        assert fine is not None
        assert samples is not None
        times, values = samples.fetch(column, device.handle, now)
        start = self._fine_filled[column] + 1
        if samples.supported[column]:
            end = tick_floor(now - MAX_SAMPLE_COVER_SECONDS, fine.origin, fine.step)
            if times.size:
                end = max(end, tick_floor(times[-1], fine.origin, fine.step))
        else:
            end = tick_floor(now, fine.origin, fine.step)
        ticks = np.arange(max(start, end - fine.capacity + 1), end + 1, dtype=np.int64)
        points = (fine.origin + ticks * fine.step).astype(np.float64)
        found = covering(times, values, points)
        found[np.isnan(found)] = readings.get(GPU_UTIL, np.nan)
        self._fine_filled[column] = max(self._fine_filled[column], end)
        return ticks, found

    def _read_device(self, device: _Device) -> dict[str, float]:
        nvml = self._nvml
        readings: dict[str, float] = {}
        if device.mig_instance:  # the instance's framebuffer; the rest is none or the parent's
            return self._read_memory(device, readings)
        try:
            rates = nvml.nvmlDeviceGetUtilizationRates(device.handle)
            readings[GPU_UTIL] = float(rates.gpu)
            readings[MEM_COPY_UTIL] = float(rates.memory)
        except nvml.NVMLError as error:
            self._report(f"utilization of GPU {device.key}", error)
        self._read_memory(device, readings)
        if GPU_TEMP in self.fields:
            try:
                temperature = nvml.nvmlDeviceGetTemperature(
                    device.handle, nvml.NVML_TEMPERATURE_GPU
                )
                readings[GPU_TEMP] = float(temperature)
            except nvml.NVMLError as error:
                self._report(f"temperature of GPU {device.index}", error)
        if POWER_USAGE in self.fields:
            try:
                readings[POWER_USAGE] = nvml.nvmlDeviceGetPowerUsage(device.handle) / 1000.0
            except nvml.NVMLError as error:
                self._report(f"power of GPU {device.index}", error)
        return readings

    def _read_memory(self, device: _Device, readings: dict[str, float]) -> dict[str, float]:
        try:
            memory = self._nvml.nvmlDeviceGetMemoryInfo(device.handle)
            readings[FB_USED] = memory.used / _MIB
            readings[FB_FREE] = memory.free / _MIB
        except self._nvml.NVMLError as error:
            self._report(f"memory of GPU {device.key}", error)
        return readings

    def _sample_processes(self, device: _Device, now: float) -> None:
        nvml = self._nvml
        try:
            running = nvml.nvmlDeviceGetComputeRunningProcesses(device.handle)
        except nvml.NVMLError as error:
            self._report(f"processes of GPU {device.key}", error)
            return
        sm_util: dict[int, float] = {}
        since = self._process_timestamps.get(device.key, 0)
        try:
            for sample in nvml.nvmlDeviceGetProcessUtilization(device.handle, since):
                sm_util[sample.pid] = max(sm_util.get(sample.pid, 0.0), float(sample.smUtil))
                since = max(since, int(sample.timeStamp))
            self._process_timestamps[device.key] = since
        except nvml.NVMLError_NotFound:
            pass  # no process ran since the last sample
        except nvml.NVMLError as error:
            self._report(f"process utilisation of GPU {device.key}", error)
        # Only this thread adds processes: the new ones are read from /proc outside the lock.
        known = self._processes[device.key]
        new = {
            process.pid: GpuProcess(
                process.pid,
                container_of_pid(process.pid, self._proc_root),
                now,
                identity=process_identity(process.pid, self._proc_root),
            )
            for process in running
            if process.pid not in known
        }
        with self._lock:
            seen = self._processes[device.key]
            seen.update(new)
            for process in running:
                entry = seen[process.pid]
                entry.last_seen = now
                used = process.usedGpuMemory
                if used is not None:
                    entry.used_memory_max_bytes = max(entry.used_memory_max_bytes, float(used))
                entry.sm_util_max = max(entry.sm_util_max, sm_util.get(process.pid, 0.0))
            horizon = now - self.window_seconds
            for pid in [pid for pid, entry in seen.items() if entry.last_seen < horizon]:
                del seen[pid]

    def _report(self, what: str, error: Exception) -> None:
        """Logs each distinct failure once at warning level, repeats at debug level."""
        key = f"{what}: {error}"
        level = logging.DEBUG if key in self._reported_errors else logging.WARNING
        self._reported_errors.add(key)
        log.log(level, "NVML %s failed: %s", what, error)

    def processes(self) -> dict[str, list[GpuProcess]]:
        """Processes seen within the window, by GPU index."""
        with self._lock:
            return {
                index: [GpuProcess(**vars(entry)) for entry in seen.values()]
                for index, seen in self._processes.items()
            }

    def read(self, window_seconds: float) -> list[SeriesMatrix]:
        ring = self._ring
        if ring is None:
            return []
        count = max(1, round(window_seconds / self.sample_interval))
        with self._lock:
            timestamps, rows = ring.window(count)
            fine = None
            if self._fine is not None:
                fine = self._fine.window(max(1, round(window_seconds / self._fine.step)))
        labels = [self._labels(device) for device in self._devices]
        matrices = [
            SeriesMatrix(
                field=name,
                labels=[dict(series) for series in labels],
                timestamps=timestamps,
                values=np.ascontiguousarray(rows[:, position, :].T),
                step_seconds=self.sample_interval,
            )
            for position, name in enumerate(self.fields)
        ]
        if fine is not None and self._fine is not None:
            fine_timestamps, fine_rows = fine
            matrices[self.fields.index(GPU_UTIL)] = SeriesMatrix(
                field=GPU_UTIL,
                labels=[dict(series) for series in labels],
                timestamps=fine_timestamps,
                values=np.ascontiguousarray(fine_rows.T),
                step_seconds=self._fine.step,
            )
        return [self._with_pods_sharing(matrix) for matrix in matrices]

    def _with_pods_sharing(self, matrix: SeriesMatrix) -> SeriesMatrix:
        """``matrix`` with, for every GPU whose processes belong to several pods at once (a
        time-sliced GPU), one series per pod (labelled ``pod_uid``, as dcgm-exporter
        4.5.3-4.8.2 labels its per-pod series beside the device's, which then names no pod):
        its processes' summed peak SM utilisation (capped at 100) or GPU memory, at the time of
        its latest sample. NVML's per-process accounting keeps peaks, not a time line; the
        profiles take each pod's peaks from these (docs/sharing.md)."""
        if matrix.field not in (GPU_UTIL, FB_USED) or not matrix.timestamps.size:
            return matrix
        labels, rows = list(matrix.labels), [matrix.values]
        for device in self._devices:
            for uid, (util, memory, last) in self._pods_sharing(device.key).items():
                row = np.full((1, matrix.timestamps.size), np.nan)
                column = int(np.argmin(np.abs(matrix.timestamps - last)))
                row[0, column] = min(util, 100.0) if matrix.field == GPU_UTIL else memory / _MIB
                base = {key: self._labels(device)[key] for key in ("gpu", "UUID", "Hostname")}
                labels.append({**base, POD_UID: uid})
                rows.append(row)
        if len(rows) == 1:
            return matrix
        return SeriesMatrix(
            matrix.field, labels, matrix.timestamps, np.vstack(rows), matrix.step_seconds
        )

    def _pods_sharing(self, index: str) -> dict[str, tuple[float, float, float]]:
        """Pod UID -> (summed peak SM utilisation, summed peak memory in bytes, last seen) of
        the pods whose processes share GPU ``index``; empty unless there are two or more."""
        with self._lock:
            pods: dict[str, tuple[float, float, float]] = {}
            for entry in self._processes.get(index, {}).values():
                uid = entry.container.pod_uid if entry.container is not None else None
                if uid is None:
                    continue
                util, memory, last = pods.get(uid, (0.0, 0.0, 0.0))
                pods[uid] = (
                    util + entry.sm_util_max,
                    memory + entry.used_memory_max_bytes,
                    max(last, entry.last_seen),
                )
        return pods if len(pods) >= 2 else {}

    def _labels(self, device: _Device) -> dict[str, str]:
        labels = {
            "gpu": device.index,
            "UUID": device.uuid,
            "modelName": device.model,
            "Hostname": self.hostname,
        }
        if device.mig_instance:
            labels |= {
                MIG_INSTANCE_LABEL: device.mig_instance,
                MIG_PROFILE_LABEL: device.mig_profile,
            }
        pod_uid = self._main_pod(device.key)
        if pod_uid is not None and not self._pods_sharing(device.key):
            labels[POD_UID] = pod_uid
        identity = self._main_identity(device.key)
        if identity is not None and identity.engine:
            labels[ENGINE_LABEL] = identity.engine
        if identity is not None and identity.framework:
            labels[FRAMEWORK_LABEL] = identity.framework
        return labels

    def _main_identity(self, index: str) -> Identity | None:
        """What the process that held the most GPU memory on this GPU within the window runs
        (among those whose identity is known)."""
        with self._lock:
            known = [entry for entry in self._processes.get(index, {}).values() if entry.identity]
        if not known:
            return None
        return max(known, key=lambda entry: entry.used_memory_max_bytes).identity

    def _main_pod(self, index: str) -> str | None:
        """The pod whose processes used the most GPU memory on this GPU within the window."""
        with self._lock:
            usage: dict[str, float] = {}
            for entry in self._processes.get(index, {}).values():
                if entry.container is not None and entry.container.pod_uid is not None:
                    uid = entry.container.pod_uid
                    usage[uid] = usage.get(uid, 0.0) + entry.used_memory_max_bytes
        if not usage:
            return None
        return max(usage, key=lambda uid: usage[uid])
