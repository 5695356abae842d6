"""A pod's disk and network byte counters on this host: disk from its cgroup v2 ``io.stat``,
network from ``/proc/<pid>/net/dev`` of one of its processes, only where that process has a
network namespace of its own (a pod on the host's network shares the host's counters: they
are not the pod's, and nothing is reported rather than the host's traffic).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# Interfaces that carry no pod traffic worth counting.
_LOOPBACK = "lo"


@dataclass(frozen=True)
class NetworkCounters:
    """Bytes received and transmitted on a network namespace's interfaces, loopback left out."""

    received: int
    transmitted: int


def parse_io_stat(text: str, stacked: frozenset[str] = frozenset()) -> tuple[int, int] | None:
    """(read bytes, written bytes) summed over the devices of a cgroup v2 ``io.stat``, leaving
    out ``stacked`` devices ("MAJ:MIN" under another one, e.g. a disk under LVM: its bytes are
    counted again on the device-mapper device); None when no line has both counters."""
    read = written = 0
    found = False
    for line in text.splitlines():
        device, _, fields = line.partition(" ")
        if not fields or device in stacked:
            continue
        values = dict(field.partition("=")[::2] for field in fields.split())
        try:
            read += int(values["rbytes"])
            written += int(values["wbytes"])
        except (KeyError, ValueError):
            continue
        found = True
    return (read, written) if found else None


def stacked_devices(sys_root: Path = Path("/sys")) -> frozenset[str]:
    """Block devices that another device holds (their I/O is counted on the holder too)."""
    stacked = set()
    try:
        for device in (sys_root / "dev/block").iterdir():
            try:
                if any((device / "holders").iterdir()):
                    stacked.add(device.name)
            except OSError:
                continue
    except OSError:
        return frozenset()
    return frozenset(stacked)


def read_io_bytes(
    cgroup_dir: Path, stacked: frozenset[str] = frozenset()
) -> tuple[int, int] | None:
    """The pod's (read, written) disk bytes so far from its cgroup v2 ``io.stat``."""
    try:
        return parse_io_stat((cgroup_dir / "io.stat").read_text(), stacked)
    except OSError:
        return None


def parse_net_dev(text: str) -> NetworkCounters | None:
    """Bytes received and transmitted over every interface but loopback, from the text of
    ``/proc/<pid>/net/dev``; None when it holds no interface line."""
    received = transmitted = 0
    found = False
    for line in text.splitlines()[2:]:  # two header lines
        name, colon, fields = line.partition(":")
        if not colon:
            continue
        values = fields.split()
        if name.strip() == _LOOPBACK or len(values) < 9:
            continue
        try:
            received += int(values[0])
            transmitted += int(values[8])
        except ValueError:
            continue
        found = True
    return NetworkCounters(received, transmitted) if found else None


def _pids(cgroup_dir: Path) -> Iterator[int]:
    """Processes in the pod's cgroup or its containers' (v2 keeps them in the leaves)."""
    for directory in (cgroup_dir, *sorted(cgroup_dir.glob("*/"))):
        try:
            text = (directory / "cgroup.procs").read_text()
        except OSError:
            continue
        for line in text.split():
            if line.isdigit():
                yield int(line)


def _namespace(proc_root: Path, pid: int | str) -> str | None:
    try:
        return os.readlink(proc_root / str(pid) / "ns/net")
    except OSError:
        return None


@dataclass(frozen=True)
class PodNetwork:
    """Where a pod's network counters can be read: ``pid`` (in the pod's own network
    namespace), or None with ``attributable`` False when they cannot be told from the host's."""

    pid: int | None
    attributable: bool


def find_pod_network(cgroup_dir: Path, proc_root: Path = Path("/proc")) -> PodNetwork:
    """A process of the pod in a network namespace other than the host's (that of PID 1)."""
    host = _namespace(proc_root, 1)
    for pid in _pids(cgroup_dir):
        namespace = _namespace(proc_root, pid)
        if namespace is None:
            continue
        if host is None or namespace == host:  # hostNetwork, or the host's not readable
            return PodNetwork(None, attributable=False)
        return PodNetwork(pid, attributable=True)
    return PodNetwork(None, attributable=False)


def read_network(pid: int, proc_root: Path = Path("/proc")) -> NetworkCounters | None:
    try:
        return parse_net_dev((proc_root / str(pid) / "net/dev").read_text())
    except OSError:
        return None
