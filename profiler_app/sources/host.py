"""This machine's CPU, memory, disk and network use (psutil), each pod's CPU and memory peaks
from its cgroup (v2 ``cpu.stat``/``memory.current``, v1 ``cpuacct``/``memory``), and each pod's
disk and network rates (``pod_io``: v2 ``io.stat``, the pod's own network namespace)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from profiler_app.core.model import (
    DISK_READ,
    DISK_WRITE,
    IO_FIELDS,
    NETWORK_RECEIVE,
    NETWORK_TRANSMIT,
    PodIoSeries,
    PodPeak,
)
from profiler_app.sources.cgroups import PodCgroup, find_pod_cgroups
from profiler_app.sources.pod_io import (
    PodNetwork,
    find_pod_network,
    read_io_bytes,
    read_network,
    stacked_devices,
)

log = logging.getLogger(__name__)

# Pods come and go slowly; rescanning the cgroup tree every sample would cost more than reading.
_RESCAN_SECONDS = 30.0


def read_cpu_seconds(pod: PodCgroup) -> float | None:
    """Total CPU time the pod used, in seconds, or None if unreadable."""
    if pod.cpu_dir is None:
        return None
    try:
        if pod.version == 2:
            for line in (pod.cpu_dir / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
            return None
        return int((pod.cpu_dir / "cpuacct.usage").read_text()) / 1e9
    except (OSError, ValueError):
        return None


def read_memory_bytes(pod: PodCgroup) -> float | None:
    """Memory the pod uses now, in bytes, or None if unreadable."""
    if pod.memory_dir is None:
        return None
    name = "memory.current" if pod.version == 2 else "memory.usage_in_bytes"
    try:
        return float(int((pod.memory_dir / name).read_text()))
    except (OSError, ValueError):
        return None


Counters = tuple[int | None, ...]  # by IO_FIELDS
Rates = tuple[float | None, ...]


def read_io_counters(
    pod: PodCgroup, network: PodNetwork, stacked: frozenset[str], proc_root: Path
) -> Counters:
    """The pod's disk (v2 only) and network byte counters now, None where not readable."""
    disk = read_io_bytes(pod.cpu_dir, stacked) if pod.version == 2 and pod.cpu_dir else None
    net = read_network(network.pid, proc_root) if network.pid is not None else None
    counters = {
        DISK_READ: disk[0] if disk else None,
        DISK_WRITE: disk[1] if disk else None,
        NETWORK_RECEIVE: net.received if net else None,
        NETWORK_TRANSMIT: net.transmitted if net else None,
    }
    return tuple(counters[direction] for direction in IO_FIELDS)


def _rates(previous: tuple[float, Counters] | None, now: float, counters: Counters) -> Rates:
    """Bytes per second since ``previous``; None across a reset (a counter going down)."""
    if previous is None or now <= previous[0]:
        return (None,) * len(counters)
    elapsed = now - previous[0]
    return tuple(
        (new - old) / elapsed if new is not None and old is not None and new >= old else None
        for old, new in zip(previous[1], counters, strict=True)
    )


class PodCgroupSampler:
    """Per-pod CPU (rate from deltas), memory, disk and network samples, kept for one window."""

    def __init__(
        self,
        window_seconds: float,
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        clock: Callable[[], float] = time.monotonic,
        *,
        proc_root: Path = Path("/proc"),
        sys_root: Path = Path("/sys"),
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.window_seconds = window_seconds
        self.cgroup_root = cgroup_root
        self.proc_root = proc_root
        self.sys_root = sys_root
        self._clock = clock
        self._wall_clock = wall_clock  # the I/O series' times, to line up with the GPU samples
        self._pods: list[PodCgroup] = []
        self._networks: dict[str, PodNetwork] = {}
        self._stacked: frozenset[str] = frozenset()
        self._scanned_at: float | None = None
        self._last_cpu: dict[str, tuple[float, float]] = {}
        self._last_io: dict[str, tuple[float, Counters]] = {}
        self._samples: dict[str, deque[tuple[float, float | None, float | None]]] = {}
        self._io: dict[str, deque[tuple[float, Rates]]] = {}
        self._lock = threading.Lock()

    def _rescan(self) -> None:
        self._pods = find_pod_cgroups(self.cgroup_root)
        self._stacked = stacked_devices(self.sys_root)
        self._networks = {}
        for pod in self._pods:
            directory = pod.cpu_dir or pod.memory_dir
            if directory is not None:
                self._networks[pod.uid] = find_pod_network(directory, self.proc_root)

    def sample(self) -> None:
        now = self._clock()
        if self._scanned_at is None or now - self._scanned_at >= _RESCAN_SECONDS:
            self._rescan()
            self._scanned_at = now
        wall = self._wall_clock()
        for pod in self._pods:
            network = self._networks.get(pod.uid, PodNetwork(None, attributable=False))
            counters = read_io_counters(pod, network, self._stacked, self.proc_root)
            rates = _rates(self._last_io.get(pod.uid), now, counters)
            self._last_io[pod.uid] = (now, counters)
            with self._lock:
                self._io.setdefault(pod.uid, deque()).append((wall, rates))
            cpu_percent = None
            cpu_seconds = read_cpu_seconds(pod)
            if cpu_seconds is not None:
                previous = self._last_cpu.get(pod.uid)
                self._last_cpu[pod.uid] = (now, cpu_seconds)
                if previous is not None and now > previous[0] and cpu_seconds >= previous[1]:
                    cpu_percent = 100.0 * (cpu_seconds - previous[1]) / (now - previous[0])
            memory = read_memory_bytes(pod)
            with self._lock:
                self._samples.setdefault(pod.uid, deque()).append((now, cpu_percent, memory))
        self._forget(now - self.window_seconds)

    def _forget(self, horizon: float) -> None:
        with self._lock:
            for uid in list(self._samples):
                samples = self._samples[uid]
                while samples and samples[0][0] < horizon:
                    samples.popleft()
                if not samples:
                    del self._samples[uid]
                    self._last_cpu.pop(uid, None)
            wall_horizon = self._wall_clock() - self.window_seconds
            for uid in list(self._io):
                rates = self._io[uid]
                while rates and rates[0][0] < wall_horizon:
                    rates.popleft()
                if not rates:
                    del self._io[uid]
                    self._last_io.pop(uid, None)

    def peaks(self) -> dict[str, PodPeak]:
        """Each pod's CPU and memory peaks over the window, by pod UID."""
        with self._lock:
            result = {}
            for uid, samples in self._samples.items():
                cpu = [value for _, value, _ in samples if value is not None]
                memory = [value for _, _, value in samples if value is not None]
                result[uid] = PodPeak(
                    cpu_util_max=max(cpu) if cpu else None,
                    mem_used_max_bytes=max(memory) if memory else None,
                )
            return result

    def io(self) -> dict[str, PodIoSeries]:
        """Each pod's disk and network rates over the window, by pod UID: the directions with
        at least one reading; the network said not attributable where the pod has no network
        namespace of its own."""
        with self._lock:
            result = {}
            for uid, samples in self._io.items():
                times = np.array([moment for moment, _ in samples], dtype=np.float64)
                columns = np.array(
                    [[np.nan if rate is None else rate for rate in rates] for _, rates in samples],
                    dtype=np.float64,
                ).reshape(len(samples), len(IO_FIELDS))
                network = self._networks.get(uid, PodNetwork(None, attributable=False))
                result[uid] = PodIoSeries(
                    times,
                    {
                        direction: columns[:, position]
                        for position, direction in enumerate(IO_FIELDS)
                        if np.isfinite(columns[:, position]).any()
                    },
                    network_attributable=network.attributable,
                )
            return result


class HostSampler:
    """Samples host utilisation and pod cgroups every ``sample_interval`` in a thread."""

    def __init__(
        self,
        sample_interval: float,
        window_seconds: float,
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        disk_path: str = "/",
    ) -> None:
        self.sample_interval = sample_interval
        self.disk_path = disk_path
        self.pods = PodCgroupSampler(window_seconds, cgroup_root)
        self._latest: dict[str, float] = {}
        self._cpu_max: deque[tuple[float, float]] = deque()
        self.window_seconds = window_seconds
        self._previous: tuple[float, Any, Any] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        # Prime the CPU and I/O counters: a reading right after priming covers microseconds
        # and can say 0 % or 100 %, so the first one is taken one interval later.
        psutil.cpu_percent(interval=None)
        self._previous = (time.monotonic(), psutil.disk_io_counters(), psutil.net_io_counters())
        self._thread = threading.Thread(target=self._run, name="host-sampler", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def _run(self) -> None:
        while not self._stop.wait(self.sample_interval):
            try:
                self.sample()
            except Exception:  # keep sampling whatever one read does
                log.warning("host sampling failed", exc_info=True)

    def sample(self) -> None:
        now = time.monotonic()
        cpu = psutil.cpu_percent(interval=None)
        readings = {
            "cpu_percent": cpu,
            "memory_percent": psutil.virtual_memory().percent,
        }
        with contextlib.suppress(OSError):
            readings["disk_used_percent"] = psutil.disk_usage(self.disk_path).percent
        disk = psutil.disk_io_counters()
        net = psutil.net_io_counters()
        if self._previous is not None:
            then, old_disk, old_net = self._previous
            elapsed = now - then
            if elapsed > 0:
                if disk is not None and old_disk is not None:
                    readings["disk_read_bytes_per_second"] = (
                        max(0, disk.read_bytes - old_disk.read_bytes) / elapsed
                    )
                    readings["disk_write_bytes_per_second"] = (
                        max(0, disk.write_bytes - old_disk.write_bytes) / elapsed
                    )
                readings["network_receive_bytes_per_second"] = (
                    max(0, net.bytes_recv - old_net.bytes_recv) / elapsed
                )
                readings["network_transmit_bytes_per_second"] = (
                    max(0, net.bytes_sent - old_net.bytes_sent) / elapsed
                )
        self._previous = (now, disk, net)
        with self._lock:
            self._cpu_max.append((now, cpu))
            while self._cpu_max and self._cpu_max[0][0] < now - self.window_seconds:
                self._cpu_max.popleft()
            readings["cpu_percent_max"] = max(value for _, value in self._cpu_max)
            self._latest = readings
        self.pods.sample()

    def snapshot(self) -> dict[str, float]:
        """The latest host readings (percentages and bytes per second)."""
        with self._lock:
            return dict(self._latest)

    def pod_peaks(self) -> dict[str, PodPeak]:
        return self.pods.peaks()

    def pod_io(self) -> dict[str, PodIoSeries]:
        return self.pods.io()
