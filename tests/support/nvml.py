"""A stand-in for ``pynvml`` (a test double): the functions, return shapes and exception classes
the NVML source calls, over scripted GPUs, MIG instances (``FakeGpu.mig_slots``: MIG mode,
instance handles by slot, GPU instance ids, per-instance framebuffer; no utilisation) and
per-process utilisation (``FakeGpu.process_util``). ``FakeGpu.waveform`` replays a utilisation
recording at 0.1 s through ``nvmlDeviceGetSamples`` (the driver's buffered samples) and averages
its last second in ``nvmlDeviceGetUtilizationRates``, as a driver does; time is a ``Clock`` the
test advances."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pynvml


@dataclass
class FakeMigDevice:
    """A MIG instance of a FakeGpu: its GPU instance id, profile and framebuffer. NVML gives
    no utilisation for it (NOT_SUPPORTED)."""

    gpu_instance_id: int
    profile: str
    parent_name: str = "NVIDIA A100-SXM4-80GB"
    used_bytes: int = 0
    total_bytes: int = 10 * 1024**3
    processes: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class FakeGpu:
    uuid: str
    name: str
    util: float = 0.0
    mem_util: float = 0.0
    used_bytes: int = 0
    total_bytes: int = 80 * 1024**3
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, used bytes)
    power_supported: bool = True
    # Utilisation the driver buffers every 0.1 s from the fake clock's start (sample i taken at
    # start + 0.1 (i + 1) s): nvmlDeviceGetSamples replays it, nvmlDeviceGetUtilizationRates
    # averages its last second. None: the GPU buffers nothing (NOT_SUPPORTED, as under MIG).
    waveform: np.ndarray | None = None
    silent: bool = False  # the driver has no new sample (NOT_FOUND)
    # Per-process SM utilisation (nvmlDeviceGetProcessUtilization's smUtil) by PID; a PID not
    # named reads ``util``.
    process_util: dict[int, float] = field(default_factory=dict)
    # MIG mode on: the instances by slot (None: an empty slot); its own utilisation is then
    # NOT_SUPPORTED, as on a real GPU in MIG mode.
    mig_slots: list[FakeMigDevice | None] | None = None


class FakeNvml:
    """Test double for ``pynvml``: real exception classes, scripted devices."""

    NVMLError = pynvml.NVMLError
    NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
    NVMLError_DriverNotLoaded = pynvml.NVMLError_DriverNotLoaded
    NVMLError_NotFound = pynvml.NVMLError_NotFound
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_GPU_UTILIZATION_SAMPLES = pynvml.NVML_GPU_UTILIZATION_SAMPLES
    NVML_VALUE_TYPE_UNSIGNED_INT = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_DEVICE_MIG_DISABLE = pynvml.NVML_DEVICE_MIG_DISABLE

    def __init__(self, gpus: list[FakeGpu], clock: Clock | None = None) -> None:
        self.gpus = gpus
        self.shutdown_called = False
        self.clock = clock or Clock()
        self.start = self.clock.now

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shutdown_called = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, gpu: FakeGpu) -> bytes:
        return gpu.uuid.encode()  # older bindings return bytes

    def nvmlDeviceGetName(self, gpu: FakeGpu | FakeMigDevice) -> str:
        if isinstance(gpu, FakeMigDevice):
            return f"{gpu.parent_name} MIG {gpu.profile}"
        return gpu.name

    def nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu) -> SimpleNamespace:
        if gpu.waveform is not None:  # the driver's last second
            taken = self._taken(gpu.waveform)
            gpu.util = float(np.mean(gpu.waveform[max(0, taken - 10) : taken])) if taken else 0.0
        return SimpleNamespace(gpu=gpu.util, memory=gpu.mem_util)

    def _taken(self, waveform: np.ndarray) -> int:
        """How many of the waveform's samples the driver has taken by now."""
        return min(waveform.size, int(round((self.clock.now - self.start) * 10, 6)))

    def nvmlDeviceGetSamples(
        self, gpu: FakeGpu | FakeMigDevice, kind: int, since: int
    ) -> tuple[int, list[SimpleNamespace]]:
        assert kind == pynvml.NVML_GPU_UTILIZATION_SAMPLES
        if isinstance(gpu, FakeMigDevice) or gpu.waveform is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        # Sample i is taken at start + 0.1 (i + 1) s, stamped in microseconds: the ones after
        # ``since`` that the driver has taken by now.
        taken = self._taken(gpu.waveform)
        first = max(0, int((since / 1e6 - self.start) * 10 + 0.5))
        stamps = np.round((self.start + 0.1 * np.arange(first + 1, taken + 1)) * 1e6)
        fresh = first + np.flatnonzero(stamps > since)
        stamps = np.round((self.start + 0.1 * (fresh + 1)) * 1e6)
        if gpu.silent or fresh.size == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, [
            SimpleNamespace(
                timeStamp=int(stamp), sampleValue=SimpleNamespace(uiVal=round(float(value)))
            )
            for stamp, value in zip(stamps.tolist(), gpu.waveform[fresh].tolist(), strict=True)
        ]

    def nvmlDeviceGetMigMode(self, gpu: FakeGpu) -> tuple[int, int]:
        mode = (
            self.NVML_DEVICE_MIG_DISABLE if gpu.mig_slots is None else self.NVML_DEVICE_MIG_ENABLE
        )
        return mode, mode

    def nvmlDeviceGetMaxMigDeviceCount(self, gpu: FakeGpu) -> int:
        return 7 if gpu.mig_slots is not None else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, gpu: FakeGpu, index: int) -> FakeMigDevice:
        slots = gpu.mig_slots or []
        if index >= len(slots) or slots[index] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        device = slots[index]
        assert device is not None
        return device

    def nvmlDeviceGetGpuInstanceId(self, device: FakeMigDevice) -> int:
        return device.gpu_instance_id

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu | FakeMigDevice) -> SimpleNamespace:
        return SimpleNamespace(
            used=gpu.used_bytes, free=gpu.total_bytes - gpu.used_bytes, total=gpu.total_bytes
        )

    def nvmlDeviceGetTemperature(self, gpu: FakeGpu, sensor: int) -> int:
        return 60

    def nvmlDeviceGetPowerUsage(self, gpu: FakeGpu) -> int:
        if not gpu.power_supported:
            # NVMLError(code) is the subclass for the code in every nvidia-ml-py release; old
            # ones (the declared floor) give the subclasses no argument.
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 250_000

    def nvmlDeviceGetComputeRunningProcesses(
        self, gpu: FakeGpu | FakeMigDevice
    ) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpu.processes]

    def nvmlDeviceGetProcessUtilization(
        self, gpu: FakeGpu | FakeMigDevice, since: int
    ) -> list[SimpleNamespace]:
        if isinstance(gpu, FakeMigDevice):  # no per-process utilisation on MIG
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not gpu.processes:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return [
            SimpleNamespace(
                pid=pid,
                smUtil=gpu.process_util.get(pid, gpu.util),
                memUtil=gpu.mem_util,
                timeStamp=since + 1,
            )
            for pid, _ in gpu.processes
        ]


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
