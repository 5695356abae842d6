"""Pods' disk and network rates in local mode: cgroup v2 ``io.stat`` and the pod's own network
namespace.

The cgroup tree is a temporary directory laid out as kubelet's systemd driver lays out
/sys/fs/cgroup on cgroup v2 (this machine runs v1 and no pods), with ``io.stat`` in the
kernel's format (Documentation/admin-guide/cgroup-v2.rst). The /proc stand-in holds
``ns/net`` links and ``net/dev`` files in the kernel's format; the parsers are also checked on
this machine's real /proc.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import psutil
import pytest

from profiler_app.core.model import DISK_READ, DISK_WRITE, NETWORK_RECEIVE, NETWORK_TRANSMIT
from profiler_app.sources.host import PodCgroupSampler
from profiler_app.sources.pod_io import (
    find_pod_network,
    parse_io_stat,
    parse_net_dev,
    stacked_devices,
)

UID = "0b6a4e0c-5d2f-4c6e-9a3e-2f1b7c8d9e01"
HOST_NAMESPACE = "net:[4026531840]"
POD_NAMESPACE = "net:[4026532712]"
NET_DEV_HEADER = (
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast|"
    "bytes    packets errs drop fifo colls carrier compressed\n"
)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def io_stat(*devices: tuple[str, int, int]) -> str:
    return "".join(
        f"{device} rbytes={read} wbytes={written} rios={read // 4096} wios={written // 4096} "
        "dbytes=0 dios=0\n"
        for device, read, written in devices
    )


def net_dev(eth0: tuple[int, int], lo: tuple[int, int] = (5_000_000, 5_000_000)) -> str:
    def line(name: str, received: int, sent: int) -> str:
        return f"{name:>6}: {received:>12} 1000 0 0 0 0 0 0 {sent:>12} 900 0 0 0 0 0 0\n"

    return NET_DEV_HEADER + line("lo", *lo) + line("eth0", *eth0)


def pod_tree(root: Path) -> tuple[Path, Path]:
    """A burstable pod with one container, as the systemd driver names them on cgroup v2."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    pod = (
        root
        / "kubepods.slice/kubepods-burstable.slice"
        / f"kubepods-burstable-pod{UID.replace('-', '_')}.slice"
    )
    container = pod / f"cri-containerd-{'ab' * 32}.scope"
    container.mkdir(parents=True)
    (pod / "cgroup.procs").write_text("")
    (container / "cgroup.procs").write_text("4242\n4243\n")
    (pod / "cpu.stat").write_text("usage_usec 0\n")
    (pod / "memory.current").write_text("1048576\n")
    return pod, container


def proc_tree(root: Path, pod_namespace: str) -> Path:
    proc = root / "proc"
    for pid, namespace in ((1, HOST_NAMESPACE), (4242, pod_namespace)):
        (proc / str(pid) / "ns").mkdir(parents=True)
        (proc / str(pid) / "net").mkdir()
        os.symlink(namespace, proc / str(pid) / "ns/net")
    return proc


def test_io_stat_sums_devices_and_leaves_out_stacked_ones() -> None:
    text = io_stat(("8:0", 4096, 8192), ("259:0", 1_000_000, 2_000_000), ("253:0", 10, 20))
    assert parse_io_stat(text) == (1_004_106, 2_008_212)
    assert parse_io_stat(text, frozenset({"8:0"})) == (1_000_010, 2_000_020)
    assert parse_io_stat("") is None
    assert parse_io_stat("8:0 rios=3 wios=4\n") is None  # no byte counters


def test_stacked_devices_are_those_with_holders(tmp_path: Path) -> None:
    for device, holder in (("8:0", "dm-0"), ("8:16", None), ("253:0", None)):
        (tmp_path / "dev/block" / device / "holders").mkdir(parents=True)
        if holder:
            (tmp_path / "dev/block" / device / "holders" / holder).touch()
    assert stacked_devices(tmp_path) == frozenset({"8:0"})
    assert stacked_devices(tmp_path / "missing") == frozenset()
    assert isinstance(stacked_devices(), frozenset)  # this machine's real /sys


def test_net_dev_leaves_out_loopback_and_matches_psutil_on_this_machine() -> None:
    counters = parse_net_dev(net_dev((123_456, 654_321)))
    assert counters is not None
    assert (counters.received, counters.transmitted) == (123_456, 654_321)
    assert parse_net_dev(NET_DEV_HEADER) is None
    # This process's namespace, read both ways: psutil before and after bracket our reading.
    before = psutil.net_io_counters(pernic=True)
    real = parse_net_dev(Path("/proc/self/net/dev").read_text())
    after = psutil.net_io_counters(pernic=True)
    if real is None:
        pytest.skip("no interface but loopback on this machine")
    low = sum(c.bytes_recv for name, c in before.items() if name != "lo")
    high = sum(c.bytes_recv for name, c in after.items() if name != "lo")
    assert low <= real.received <= high


def test_a_pod_on_the_hosts_network_is_not_attributable(tmp_path: Path) -> None:
    pod, _ = pod_tree(tmp_path / "cgroup")
    own = find_pod_network(pod, proc_tree(tmp_path / "own", POD_NAMESPACE))
    assert (own.pid, own.attributable) == (4242, True)
    shared = find_pod_network(pod, proc_tree(tmp_path / "host", HOST_NAMESPACE))
    assert (shared.pid, shared.attributable) == (None, False)
    gone = find_pod_network(pod, tmp_path / "empty-proc")  # its processes are gone
    assert not gone.attributable


def test_this_process_is_attributable_only_outside_the_hosts_namespace(tmp_path: Path) -> None:
    (tmp_path / "cgroup.procs").write_text(f"{os.getpid()}\n")
    found = find_pod_network(tmp_path)
    try:
        hosts = os.readlink("/proc/1/ns/net")
    except OSError:  # without the host's namespace nothing can be told apart from it
        assert not found.attributable
        return
    assert found.attributable == (os.readlink("/proc/self/ns/net") != hosts)


def test_sampler_rates_from_io_stat_and_the_pods_namespace(tmp_path: Path) -> None:
    pod, _ = pod_tree(tmp_path / "cgroup")
    proc = proc_tree(tmp_path, POD_NAMESPACE)
    monotonic, wall = Clock(100.0), Clock(1_700_000_000.0)
    sampler = PodCgroupSampler(
        600,
        tmp_path / "cgroup",
        monotonic,
        proc_root=proc,
        sys_root=tmp_path / "sys",
        wall_clock=wall,
    )
    readings = [
        # (disk read, disk written, received, sent) totals at each sample, 2 s apart
        (1_000_000, 0, 10_000, 10_000),
        (41_000_000, 2_000_000, 30_010_000, 10_000),  # 20 MB/s read, 15 MB/s in
        (43_000_000, 2_000_000, 30_020_000, 4_010_000),
        (44_000_000, 12_000_000, 30_030_000, 4_020_000),
    ]
    for read, written, received, sent in readings:
        (pod / "io.stat").write_text(io_stat(("8:0", read // 2, written), ("259:0", read // 2, 0)))
        (proc / "4242/net/dev").write_text(net_dev((received, sent)))
        sampler.sample()
        monotonic.now += 2
        wall.now += 2
    series = sampler.io()[UID]
    assert series.network_attributable
    assert series.timestamps.tolist() == [1_700_000_000.0 + 2 * i for i in range(4)]
    assert np.isnan(series.rates[DISK_READ][0])  # a rate needs two readings
    assert series.rates[DISK_READ][1:].tolist() == [20e6, 1e6, 0.5e6]
    assert series.rates[DISK_WRITE][1:].tolist() == [1e6, 0.0, 5e6]
    assert series.rates[NETWORK_RECEIVE][1:].tolist() == [15e6, 5e3, 5e3]
    assert series.rates[NETWORK_TRANSMIT][1:].tolist() == [0.0, 2e6, 5e3]


def test_sampler_skips_a_reset_and_leaves_out_a_host_network(tmp_path: Path) -> None:
    pod, _ = pod_tree(tmp_path / "cgroup")
    proc = proc_tree(tmp_path, HOST_NAMESPACE)
    monotonic, wall = Clock(100.0), Clock(1_700_000_000.0)
    sampler = PodCgroupSampler(600, tmp_path / "cgroup", monotonic, proc_root=proc, wall_clock=wall)
    for read in (5_000_000, 9_000_000, 1_000_000, 3_000_000):  # the pod cgroup was recreated
        (pod / "io.stat").write_text(io_stat(("8:0", read, 0)))
        (proc / "4242/net/dev").write_text(net_dev((read, read)))
        sampler.sample()
        monotonic.now += 1
        wall.now += 1
    series = sampler.io()[UID]
    reads = series.rates[DISK_READ]
    assert reads[1] == 4e6
    assert np.isnan(reads[2])
    assert reads[3] == 2e6
    assert not series.network_attributable
    assert set(series.rates) == {DISK_READ, DISK_WRITE}  # no guess at the pod's network


def test_old_io_samples_leave_the_window(tmp_path: Path) -> None:
    pod, _ = pod_tree(tmp_path / "cgroup")
    monotonic, wall = Clock(0.0), Clock(1_700_000_000.0)
    sampler = PodCgroupSampler(
        10, tmp_path / "cgroup", monotonic, proc_root=tmp_path / "none", wall_clock=wall
    )
    for step in range(30):
        (pod / "io.stat").write_text(io_stat(("8:0", step * 1000, 0)))
        sampler.sample()
        monotonic.now += 1
        wall.now += 1
    series = sampler.io()[UID]
    assert series.timestamps.size == 11
    assert series.timestamps[0] >= wall.now - 11
