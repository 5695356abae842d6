"""Local GPU sampling through NVML.

This machine has no NVIDIA driver, so the no-driver path runs against the real ``pynvml``.
The multi-GPU sampling logic runs against ``FakeNvml``, a test double that mimics the parts of
``pynvml`` the sampler calls (same function names, return shapes and exception classes).
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pynvml
import pytest

from profiler_app.errors import UserError
from profiler_app.model import FB_USED, GPU_UTIL, MEM_COPY_UTIL
from profiler_app.sources.nvml import POWER_USAGE, NvmlSource, SampleRing

UID = "0b6a4e0c-5d2f-4c6e-9a3e-2f1b7c8d9e01"
CID = "4c1f0e8a3b2d5f6e7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f"


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


class FakeNvml:
    """Test double for ``pynvml``: real exception classes, scripted devices."""

    NVMLError = pynvml.NVMLError
    NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
    NVMLError_DriverNotLoaded = pynvml.NVMLError_DriverNotLoaded
    NVMLError_NotFound = pynvml.NVMLError_NotFound
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.shutdown_called = False

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

    def nvmlDeviceGetName(self, gpu: FakeGpu) -> str:
        return gpu.name

    def nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu) -> SimpleNamespace:
        return SimpleNamespace(gpu=gpu.util, memory=gpu.mem_util)

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu) -> SimpleNamespace:
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

    def nvmlDeviceGetComputeRunningProcesses(self, gpu: FakeGpu) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpu.processes]

    def nvmlDeviceGetProcessUtilization(self, gpu: FakeGpu, since: int) -> list[SimpleNamespace]:
        if not gpu.processes:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return [
            SimpleNamespace(pid=pid, smUtil=gpu.util, memUtil=gpu.mem_util, timeStamp=since + 1)
            for pid, _ in gpu.processes
        ]


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_no_driver_is_reported_once_for_real(caplog: pytest.LogCaptureFixture) -> None:
    """Real pynvml on this GPU-less machine raises NVMLError_LibraryNotFound."""
    source = NvmlSource("node-a", window_seconds=60, sample_interval=1)
    with caplog.at_level(logging.WARNING):
        source.start()
        assert source.read(60) == []
        assert source.read(60) == []
        source.close()
    if source.available:
        pytest.skip("this machine has an NVIDIA driver")
    assert source.unavailable_reason == "no NVIDIA driver found: NVML Shared Library Not Found"
    messages = [record.getMessage() for record in caplog.records]
    assert sum("no NVIDIA driver found" in message for message in messages) == 1


def test_unknown_field_is_a_user_error() -> None:
    with pytest.raises(UserError, match="DCGM_FI_PROF_SM_ACTIVE"):
        NvmlSource("n", 60, 1, fields=["DCGM_FI_PROF_SM_ACTIVE"], nvml=FakeNvml([]))


def test_ring_keeps_the_last_window_and_marks_gaps() -> None:
    ring = SampleRing(capacity=5, row_shape=(1,), step=2.0, origin=100.0)
    for tick in range(8):
        if tick != 6:
            ring.put(tick, np.array([float(tick)]))
    timestamps, rows = ring.window(5)
    assert list(timestamps) == [106.0, 108.0, 110.0, 112.0, 114.0]
    assert rows[:, 0].tolist()[:3] == [3.0, 4.0, 5.0]
    assert math.isnan(rows[3, 0])  # tick 6 never sampled; its slot holds tick 1's stale row
    assert rows[4, 0] == 7.0
    assert ring.tick_at(104.9) == 2


def test_ring_window_larger_than_history_pads_with_nan() -> None:
    ring = SampleRing(capacity=10, row_shape=(1,), step=1.0, origin=0.0)
    ring.put(0, np.array([5.0]))
    ring.put(1, np.array([6.0]))
    _, rows = ring.window(4)
    assert np.isnan(rows[:2, 0]).all()
    assert rows[2:, 0].tolist() == [5.0, 6.0]


def _proc_with_pod(tmp_path: Path, pid: int) -> Path:
    (tmp_path / str(pid)).mkdir()
    (tmp_path / str(pid) / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n"
    )
    return tmp_path


def test_samples_two_gpus_into_dcgm_shaped_matrices(tmp_path: Path) -> None:
    gpus = [
        FakeGpu("GPU-aaaa", "NVIDIA H100 80GB HBM3", util=90, mem_util=40, used_bytes=2048 * 2**20),
        FakeGpu("GPU-bbbb", "NVIDIA H100 80GB HBM3", power_supported=False),
    ]
    gpus[0].processes = [(4242, 2048 * 2**20)]
    clock = Clock()
    source = NvmlSource(
        "node-a",
        window_seconds=10,
        sample_interval=1,
        fields=[GPU_UTIL, MEM_COPY_UTIL, FB_USED, POWER_USAGE],
        nvml=FakeNvml(gpus),
        proc_root=_proc_with_pod(tmp_path, 4242),
        clock=clock,
    )
    assert source.open()
    for second in range(4):
        gpus[0].util = 90 if second % 2 == 0 else 10
        source.sample()
        clock.now += 1
    matrices = {matrix.field: matrix for matrix in source.read(4)}
    assert set(matrices) == {GPU_UTIL, MEM_COPY_UTIL, FB_USED, POWER_USAGE}
    util = matrices[GPU_UTIL]
    assert util.values.shape == (2, 4)
    assert util.values[0].tolist() == [90.0, 10.0, 90.0, 10.0]
    assert util.values[1].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert np.diff(util.timestamps).tolist() == [1.0, 1.0, 1.0]
    assert util.timestamps[-1] == clock.now - 1
    assert util.step_seconds == 1
    assert matrices[FB_USED].values[0, 0] == 2048.0
    assert matrices[POWER_USAGE].values[0, 0] == 250.0
    assert np.isnan(matrices[POWER_USAGE].values[1]).all()  # not supported -> NaN, not a crash
    assert util.labels[0] == {
        "gpu": "0",
        "UUID": "GPU-aaaa",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "node-a",
        "pod_uid": UID,
    }
    assert "pod_uid" not in util.labels[1]
    processes = source.processes()
    assert [process.pid for process in processes["0"]] == [4242]
    assert processes["0"][0].container is not None
    assert processes["0"][0].container.container_id == CID
    assert processes["0"][0].sm_util_max == 90.0
    assert processes["1"] == []


def test_processes_leave_after_the_window(tmp_path: Path) -> None:
    gpu = FakeGpu("GPU-aaaa", "A100", processes=[(4242, 1)])
    clock = Clock()
    source = NvmlSource("n", 5, 1, nvml=FakeNvml([gpu]), proc_root=tmp_path, clock=clock)
    source.open()
    source.sample()
    gpu.processes = []
    clock.now += 10
    source.sample()
    assert source.processes() == {"0": []}


def test_sampler_thread_fills_the_ring_and_stops() -> None:
    fake = FakeNvml([FakeGpu("GPU-aaaa", "A100", util=50)])
    source = NvmlSource("n", window_seconds=5, sample_interval=0.05, nvml=fake)
    source.start()
    try:
        deadline = 200
        while deadline and np.isnan(source.read(0.2)[0].values).any():
            deadline -= 1
            source._stop.wait(0.02)
        assert source.read(0.2)[0].values.tolist() == [[50.0, 50.0, 50.0, 50.0]]
    finally:
        source.close()
    assert fake.shutdown_called
    assert source._thread is not None
    assert not source._thread.is_alive()


def test_close_keeps_nvml_while_the_sampler_is_stuck_in_a_call() -> None:
    """Shutting NVML down under a running NVML call could crash the process: close waits 2 s
    for the sampler, and leaves NVML initialised if it has not stopped."""
    stuck, release = threading.Event(), threading.Event()

    class HangingNvml(FakeNvml):
        def nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu) -> SimpleNamespace:
            stuck.set()
            release.wait(10)
            return super().nvmlDeviceGetUtilizationRates(gpu)

    fake = HangingNvml([FakeGpu("GPU-aaaa", "A100", util=50)])
    source = NvmlSource("n", window_seconds=5, sample_interval=0.05, nvml=fake)
    source.start()
    assert stuck.wait(5)
    try:
        source.close()
        assert not fake.shutdown_called
    finally:
        release.set()
    assert source._thread is not None
    source._thread.join(5)
    source.close()
    assert fake.shutdown_called
