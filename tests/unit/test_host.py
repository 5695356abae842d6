"""Host utilisation (real psutil on this machine) and pod cgroup accounting.

The pod cgroup trees are built in a temporary directory with the layout and file formats of
real kubelet hierarchies (cgroup v2 ``cpu.stat``/``memory.current``, v1 ``cpuacct.usage``/
``memory.usage_in_bytes``): a stand-in for /sys/fs/cgroup, which has no pods on this machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from profiler_app.core.model import PodPeak
from profiler_app.sources.host import HostSampler, PodCgroupSampler

UID = "0b6a4e0c-5d2f-4c6e-9a3e-2f1b7c8d9e01"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _v2_pod(root: Path) -> Path:
    (root / "cgroup.controllers").write_text("cpu memory\n")
    qos = root / "kubepods.slice/kubepods-besteffort.slice"
    pod = qos / f"kubepods-besteffort-pod{UID.replace('-', '_')}.slice"
    pod.mkdir(parents=True)
    return pod


def _write_v2(pod: Path, usage_usec: int, memory: int) -> None:
    (pod / "cpu.stat").write_text(
        f"usage_usec {usage_usec}\nuser_usec {usage_usec // 2}\nsystem_usec {usage_usec // 2}\n"
        "nr_periods 0\nnr_throttled 0\nthrottled_usec 0\n"
    )
    (pod / "memory.current").write_text(f"{memory}\n")


def test_pod_peaks_from_cgroup_v2(tmp_path: Path) -> None:
    pod = _v2_pod(tmp_path)
    clock = Clock()
    sampler = PodCgroupSampler(window_seconds=60, cgroup_root=tmp_path, clock=clock)
    _write_v2(pod, 10_000_000, 300 * 2**20)
    sampler.sample()
    assert sampler.peaks() == {UID: PodPeak(cpu_util_max=None, mem_used_max_bytes=300 * 2**20)}
    clock.now += 2
    _write_v2(pod, 13_000_000, 500 * 2**20)  # 3 CPU-seconds in 2 s: 150 % of a core
    sampler.sample()
    clock.now += 2
    _write_v2(pod, 13_500_000, 400 * 2**20)
    sampler.sample()
    assert sampler.peaks() == {UID: PodPeak(cpu_util_max=150.0, mem_used_max_bytes=500 * 2**20)}
    clock.now += 61  # the old samples leave the window
    sampler.sample()
    peak = sampler.peaks()[UID]
    assert peak.mem_used_max_bytes == 400 * 2**20
    assert peak.cpu_util_max == 0.0


def test_pod_peaks_from_cgroup_v1(tmp_path: Path) -> None:
    cpu = tmp_path / f"cpu,cpuacct/kubepods/burstable/pod{UID}"
    memory = tmp_path / f"memory/kubepods/burstable/pod{UID}"
    cpu.mkdir(parents=True)
    memory.mkdir(parents=True)
    clock = Clock()
    sampler = PodCgroupSampler(window_seconds=60, cgroup_root=tmp_path, clock=clock)
    (cpu / "cpuacct.usage").write_text("1000000000\n")
    (memory / "memory.usage_in_bytes").write_text("1048576\n")
    sampler.sample()
    clock.now += 1
    (cpu / "cpuacct.usage").write_text("1500000000\n")
    sampler.sample()
    assert sampler.peaks() == {UID: PodPeak(cpu_util_max=50.0, mem_used_max_bytes=1048576.0)}


def test_unreadable_or_missing_accounting_is_skipped_quietly(tmp_path: Path) -> None:
    pod = _v2_pod(tmp_path)
    (pod / "cpu.stat").write_text("garbage\n")
    sampler = PodCgroupSampler(window_seconds=60, cgroup_root=tmp_path, clock=Clock())
    sampler.sample()
    assert sampler.peaks() == {UID: PodPeak(None, None)}
    assert PodCgroupSampler(60, cgroup_root=tmp_path / "absent").peaks() == {}


def test_host_sampler_reads_this_machine(tmp_path: Path) -> None:
    sampler = HostSampler(sample_interval=0.05, window_seconds=60, cgroup_root=tmp_path)
    sampler.start()
    try:
        # Up to 5 s for the first sample: a fixed short sleep flakes on a loaded machine.
        for _ in range(100):
            if sampler._stop.wait(0.05) or sampler.snapshot():
                break
        snapshot = sampler.snapshot()
    finally:
        sampler.close()
    for key in ("cpu_percent", "cpu_percent_max", "memory_percent", "disk_used_percent"):
        assert 0.0 <= snapshot[key] <= 100.0, key
    assert snapshot["cpu_percent_max"] >= snapshot["cpu_percent"]
    assert snapshot["network_receive_bytes_per_second"] >= 0.0
    assert sampler.pod_peaks() == {}
    assert sampler._thread is not None
    assert not sampler._thread.is_alive()


@pytest.mark.parametrize("key", ["disk_read_bytes_per_second", "network_transmit_bytes_per_second"])
def test_rates_need_two_samples(tmp_path: Path, key: str) -> None:
    sampler = HostSampler(sample_interval=1, window_seconds=60, cgroup_root=tmp_path)
    sampler.sample()
    assert key not in sampler.snapshot()
    sampler.sample()
    if key.startswith("disk") and "disk_read_bytes_per_second" not in sampler.snapshot():
        pytest.skip("psutil sees no disks in this container")
    assert sampler.snapshot()[key] >= 0.0
