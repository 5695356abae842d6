"""Local GPU sampling through NVML.

This machine has no NVIDIA driver, so the no-driver path runs against the real ``pynvml``.
The multi-GPU sampling logic runs against ``FakeNvml`` (tests/support/nvml.py), a test double
that mimics the parts of ``pynvml`` the sampler calls (same function names, return shapes and
exception classes), and replays 0.1 s utilisation waveforms as the driver's buffered samples.
"""

from __future__ import annotations

import logging
import math
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pynvml
import pytest

from profiler_app.core.errors import UserError
from profiler_app.core.model import (
    FB_USED,
    GPU_UTIL,
    MEM_COPY_UTIL,
    SHARED_PER_POD,
    PodInfo,
    SeriesMatrix,
)
from profiler_app.profiles.build import build_profiles
from profiler_app.profiles.pods import attribute_series, pod_usage
from profiler_app.sources.nvml import POWER_USAGE, NvmlSource, SampleRing
from tests.support import signals
from tests.support.nvml import Clock, FakeGpu, FakeMigDevice, FakeNvml

UID = "0b6a4e0c-5d2f-4c6e-9a3e-2f1b7c8d9e01"
CID = "4c1f0e8a3b2d5f6e7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f"


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


def _sampled(
    gpus: list[FakeGpu], seconds: int, fields: tuple[str, ...] = (GPU_UTIL, MEM_COPY_UTIL, FB_USED)
) -> NvmlSource:
    """A source over ``gpus`` after ``seconds`` sampler ticks, one a second."""
    clock = Clock()
    source = NvmlSource("n", seconds, 1.0, fields=fields, nvml=FakeNvml(gpus, clock), clock=clock)
    assert source.open()
    for _ in range(seconds):
        clock.now += 1.0
        source.sample()
    return source


def _replayed(util: SeriesMatrix, waveform: np.ndarray) -> np.ndarray:
    """What the grid should hold: at each tick, the driver's sample taken at that time (sample
    i at the start + 0.1 (i + 1) s), NaN before the first."""
    taken = np.round((util.timestamps - Clock().now) * 10).astype(int) - 1
    return np.where(taken >= 0, np.round(waveform[np.clip(taken, 0, waveform.size - 1)]), np.nan)


def test_buffered_samples_show_the_loop_one_reading_a_second_averages_away() -> None:
    """A LoRA-like fine-tune (1.8 s steps, busy a quarter of each) replayed by the stand-in
    driver at 0.1 s: read through the buffered samples it is a 1.8 s training loop; where the GPU
    buffers nothing (MIG) the same work, one reading a second, is a flat 25 %."""
    steps = signals.short_steps(900, np.random.default_rng(11))
    buffered = _sampled([FakeGpu("GPU-a", "NVIDIA A100-SXM4-80GB", waveform=steps)], 900)

    class WithoutSamples(FakeNvml):
        def nvmlDeviceGetSamples(self, gpu: FakeGpu, kind: int, since: int) -> Any:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # MIG: no samples

    clock = Clock()
    fallback = NvmlSource(
        "n",
        900,
        1.0,
        nvml=WithoutSamples([FakeGpu("GPU-a", "NVIDIA A100-SXM4-80GB", waveform=steps)], clock),
        clock=clock,
    )
    assert fallback.open()
    for _ in range(900):
        clock.now += 1.0
        fallback.sample()

    fine = {matrix.field: matrix for matrix in buffered.read(900)}[GPU_UTIL]
    coarse = {matrix.field: matrix for matrix in fallback.read(900)}[GPU_UTIL]
    assert (fine.step_seconds, coarse.step_seconds) == (0.1, 1.0)
    assert fine.values.shape == (1, 9000)
    assert np.isfinite(fine.values[0, :-10]).all()
    # The driver's own samples, replayed on the grid.
    assert np.array_equal(fine.values[0, :-10], _replayed(fine, steps)[:-10])
    [loop] = build_profiles(buffered.read(900))
    [flat] = build_profiles(fallback.read(900))
    assert loop.job_type == "training"
    assert loop.period_seconds == pytest.approx(1.8, rel=0.05)
    assert flat.job_type == "inference"
    assert flat.stats[GPU_UTIL].mean == pytest.approx(26, abs=2)
    assert flat.stats[GPU_UTIL].p95 < 60  # averaged: no sample near the 95 % of the steps


def test_a_gpu_without_buffered_samples_holds_its_readings_beside_one_with_them() -> None:
    """Mixed GPUs (one under MIG): one utilisation grid, the second GPU's column holding its one
    reading a second; the other fields keep one reading a second and are held on that grid by
    the analysis (power beside utilisation)."""
    steps = signals.short_steps(120, np.random.default_rng(2))
    gpus = [
        FakeGpu("GPU-a", "NVIDIA H100 80GB HBM3", waveform=steps),
        FakeGpu("GPU-b", "NVIDIA H100 80GB HBM3", util=40.0),
    ]
    source = _sampled(gpus, 120, (GPU_UTIL, MEM_COPY_UTIL, FB_USED, POWER_USAGE))
    matrices = {matrix.field: matrix for matrix in source.read(120)}

    util = matrices[GPU_UTIL]
    assert util.step_seconds == pytest.approx(0.1)
    assert np.isfinite(util.values[:, :-10]).all()
    assert set(util.values[1, :-10].tolist()) == {40.0}
    assert matrices[MEM_COPY_UTIL].step_seconds == 1.0
    profiles = build_profiles(list(matrices.values()))
    assert [p.gpu for p in profiles] == ["0", "1"]
    assert profiles[1].job_type == "inference"


def test_older_bindings_or_drivers_without_the_call_keep_one_reading_per_tick() -> None:
    class OldBindings(FakeNvml):
        def __getattribute__(self, name: str) -> Any:
            if name == "nvmlDeviceGetSamples":
                raise AttributeError(name)
            return super().__getattribute__(name)

    clock = Clock()
    gpu = FakeGpu("GPU-a", "Tesla T4", waveform=signals.short_steps(30, np.random.default_rng(3)))
    source = NvmlSource("n", 30, 1.0, nvml=OldBindings([gpu], clock), clock=clock)
    assert source.open()
    for _ in range(30):
        clock.now += 1.0
        source.sample()
    util = {matrix.field: matrix for matrix in source.read(30)}[GPU_UTIL]
    assert util.step_seconds == 1.0
    assert source.utilisation_step == 1.0
    assert np.isfinite(util.values).all()


def test_a_gap_in_the_drivers_samples_is_filled_by_the_ticks_readings() -> None:
    """NOT_FOUND for a while (nothing new in the buffer): the grid still has no hole, and a
    sample that comes back is used again."""
    steps = signals.short_steps(60, np.random.default_rng(4))
    gpu = FakeGpu("GPU-a", "NVIDIA L4", waveform=steps)
    clock = Clock()
    source = NvmlSource("n", 60, 1.0, nvml=FakeNvml([gpu], clock), clock=clock)
    assert source.open()
    for second in range(60):
        gpu.silent = 20 <= second < 30
        clock.now += 1.0
        source.sample()
    util = {matrix.field: matrix for matrix in source.read(60)}[GPU_UTIL]
    assert np.isfinite(util.values[0, :-10]).all()
    # Before the gap and well after it: the driver's samples, one per tick.
    expected = _replayed(util, steps)
    assert np.array_equal(util.values[0, :190], expected[:190])
    assert np.array_equal(util.values[0, 400:590], expected[400:590])


def test_a_gpu_that_stops_supporting_samples_falls_back_for_good(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gpu = FakeGpu(
        "GPU-a", "NVIDIA A100", waveform=signals.short_steps(40, np.random.default_rng(5))
    )
    clock = Clock()
    source = NvmlSource("n", 40, 1.0, nvml=FakeNvml([gpu], clock), clock=clock)
    assert source.open()
    for second in range(40):
        if second == 20:
            gpu.waveform = None  # e.g. MIG mode switched on under the profiler
        clock.now += 1.0
        with caplog.at_level(logging.WARNING):
            source.sample()
    util = {matrix.field: matrix for matrix in source.read(40)}[GPU_UTIL]
    assert util.step_seconds == pytest.approx(0.1)
    assert np.isfinite(util.values[0, :-10]).all()
    assert "buffered utilisation samples stopped" in caplog.text


def test_a_failing_samples_call_is_said_once_and_the_ticks_reading_stands_in(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Flaky(FakeNvml):
        def nvmlDeviceGetSamples(self, gpu: FakeGpu, kind: int, since: int) -> Any:
            if 10 <= self.clock.now - self.start < 20:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
            return super().nvmlDeviceGetSamples(gpu, kind, since)

    steps = signals.short_steps(40, np.random.default_rng(6))
    clock = Clock()
    source = NvmlSource(
        "n", 40, 1.0, nvml=Flaky([FakeGpu("G", "L4", waveform=steps)], clock), clock=clock
    )
    assert source.open()
    with caplog.at_level(logging.DEBUG):
        for _ in range(40):
            clock.now += 1.0
            source.sample()
    util = {matrix.field: matrix for matrix in source.read(40)}[GPU_UTIL]
    assert util.step_seconds == pytest.approx(0.1)
    assert np.isfinite(util.values[0, :-10]).all()
    failures = [
        r for r in caplog.records if "reading buffered utilisation samples failed" in r.message
    ]
    assert [r.levelno for r in failures] == [logging.WARNING] + [logging.DEBUG] * 9


def _proc_with_pods(tmp_path: Path, pods: dict[int, str]) -> Path:
    """/proc of processes (PID -> pod UID) in pods' cgroups."""
    for pid, uid in pods.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(
            f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/"
            f"cri-containerd-{CID}.scope\n"
        )
    return tmp_path


def test_pods_sharing_a_gpu_get_their_own_peaks_from_process_accounting(tmp_path: Path) -> None:
    """Two pods' processes on one GPU (time-slicing): nvmlDeviceGetProcessUtilization and each
    process's memory give each pod its own peaks, through the same path as dcgm-exporter's
    per-pod series; a GPU of one pod gets no per-pod series."""
    other = "7d9e1f20-3a4b-4c5d-8e6f-0a1b2c3d4e5f"
    gpus = [
        FakeGpu("GPU-shared", "NVIDIA L4", util=85, used_bytes=12 * 2**30),
        FakeGpu("GPU-alone", "NVIDIA L4", util=50, used_bytes=2**30),
    ]
    gpus[0].processes = [(100, 8 * 2**30), (200, 4 * 2**30)]
    gpus[0].process_util = {100: 60.0, 200: 25.0}
    gpus[1].processes = [(300, 2**30)]
    clock = Clock()
    source = NvmlSource(
        "node-a",
        window_seconds=10,
        sample_interval=1,
        fields=[GPU_UTIL, MEM_COPY_UTIL, FB_USED],
        nvml=FakeNvml(gpus),
        proc_root=_proc_with_pods(tmp_path, {100: UID, 200: other, 300: UID}),
        clock=clock,
        buffered=False,
    )
    assert source.open()
    for _ in range(5):
        source.sample()
        clock.now += 1
    pods = [
        PodInfo(uid, "ml", name, "node-a", "Running", None, 1, 1, {})
        for uid, name in ((UID, "pod-a"), (other, "pod-b"))
    ]
    matrices = attribute_series(source.read(5), pods)
    util = next(matrix for matrix in matrices if matrix.field == GPU_UTIL)
    assert len(util.labels) == 4  # two devices, two pods on the shared one
    profiles = build_profiles(matrices)
    shared, alone = profiles
    assert (shared.uuid, shared.sharing, alone.sharing) == ("GPU-shared", "time-slicing", "none")
    assert shared.stats[GPU_UTIL].max == 85.0  # the device, not a pod's series
    usage = {p.pod: p for p in pod_usage(profiles, pods, {}, "node-a")}
    assert (usage["pod-b"].gpu_util_max, usage["pod-b"].fb_used_max_mib) == (25.0, 4096.0)
    assert usage["pod-b"].gpu_attribution == SHARED_PER_POD
    assert usage["pod-a"].gpus == ("0", "1")
    assert usage["pod-a"].gpu_attribution == SHARED_PER_POD


def test_mig_instances_are_listed_with_their_framebuffer_and_no_utilisation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A GPU in MIG mode: each instance (nvmlDeviceGetMigMode, nvmlDeviceGetMaxMigDeviceCount,
    nvmlDeviceGetMigDeviceHandleByIndex, empty slots skipped) is a GPU labelled as dcgm-exporter
    labels it, with its own framebuffer; NVML gives no utilisation for it, so its verdict has
    confidence 0 and says why, rather than a confident "idle"."""
    instances = [
        FakeMigDevice(1, "3g.40gb", used_bytes=20 * 2**30, processes=[(10, 20 * 2**30)]),
        None,
        FakeMigDevice(5, "1g.10gb", used_bytes=0),
    ]
    gpus = [
        FakeGpu("GPU-mig", "NVIDIA A100-SXM4-80GB", mig_slots=instances),
        FakeGpu("GPU-whole", "NVIDIA A100-SXM4-80GB", util=70),
    ]
    clock = Clock()
    source = NvmlSource(
        "node-a", 10, 1, fields=[GPU_UTIL, FB_USED], nvml=FakeNvml(gpus), clock=clock
    )
    with caplog.at_level(logging.INFO):
        assert source.open()
    assert "2 MIG instances: framebuffer only" in caplog.text
    for _ in range(3):
        source.sample()
        clock.now += 1
    matrices = {matrix.field: matrix for matrix in source.read(3)}
    labels = matrices[FB_USED].labels
    assert [(lab["gpu"], lab.get("GPU_I_ID"), lab.get("GPU_I_PROFILE")) for lab in labels] == [
        ("0", "1", "3g.40gb"),
        ("0", "5", "1g.10gb"),
        ("1", None, None),
    ]
    assert {lab["UUID"] for lab in labels[:2]} == {"GPU-mig"}
    assert matrices[FB_USED].values[:, 0].tolist() == [20480.0, 0.0, 0.0]
    assert np.isnan(matrices[GPU_UTIL].values[:2]).all()
    profiles = build_profiles(list(matrices.values()))
    assert [p.device for p in profiles] == ["0-mig-1", "0-mig-5", "1"]
    assert profiles[0].confidence == 0.0
    assert profiles[0].reasons[0].startswith("no utilisation samples")
    assert profiles[2].job_type != "idle"
    assert source.processes()["0-mig-1"][0].pid == 10
